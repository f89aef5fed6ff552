#include "tests/net/net_support.hpp"

#include "base/spawn.hpp"

#include "actors/guard.hpp"

#include "actors/messages.hpp"
#include "actors/tls.hpp"
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sstream>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace cellshard::test {

daemon_process::daemon_process(const std::string& dir, const std::vector<std::string>& extra_args,
                               double deadline_s, const std::vector<std::string>& command) {
  std::vector<std::string> args = command.empty() ? std::vector<std::string>{cellshard_bin()} : command;
  args.insert(args.end(), {"node", "--listen", "127.0.0.1:0"});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // stderr to <dir>/node-<n>.err (n counts the daemons this test process started).
  static int started = 0;
  err_path_ = dir + "/node-" + std::to_string(::getpid()) + "-" + std::to_string(started++) + ".err";
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return;
  const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  // The daemon dies with the test process even when that is killed (a ctest
  // timeout) before the guards run, and holds none of its descriptors (base/spawn.hpp).
  pid_ = spawn_child(args, -1, out[1], err);
  ::close(out[1]);
  if (err >= 0) ::close(err);
  out_fd_ = out[0];
  if (pid_ < 0) return;
  // The first line, with a deadline (base/spawn.hpp).
  auto listening = read_listening_line(out_fd_, std::chrono::milliseconds(static_cast<long>(deadline_s * 1000)));
  if (listening) {
    port_ = listening->port;
    return;
  }
  start_error_ = listening.message();
  if (listening.code() == error_code::unavailable) {  // it ended before listening
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) {
      early_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
    }
  }
}

daemon_process::~daemon_process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);  // also ends a stopped process
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::string daemon_process::log() const {
  std::string s = read_file(err_path_);
  if (!start_error_.empty()) s += "\n(" + start_error_ + ")";
  if (early_status_ >= 0) s += "\n(exited with status " + std::to_string(early_status_) + " before listening)";
  if (pid_ > 0) {
    int status = 0;
    // Peek without reaping: a daemon that died in the test is reported.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_)
      s += "\n(the daemon died: " + std::string(info.si_code == CLD_EXITED ? "exit status " : "signal ") +
           std::to_string(info.si_status) + ")";
    (void)status;
  }
  return s;
}

void daemon_process::freeze() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}
void daemon_process::thaw() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}
void daemon_process::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

std::string write_cluster_file(const std::string& path, const std::vector<uint16_t>& ports) {
  std::ofstream out(path);
  out << "{\"nodes\": [";
  for (size_t i = 0; i < ports.size(); ++i)
    out << (i ? ", " : "") << "{\"host\": \"127.0.0.1\", \"port\": " << ports[i] << "}";
  out << "]}\n";
  return path;
}

std::string write_cluster_entries(const std::string& path, const std::vector<cluster_entry>& nodes) {
  std::ofstream out(path);
  out << "{\"nodes\": [";
  for (size_t i = 0; i < nodes.size(); ++i) {
    out << (i ? ", " : "") << "{\"host\": \"127.0.0.1\", \"port\": " << nodes[i].port;
    if (nodes[i].spare) out << ", \"spare\": true";
    if (!nodes[i].memory.empty()) out << ", \"memory\": \"" << nodes[i].memory << "\"";
    out << "}";
  }
  out << "]}\n";
  return path;
}

front_end_process::front_end_process(const std::vector<std::string>& args) {
  std::vector<std::string> full = {cellshard_bin()};
  full.insert(full.end(), args.begin(), args.end());
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return;
  }
  pid_ = spawn_child(full, -1, out[1], err[1]);  // as daemon_process
  ::close(out[1]);
  ::close(err[1]);
  fds_[0] = out[0];
  fds_[1] = err[0];
  if (pid_ < 0) {
    for (int& f : fds_) {
      ::close(f);
      f = -1;
    }
    return;
  }
  for (int f : fds_) ::fcntl(f, F_SETFL, ::fcntl(f, F_GETFL) | O_NONBLOCK);
}

front_end_process::~front_end_process() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);  // also ends a stopped process
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  for (int f : fds_)
    if (f >= 0) ::close(f);
}

