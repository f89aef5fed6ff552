#include "actors/local_daemons.hpp"

#include "base/spawn.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace cellshard::actors {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string tail_of(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > max_bytes) s = "..." + s.substr(s.size() - max_bytes);
  return s;
}

/// waitpid with a deadline (WNOHANG polled every millisecond). True when reaped.
bool reap_within(pid_t pid, std::chrono::milliseconds deadline, int* status_out = nullptr) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (status_out) *status_out = status;
      return true;
    }
    if (r < 0 && errno != EINTR) return errno == ECHILD;  // not ours (any more)
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

result<std::string> daemon_models_dir(const std::string& model_path, const std::string& tokenizer_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (model_path.empty() || !fs::is_regular_file(model_path, ec))
    return make_error("node daemons load the model by file name, but the model '" + model_path +
                      "' is not a file (give -m with a model file)");
  const fs::path dir = fs::absolute(fs::path(model_path), ec).parent_path();
  const fs::path tok = dir / fs::path(tokenizer_path).filename();
  if (!fs::is_regular_file(tok, ec))
    return make_error("node daemons find the tokenizer beside the model, but " + tok.string() +
                      " does not exist (tokenizer given: " + tokenizer_path + ")");
  return dir.string();
}

result<std::unique_ptr<local_daemons>> local_daemons::start(int working, int spares, local_daemon_options opts) {
  if (working < 1) return make_error("local daemons: at least one working daemon is needed (got " +
                                     std::to_string(working) + ")");
  if (spares < 0) return make_error("local daemons: spares must be >= 0 (got " + std::to_string(spares) + ")");
  if (opts.models_dir.empty()) return make_error("local daemons: no models folder (--models) given");
  std::unique_ptr<local_daemons> d(new local_daemons());
  if (opts.binary.empty()) {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return make_error(std::string("local daemons: /proc/self/exe: ") + std::strerror(errno));
    opts.binary.assign(buf, static_cast<size_t>(n));
  }
  if (opts.log_dir.empty()) {
    char tmpl[] = "/tmp/cellshard-daemons-XXXXXX";
    if (!::mkdtemp(tmpl)) return make_error(std::string("local daemons: mkdtemp: ") + std::strerror(errno));
    d->log_dir_ = tmpl;
    d->own_log_dir_ = true;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(opts.log_dir, ec);
    if (ec) return make_error("local daemons: " + opts.log_dir + ": " + ec.message());
    d->log_dir_ = opts.log_dir;
  }
  d->opts_ = std::move(opts);
  d->spares_ = spares;
  d->procs_.resize(static_cast<size_t>(working + spares));
  for (int i = 0; i < working + spares; ++i) {
    auto r = d->launch(i);
    if (!r) return r.err();  // d's destructor stops the ones already started
  }
  return d;
}

