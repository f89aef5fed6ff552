#include "tests/net/net_support.hpp"

#include "tests/support.hpp"

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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace cellshard::test {

daemon_process::daemon_process(const std::string& dir, const std::vector<std::string>& extra_args,
                               double deadline_s) {
  std::vector<std::string> args = {cellshard_bin(), "node", "--listen", "127.0.0.1:0"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2];
  if (::pipe(out) != 0) return;
  const std::string err_prefix = dir + "/node-";
  pid_ = ::fork();
  if (pid_ == 0) {
    // Child: only async-signal-safe calls until execv.
    char path[4096];
    std::snprintf(path, sizeof path, "%s%d.err", err_prefix.c_str(), static_cast<int>(::getpid()));
    int err = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out[1], 1);
    if (err >= 0) ::dup2(err, 2);
    ::close(out[0]);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(out[1]);
  out_fd_ = out[0];
  if (pid_ < 0) return;
  err_path_ = err_prefix + std::to_string(pid_) + ".err";
  // Read the first line, with a deadline.
  std::string line;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<long>(deadline_s * 1000));
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now()).count();
    if (left <= 0) return;
    pollfd p{out_fd_, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[256];
    const ssize_t k = ::read(out_fd_, buf, sizeof buf);
    if (k <= 0) {  // it ended before listening
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_) {
        early_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pid_ = -1;
      }
      return;
    }
    line.append(buf, static_cast<size_t>(k));
  }
  line = line.substr(0, line.find('\n'));
  const std::string prefix = "listening ";
  const auto colon = line.rfind(':');
  if (line.compare(0, prefix.size(), prefix) == 0 && colon != std::string::npos)
    port_ = static_cast<uint16_t>(std::stoi(line.substr(colon + 1)));
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

std::string write_cluster_file(const std::string& path, const std::vector<uint16_t>& ports) {
  std::ofstream out(path);
  out << "{\"nodes\": [";
  for (size_t i = 0; i < ports.size(); ++i)
    out << (i ? ", " : "") << "{\"host\": \"127.0.0.1\", \"port\": " << ports[i] << "}";
  out << "]}\n";
  return path;
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
    const int fd = std::atoi(e->d_name);
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