void front_end_process::pump(int timeout_ms) {
  pollfd p[2];
  int n = 0;
  int which[2];
  for (int i = 0; i < 2; ++i)
    if (fds_[i] >= 0) {
      p[n] = {fds_[i], POLLIN, 0};
      which[n++] = i;
    }
  if (n == 0) return;
  const int k = ::poll(p, static_cast<nfds_t>(n), timeout_ms);
  if (k <= 0) return;  // timeout, or EINTR: the caller's loop checks its deadline
  char buf[65536];
  for (int j = 0; j < n; ++j) {
    if (!(p[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const int i = which[j];
    for (;;) {
      const ssize_t r = ::read(fds_[i], buf, sizeof buf);
      if (r > 0) {
        (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(r));
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      ::close(fds_[i]);  // end of file (or an error): the writer is gone
      fds_[i] = -1;
      break;
    }
  }
}

bool front_end_process::wait_for_output(
    const std::function<bool(const std::string& out, const std::string& err)>& pred, double deadline_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<long>(deadline_s * 1000));
  for (;;) {
    if (pred(out_, err_)) return true;
    if (fds_[0] < 0 && fds_[1] < 0) return false;  // nothing more will come
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pump(static_cast<int>(std::min<long long>(left, 100)));
  }
}

bool front_end_process::wait_for_stdout_bytes(size_t bytes, double deadline_s) {
  return wait_for_output([bytes](const std::string& o, const std::string&) { return o.size() >= bytes; },
                         deadline_s);
}

void front_end_process::kill(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

bool front_end_process::reap(bool block) {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r != pid_) return false;
  status_ = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  pid_ = -1;
  return true;
}

bool front_end_process::running() {
  return !reap(false);
}

int front_end_process::wait(double deadline_s) {
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<long>(deadline_s * 1000));
  auto left_ms = [&] {
    return static_cast<int>(std::max<long long>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count()));
  };
  for (;;) {
    if (reap(false)) {
      // It ended: its write ends are closed, so the pipes reach end of file.
      while ((fds_[0] >= 0 || fds_[1] >= 0) && left_ms() > 0) pump(std::min(left_ms(), 100));
      return status_;
    }
    const int left = left_ms();
    if (left <= 0) return -1;
    if (fds_[0] >= 0 || fds_[1] >= 0) {
      pump(std::min(left, 20));
    } else {
      ::poll(nullptr, 0, std::min(left, 10));  // pipes closed, process not yet reapable
    }
  }
}

int journal_tokens(const std::string& path) {
  std::istringstream in(read_file(path));
  std::string line;
  int n = 0;
  while (std::getline(in, line))
    if (line.find("\"token\"") != std::string::npos && line.find('}') != std::string::npos) ++n;
  return n;
}

std::vector<size_t> fixture_text_offsets(const std::string& ids_file, const std::string& tokenizer_file) {
  std::vector<size_t> offsets = {0};
  auto tok = model::tokenizer::open(tokenizer_file);
  if (!tok) return offsets;
  const std::vector<int> ids = read_ids(ids_file);
  size_t len = 0;
  for (size_t k = 1; k < ids.size(); ++k) {
    if (ids[k] == model::bos_id) break;  // run.c stops at BOS and prints nothing for it
    len += (*tok)->decode(ids[k - 1], ids[k]).size();
    offsets.push_back(len);
  }
  return offsets;
}

activation_counts activation_counts_of(const std::string& log) {
  activation_counts c;
  const std::string key = "activations received from other processes: ";
  const size_t at = log.rfind(key);
  if (at == std::string::npos) return c;
  const std::string line = log.substr(at + key.size(), log.find('\n', at) - at - key.size());
  unsigned long long fr = 0, cf = 0, hd = 0, dr = 0;
  if (std::sscanf(line.c_str(), "%llu as data-plane frames, %llu through CAF; %llu frames held for their CAF "
                  "activation, %llu dropped", &fr, &cf, &hd, &dr) != 4)
    return c;
  c.found = true;
  c.frames = fr;
  c.via_caf = cf;
  c.held = hd;
  c.held_dropped = dr;
  const size_t s = line.find("frames sent ");
  if (s != std::string::npos) {
    unsigned long long fs = 0, as = 0, frr = 0, ar = 0;
    if (std::sscanf(line.c_str() + s, "frames sent %llu (%llu activations), received %llu (%llu activations)", &fs,
                    &as, &frr, &ar) == 4) {
      c.sent = as;
      c.received = ar;
    }
  }
  return c;
}

daemon_report query_daemon(uint16_t port, double deadline_s) {
  daemon_report out;
  const auto deadline = std::chrono::milliseconds(static_cast<long>(deadline_s * 1000));
  caf::actor_system_config cfg;
  actors::register_messages(cfg);
  actors::net_options no;  // 1 s heartbeat, 3 s connection timeout: a connect cannot hang
  auto net = actors::configure_network(cfg, no);
  if (!net) {
    out.error = net.message();
    return out;
  }
  caf::actor_system sys(cfg);
  caf::scoped_actor self(sys);
  caf::actor daemon;
  // Through the guard dialer, as every cellshard client connects (actors/guard.hpp).
  auto local = actors::guarded_port("127.0.0.1", port);
  if (!local) {
    out.error = local.message();
    return out;
  }
  self->request(sys.middleman().actor_handle(), deadline, caf::connect_atom::value, std::string("127.0.0.1"), *local)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            daemon = caf::actor_cast<caf::actor>(ptr);
          },
          [&](caf::error& e) { out.error = "connect: " + sys.render(e); });
  if (!daemon) {
    if (out.error.empty()) out.error = "connect: no actor published there";
    return out;
  }
  self->request(daemon, deadline, actors::stats_atom::value)
      .receive(
          [&](actors::node_report& r) {
            out.ok = true;
            out.shards = r.shards;
            out.clients = r.clients;
            out.used_bytes = r.used_bytes;
          },
          [&](caf::error& e) { out.error = "stats: " + sys.render(e); });
  return out;
}