result<void> local_daemons::launch(int i) {
  proc& p = procs_[static_cast<size_t>(i)];
  std::vector<std::string> args = {opts_.binary, "node", "--listen", "127.0.0.1:0", "--models", opts_.models_dir};
  if (!opts_.profile.empty()) args.insert(args.end(), {"--profile", opts_.profile});
  if (!opts_.memory.empty()) args.insert(args.end(), {"--memory", opts_.memory});
  args.insert(args.end(), opts_.extra_args.begin(), opts_.extra_args.end());
  p.err_path = log_dir_ + "/node-" + std::to_string(i) + ".err";
  const std::string who = "local daemon " + std::to_string(i);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return make_error(who + ": pipe: " + std::strerror(errno));
  const int err = ::open(p.err_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  const int null_in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (err < 0 || null_in < 0) {
    const std::string why = std::strerror(errno);
    for (int fd : {out[0], out[1], err, null_in})
      if (fd >= 0) ::close(fd);
    return make_error(who + ": " + p.err_path + ": " + why);
  }
  // Parent-death kill, signal mask cleared, every other descriptor closed (base/spawn.hpp).
  const pid_t pid = spawn_child(args, null_in, out[1], err);
  const int fork_errno = errno;
  ::close(out[1]);
  ::close(err);
  ::close(null_in);
  if (pid < 0) {
    ::close(out[0]);
    return make_error(who + ": fork: " + std::strerror(fork_errno));
  }
  if (opts_.cpu_percent > 0) {
    // Into its cgroup at once (before it starts its threads: all of them are capped).
    auto c = p.cap.dir().empty()
                 ? p.cap.create("cellshard-" + std::to_string(::getpid()) + "-d" + std::to_string(i), opts_.cpu_percent)
                 : result<void>{};
    if (c) c = p.cap.add(pid);
    if (!c) {
      ::kill(pid, SIGKILL);
      reap_within(pid, std::chrono::milliseconds(5000), nullptr);
      ::close(out[0]);
      return make_error(who + ": " + c.message());
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    p.pid = pid;
    p.port = 0;
    p.out_fd = out[0];
    p.dead = false;
    p.killed = false;
    p.stopped = false;
    p.ended.clear();
  }
  // The first line, under the deadline (base/spawn.hpp).
  auto listening = read_listening_line(p.out_fd, opts_.start_deadline);
  if (!listening && listening.code() == error_code::unavailable) {  // stdout closed: it ended before listening
    int status = 0;
    std::string how = "ended";
    if (reap_within(pid, std::chrono::milliseconds(5000), &status)) how = "ended with " + describe_status(status);
    {
      std::lock_guard<std::mutex> lk(mu_);
      p.pid = -1;
      p.dead = true;
    }
    ::close(p.out_fd);
    p.out_fd = -1;
    return make_error(who + " (" + opts_.binary + " node) " + how + " before listening; its stderr:\n" + log(i));
  }
  if (!listening) {
    stop_one(p);
    return make_error(who + " (pid " + std::to_string(pid) + "): " + listening.message() + "; its stderr:\n" +
                      log(i));
  }
  std::lock_guard<std::mutex> lk(mu_);
  p.port = listening->port;
  return {};
}

void local_daemons::stop_one(proc& p) {
  pid_t pid;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pid = p.pid;
    p.pid = -1;
    p.dead = true;
    p.killed = true;
    p.stopped = false;
  }
  if (pid > 0) {
    ::kill(pid, SIGKILL);  // also ends a stopped process
    if (!reap_within(pid, std::chrono::milliseconds(5000)))
      std::fprintf(stderr, "warning: daemon pid %d did not end within 5 s of SIGKILL\n", static_cast<int>(pid));
  }
  if (p.out_fd >= 0) {
    ::close(p.out_fd);
    p.out_fd = -1;
  }
}

local_daemons::~local_daemons() {
  for (auto& p : procs_) stop_one(p);
  if (own_log_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(log_dir_, ec);
  }
}

std::vector<actors::remote_node> local_daemons::entries() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<actors::remote_node> e;
  for (size_t i = 0; i < procs_.size(); ++i) {
    actors::remote_node n;
    n.host = "127.0.0.1";
    n.port = procs_[i].port;
    n.spare = static_cast<int>(i) >= static_cast<int>(procs_.size()) - spares_;
    e.push_back(n);
  }
  return e;
}

result<void> local_daemons::write_cluster_file(const std::string& path) const {
  std::ostringstream s;
  s << "{\"nodes\": [";
  const auto e = entries();
  for (size_t i = 0; i < e.size(); ++i)
    s << (i ? ", " : "") << "{\"host\": \"" << e[i].host << "\", \"port\": " << e[i].port
      << ", \"spare\": " << (e[i].spare ? "true" : "false") << "}";
  s << "]}\n";
  std::ofstream out(path);
  out << s.str();
  out.close();
  if (!out) return make_error(path + ": cannot write the cluster file: " + std::strerror(errno));
  return {};
}

pid_t local_daemons::pid(int i) const {
  std::lock_guard<std::mutex> lk(mu_);
  return i >= 0 && i < size() ? procs_[static_cast<size_t>(i)].pid : -1;
}

uint16_t local_daemons::port(int i) const {
  std::lock_guard<std::mutex> lk(mu_);
  return i >= 0 && i < size() ? procs_[static_cast<size_t>(i)].port : 0;
}

