// tests/net/net_support.hpp: node daemon processes for tests, each stopped by
// an RAII guard (SIGKILL + waitpid) whatever the test's outcome; cluster
// files; a throwaway PKI made with the openssl command line; and the TCP
// byte counters of this process's sockets (to show what passes through a
// front end running in the test process).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cellshard::test {

/// One `cellshard node --listen 127.0.0.1:0 ...` process. The constructor
/// waits (at most `deadline_s`) for its `listening HOST:PORT` line; stderr
/// goes to `<dir>/node-<test pid>-<n>.err`. Started by base/spawn.hpp. The
/// destructor SIGKILLs and reaps it; the daemon also gets SIGKILL when the test process dies first (PR_SET_PDEATHSIG:
/// when the thread that started it ends, so start it from the test's thread).
class daemon_process {
public:
  /// `command` replaces the binary (default: {cellshard_bin()}), e.g.
  /// {"qemu-s390x-static", "-L", SYSROOT, ".../cellshard"} for a cross-built
  /// daemon under QEMU (tests/net/test_cross.cpp).
  daemon_process(const std::string& dir, const std::vector<std::string>& extra_args,
                 double deadline_s = 20, const std::vector<std::string>& command = {});
  ~daemon_process();
  daemon_process(const daemon_process&) = delete;
  daemon_process& operator=(const daemon_process&) = delete;

  bool ok() const { return port_ != 0; }
  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// What the daemon wrote on stderr so far (and, when it failed to start, why).
  std::string log() const;
  /// Exit status when it ended before listening (-1 otherwise).
  int early_status() const { return early_status_; }
  void freeze();  // SIGSTOP
  void thaw();    // SIGCONT
  void signal(int sig);  // e.g. SIGKILL; the destructor still reaps it

private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  int out_fd_ = -1;
  int early_status_ = -1;
  std::string start_error_;  // why no listening line was read (base/spawn.hpp), "" when it was
  std::string err_path_;
};

/// Writes {"nodes": [{"host": "127.0.0.1", "port": P}, ...]} and returns the path.
std::string write_cluster_file(const std::string& path, const std::vector<uint16_t>& ports);

/// One node of a cluster file: the daemon's port, whether it is a spare, and
/// the budget the front end's placement assumes for it ("" = not written;
/// the daemon's own budget comes from its --memory flag).
struct cluster_entry {
  uint16_t port = 0;
  bool spare = false;
  std::string memory;  // e.g. "64KiB"
};
/// Writes {"nodes": [{"host": "127.0.0.1", "port": P[, "spare": true][, "memory": M]}, ...]}.
std::string write_cluster_entries(const std::string& path, const std::vector<cluster_entry>& nodes);

/// A process of the cellshard binary (typically `cellshard run ...` as a front
/// end) with stdout and stderr on non-blocking pipes, read by this object as
/// it waits. Every wait has a deadline; nothing sleeps blindly. The destructor
/// SIGKILLs (a stopped process too) and reaps it; PR_SET_PDEATHSIG as
/// daemon_process.
/// Thread safety: one thread at a time.
class front_end_process {
public:
  /// `args` follow the binary: {"run", "-m", ...}.
  explicit front_end_process(const std::vector<std::string>& args);
  ~front_end_process();
  front_end_process(const front_end_process&) = delete;
  front_end_process& operator=(const front_end_process&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  /// Reads both pipes until `pred(stdout so far, stderr so far)` holds (true),
  /// or the deadline passes or the process closed its pipes without it (false).
  bool wait_for_output(const std::function<bool(const std::string& out, const std::string& err)>& pred,
                       double deadline_s);
  /// wait_for_output until stdout holds at least `bytes` bytes.
  bool wait_for_stdout_bytes(size_t bytes, double deadline_s);
  /// Sends `sig` (no-op once reaped).
  void kill(int sig);
  /// Reads the pipes until the process ends (at most `deadline_s`) and reaps
  /// it. Returns its exit status (0..255), 128 + N when signal N ended it, or
  /// -1 when it is still running at the deadline.
  int wait(double deadline_s);
  /// True while it has not been reaped and has not ended.
  bool running();
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

private:
  /// One poll of the open pipes (at most `timeout_ms`), appending what arrived.
  void pump(int timeout_ms);
  bool reap(bool block);
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};  // stdout, stderr read ends
  int status_ = -1;
  std::string out_, err_;
};

/// Lines of a --journal FILE that record a token (the header line excluded):
/// how many tokens the run journaled so far.
int journal_tokens(const std::string& path);

/// For a llama2.c fixture (ids file) and tokenizer file: the length of the
/// text run.c prints after each generated token, offsets[k] = bytes of stdout
/// once ids[1..k] were printed (offsets[0] = 0). The pieces come from
/// model::tokenizer::decode, so `offsets.back()` + 1 ("\n") is the fixture
/// text's length.
std::vector<size_t> fixture_text_offsets(const std::string& ids_file, const std::string& tokenizer_file);

/// What a daemon reports about itself (its `stats_atom` reply, node_report).
struct daemon_report {
  bool ok = false;
  std::string error;  // why not, when !ok
  int shards = 0;     // shards it hosts now
  int clients = 0;    // front ends joined
  uint64_t used_bytes = 0;
};
/// Asks the daemon at 127.0.0.1:`port` over CAF's middleman, from a
/// short-lived actor system in this process (connection and request each
/// bounded by `deadline_s`).
daemon_report query_daemon(uint16_t port, double deadline_s = 5);

/// A daemon's activation counters, from the last line it logged when a front
/// end left ("activations received from other processes: ..."; all zero and
/// found == false when there is none yet).
struct activation_counts {
  bool found = false;
  uint64_t frames = 0, via_caf = 0, held = 0, held_dropped = 0;
  uint64_t sent = 0, received = 0;  // data-plane activation frames (0 without a data plane)
};
activation_counts activation_counts_of(const std::string& daemon_log);

/// A TCP port on 127.0.0.1 where nothing listens (bound, then closed).
uint16_t closed_port();

/// Copies `from` to `to`, flipping the byte at `offset` from the end (1 = last).
void copy_with_flip(const std::string& from, const std::string& to, long offset_from_end);
void copy_file(const std::string& from, const std::string& to);

/// A throwaway PKI in `dir`, made with /usr/bin/openssl (EC P-256 keys):
/// ca.pem/ca.key; node.pem/node.key and front.pem/front.key signed by it
/// (SAN IP:127.0.0.1); ca2.pem and foreign.pem/foreign.key, a second CA and a
/// certificate it signed. Returns "" on success, else openssl's complaint.
std::string make_pki(const std::string& dir);

/// Payload bytes of this process's TCP sockets, summed per peer port.
struct tcp_bytes {
  uint64_t sent = 0;      // tcpi_bytes_acked
  uint64_t received = 0;  // tcpi_bytes_received
};
std::map<uint16_t, tcp_bytes> tcp_traffic_by_peer_port();

}  // namespace cellshard::test