uint16_t closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);  // never listened: connecting is refused
  return port;
}

void copy_file(const std::string& from, const std::string& to) {
  std::ofstream out(to, std::ios::binary);
  out << read_file(from);
}

void copy_with_flip(const std::string& from, const std::string& to, long offset_from_end) {
  std::string bytes = read_file(from);
  if (offset_from_end > 0 && static_cast<size_t>(offset_from_end) <= bytes.size())
    bytes[bytes.size() - static_cast<size_t>(offset_from_end)] ^= 0x5a;
  std::ofstream out(to, std::ios::binary);
  out << bytes;
}

std::string make_pki(const std::string& dir) {
  const std::string ossl = "/usr/bin/openssl";
  {
    std::ofstream ext(dir + "/leaf.ext");
    ext << "basicConstraints=CA:FALSE\n"
           "keyUsage=digitalSignature,keyEncipherment\n"
           "extendedKeyUsage=serverAuth,clientAuth\n"
           "subjectAltName=IP:127.0.0.1\n";
  }
  auto run = [&](const std::vector<std::string>& args) -> std::string {
    auto r = run_command(args, 60);
    if (r.status != 0) return "openssl failed (" + args[1] + "): " + r.err;
    return "";
  };
  auto ca = [&](const std::string& name, const std::string& cn) {
    return run({ossl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".pem", "-days", "2",
                "-subj", "/CN=" + cn});
  };
  auto leaf = [&](const std::string& name, const std::string& ca_name) {
    std::string e = run({ossl, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                         "-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".csr", "-subj",
                         "/CN=cellshard " + name});
    if (!e.empty()) return e;
    return run({ossl, "x509", "-req", "-in", dir + "/" + name + ".csr", "-CA", dir + "/" + ca_name + ".pem",
                "-CAkey", dir + "/" + ca_name + ".key", "-CAcreateserial", "-out", dir + "/" + name + ".pem",
                "-days", "2", "-extfile", dir + "/leaf.ext"});
  };
  for (auto step : {ca("ca", "cellshard test CA"), leaf("node", "ca"), leaf("front", "ca"),
                    ca("ca2", "another CA"), leaf("foreign", "ca2")})
    if (!step.empty()) return step;
  return "";
}

std::map<uint16_t, tcp_bytes> tcp_traffic_by_peer_port() {
  std::map<uint16_t, tcp_bytes> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const int fd = parse_uint<int>(e->d_name).value_or(-1);  // base/parse.hpp
    struct stat sb;
    if (::fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    uint16_t port = 0;
    if (peer.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
    else if (peer.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
    else continue;
    tcp_info ti{};
    socklen_t tl = sizeof ti;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0) continue;
    out[port].sent += ti.tcpi_bytes_acked;
    out[port].received += ti.tcpi_bytes_received;
  }
  ::closedir(d);
  return out;
}

}  // namespace cellshard::test