std::string local_daemons::describe(int i) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (i < 0 || i >= size()) return "daemon " + std::to_string(i) + " (no such daemon)";
  const auto& p = procs_[static_cast<size_t>(i)];
  return "daemon " + std::to_string(i) + " (pid " + std::to_string(p.pid) + ", 127.0.0.1:" +
         std::to_string(p.port) + ")";
}

result<int64_t> local_daemons::signal(int i, int sig) {
  std::lock_guard<std::mutex> lk(mu_);
  if (i < 0 || i >= size())
    return make_error("daemon " + std::to_string(i) + ": no such daemon (" + std::to_string(size()) + " started)");
  proc& p = procs_[static_cast<size_t>(i)];
  if (p.dead || p.pid <= 0)
    return make_error("daemon " + std::to_string(i) + ": not running (killed or ended), cannot send signal " +
                      std::to_string(sig));
  const int64_t t = now_ns();
  if (::kill(p.pid, sig) != 0)
    return make_error("daemon " + std::to_string(i) + " (pid " + std::to_string(p.pid) + "): kill(" +
                      std::to_string(sig) + "): " + std::strerror(errno));
  if (sig == SIGKILL) {
    p.dead = true;
    p.killed = true;
    p.stopped = false;
  } else if (sig == SIGSTOP) {
    p.stopped = true;
  } else if (sig == SIGCONT) {
    p.stopped = false;
  }
  return t;
}

void local_daemons::thaw_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& p : procs_)
    if (p.stopped && !p.dead && p.pid > 0) {
      ::kill(p.pid, SIGCONT);
      p.stopped = false;
    }
}

bool local_daemons::frozen(int i) const {
  std::lock_guard<std::mutex> lk(mu_);
  return i >= 0 && i < size() && procs_[static_cast<size_t>(i)].stopped;
}

bool local_daemons::alive(int i) const {
  std::lock_guard<std::mutex> lk(mu_);
  return i >= 0 && i < size() && !procs_[static_cast<size_t>(i)].dead && procs_[static_cast<size_t>(i)].pid > 0;
}

bool local_daemons::reap() {
  bool all = true;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& p : procs_) {
    if (p.pid <= 0) {
      all = false;
      continue;
    }
    int status = 0;
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) {
      if (!p.killed)
        p.ended = "daemon " + std::to_string(&p - procs_.data()) + " (pid " + std::to_string(p.pid) +
                  ", 127.0.0.1:" + std::to_string(p.port) + ") ended: " + describe_status(status);
      p.pid = -1;
      p.dead = true;
      p.stopped = false;
    }
    if (p.dead) all = false;
  }
  return all;
}

std::string local_daemons::unexpected_ends() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s;
  for (const auto& p : procs_)
    if (!p.ended.empty()) s += (s.empty() ? "" : "; ") + p.ended;
  return s;
}

result<void> local_daemons::restart(int i) {
  if (i < 0 || i >= size()) return make_error("daemon " + std::to_string(i) + ": no such daemon");
  stop_one(procs_[static_cast<size_t>(i)]);
  return launch(i);
}

std::string local_daemons::log(int i, size_t max_bytes) const {
  if (i < 0 || i >= size()) return "";
  return tail_of(procs_[static_cast<size_t>(i)].err_path, max_bytes);
}

thaw_timer::thaw_timer(local_daemons& d) : d_(d), th_([this] { loop(); }) {}

thaw_timer::~thaw_timer() { stop(); }

void thaw_timer::add(int daemon, int64_t at_ns) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_.push_back({at_ns, daemon});
  cv_.notify_all();
}

void thaw_timer::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    cv_.notify_all();
  }
  if (th_.joinable()) th_.join();
}

void thaw_timer::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!done_) {
    if (pending_.empty()) {
      cv_.wait(lk);  // woken by add() or stop()
      continue;
    }
    auto first = std::min_element(pending_.begin(), pending_.end());
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    if (now >= first->first) {
      d_.thaw(first->second);  // an error (the daemon was killed meanwhile) leaves nothing to thaw
      pending_.erase(first);
      continue;
    }
    cv_.wait_for(lk, std::chrono::nanoseconds(first->first - now));
  }
}

}  // namespace cellshard::actors
