// actors/local_daemons.hpp: a set of `cellshard node` child processes on
// loopback: the one daemon launcher of the tools that need real processes to
// kill and freeze (`bench recovery --processes`, `chaos --processes`) and of
// the public API (<cellshard/daemons.hpp>).
//
// Each daemon is this binary (/proc/self/exe, or local_daemon_options::binary)
// started as
//   cellshard node --listen 127.0.0.1:0 --models DIR [--profile P] [--memory M] [extra...]
// Its first stdout line `listening HOST:PORT` is read under a deadline; its
// stderr goes to LOGDIR/node-<i>.err (LOGDIR: local_daemon_options::log_dir,
// else a fresh /tmp/cellshard-daemons-XXXXXX removed by the destructor).
// Daemon i is node i of the cluster: entries() lists them in order, the last
// `spares` marked spare, ready for actors::remote_host.
//
// Lifetime: the destructor SIGKILLs and reaps every daemon, frozen or not
// (SIGKILL ends a stopped process). The children also get PR_SET_PDEATHSIG =
// SIGKILL, so they die with the thread that started them if this process is
// killed before the destructor runs; start() and restart() must therefore be
// called from a thread that outlives the daemons (the main thread).
// Each daemon is started by base/spawn.hpp's spawn_child: after fork() the
// child only makes async-signal-safe calls (prctl, dup2, close, execv), so
// starting daemons while CAF threads run is safe; it closes every inherited
// descriptor above 2 (close_range), so a daemon does not keep the front end's
// sockets open.
//
// Thread safety: signal() (kill/freeze/thaw) and pid() may be called from
// any thread, e.g. from a token callback (they only call ::kill, no wait);
// start(), restart(), reap and the destructor from the owning thread only.
// Errors: cellshard::result naming the daemon (index, pid) and the cause,
// with the tail of its stderr when it did not start.
#pragma once

#include "actors/remote.hpp"
#include "base/cgroup.hpp"
#include "model/result.hpp"

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>
#include <utility>
#include <vector>

namespace cellshard::actors {

struct local_daemon_options {
  std::string binary;                  // "" = /proc/self/exe
  std::string models_dir;              // --models (required)
  std::string profile;                 // --profile ("" = the daemon's default, host)
  std::string memory;                  // --memory, e.g. "256MiB" ("" = the profile's)
  std::vector<std::string> extra_args; // appended to the node command line
  std::string log_dir;                 // "" = a temporary folder, removed at the end
  std::chrono::milliseconds start_deadline{20000};  // per daemon, until `listening`
  /// > 0: each daemon runs in a cgroup of its own capped at this % of one
  /// core (base/cgroup.hpp; needs root), the way a weak node's compute is
  /// capped (issue #25, scripts/lab.sh --cpu). 0: no cap.
  double cpu_percent = 0;
};

/// The folder to pass as `--models`: the model file's folder, which must also
/// hold a file named like the tokenizer (daemons open both by file name).
/// Errors name the missing file (e.g. the built-in synthetic model has none).
result<std::string> daemon_models_dir(const std::string& model_path, const std::string& tokenizer_path);

class local_daemons {
public:
  /// Starts `working + spares` daemons (one after the other, each under
  /// start_deadline). On error, the ones already started are stopped.
  static result<std::unique_ptr<local_daemons>> start(int working, int spares, local_daemon_options opts);
  ~local_daemons();
  local_daemons(const local_daemons&) = delete;
  local_daemons& operator=(const local_daemons&) = delete;

  int size() const { return static_cast<int>(procs_.size()); }
  int spares() const { return spares_; }
  /// The daemons as cluster entries, node i = daemon i, the last spares() with spare = true.
  std::vector<remote_node> entries() const;
  /// Writes {"nodes": [...]} (CLI.md --cluster) to `path`.
  result<void> write_cluster_file(const std::string& path) const;

  pid_t pid(int i) const;
  uint16_t port(int i) const;
  /// "daemon 2 (pid 1234, 127.0.0.1:40411)".
  std::string describe(int i) const;

  /// Sends `sig` to daemon i (no wait). SIGKILL marks it dead: reap() or
  /// restart() collects it. Returns the steady_clock time just before the
  /// signal (ns since the clock's epoch: CLOCK_MONOTONIC, as fault_record's *_ns).
  result<int64_t> signal(int i, int sig);
  result<int64_t> kill(int i) { return signal(i, SIGKILL); }
  result<int64_t> freeze(int i) { return signal(i, SIGSTOP); }
  result<int64_t> thaw(int i) { return signal(i, SIGCONT); }
  /// SIGCONT to every daemon frozen by freeze() and not thawed since.
  void thaw_all();
  bool frozen(int i) const;
  /// False once daemon i was killed (or found dead by reap()).
  bool alive(int i) const;

  /// Collects every daemon that ended (non-blocking); true when all still run.
  bool reap();
  /// After reap(): "daemon 2 (pid 1234, 127.0.0.1:40411) ended: signal 11; ..."
  /// for every daemon that ended without being killed here ("" when none).
  std::string unexpected_ends() const;
  /// Stops daemon i (SIGKILL, waitpid under a 5 s deadline) if it runs and
  /// starts a fresh one in its place (a new port: call entries() again).
  result<void> restart(int i);

  /// What daemon i wrote on stderr (the last `max_bytes`).
  std::string log(int i, size_t max_bytes = 4000) const;
  const std::string& log_dir() const { return log_dir_; }

private:
  struct proc {
    pid_t pid = -1;
    uint16_t port = 0;
    int out_fd = -1;       // read end of its stdout (kept open: a closed pipe would SIGPIPE it)
    bool dead = false;     // killed or ended, not yet reaped
    bool stopped = false;  // SIGSTOPped and not SIGCONTed
    bool killed = false;   // by signal(SIGKILL) or stop_one
    std::string ended;     // how it ended, when reap() found it ended by itself
    std::string err_path;
    cpu_cap cap;           // with local_daemon_options::cpu_percent
  };
  local_daemons() = default;
  result<void> launch(int i);
  void stop_one(proc& p);

  local_daemon_options opts_;
  std::string log_dir_;
  bool own_log_dir_ = false;
  int spares_ = 0;
  std::vector<proc> procs_;
  mutable std::mutex mu_;  // pid/dead/stopped of procs_ (signal() may run on other threads)
};

/// SIGCONTs stopped daemons of a local_daemons at their time (steady-clock
/// ns, CLOCK_MONOTONIC, as local_daemons::signal returns), on its own thread,
/// until stop() or the destructor (which join it; thaws not yet due are
/// dropped: local_daemons::thaw_all() ends the rest). chaos --processes uses
/// it for `stop:...:ms=D` faults. Thread safety: add() from any thread (e.g.
/// a token callback); it only waits on its own condition variable. The
/// daemons must outlive it. A thaw of a daemon killed meanwhile does nothing.
class thaw_timer {
public:
  explicit thaw_timer(local_daemons& d);
  ~thaw_timer();
  thaw_timer(const thaw_timer&) = delete;
  thaw_timer& operator=(const thaw_timer&) = delete;
  /// SIGCONT daemon `daemon` at `at_ns` (at once when that is past).
  void add(int daemon, int64_t at_ns);
  void stop();

private:
  void loop();
  local_daemons& d_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<int64_t, int>> pending_;  // (at_ns, daemon)
  bool done_ = false;
  std::thread th_;
};

}  // namespace cellshard::actors
