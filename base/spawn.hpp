// base/spawn.hpp: the project's one way to start a child process: node
// daemons (actors::local_daemons, the tools' and benches' launcher), and the
// daemons, front ends, servers and commands the tests start.
//
// spawn_child(argv, in_fd, out_fd, err_fd) forks; the child then makes only
// async-signal-safe calls until execv(argv[0]) (no PATH search):
//   - prctl(PR_SET_PDEATHSIG, SIGKILL): it is SIGKILLed when the thread that
//     started it ends (so a test or tool killed before its cleanup runs leaves
//     no daemon behind; start children from a thread that outlives them). If
//     the parent is already gone at that point, the child exits with 126;
//   - the signal mask is cleared (CAF threads block some signals);
//   - in_fd, out_fd, err_fd become descriptors 0, 1, 2 (-1: /dev/null);
//   - every other descriptor is closed (close_range, else one by one up to
//     the open-file limit), so a child never holds the parent's sockets or
//     pipe ends open.
// An execv failure shows as exit status 127.
//
// Returns the child's pid, or -1 with errno set when /dev/null could not be
// opened or fork failed. The caller owns the pid (waitpid) and still closes
// its own copies of the descriptors it passed. Thread safety: callable from
// any thread; the parent-death signal then follows that thread. Linux only.
//
// read_listening_line(fd, within): the first stdout line of a server child
// (`cellshard node`, `cellshard serve`), "listening HOST:PORT", read from the
// pipe `fd` under a deadline and parsed; the one reader of that line for the
// library (actors::local_daemons, which the tools and benches use) and the
// tests. Declared below with its errors.
#pragma once

#include <cellshard/result.hpp>

#include "base/parse.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <poll.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#include <vector>

namespace cellshard {

inline pid_t spawn_child(const std::vector<std::string>& args, int in_fd = -1, int out_fd = -1, int err_fd = -1) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int null_fd = -1;
  if (in_fd < 0 || out_fd < 0 || err_fd < 0) {
    null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0) return -1;
  }
  const pid_t parent = ::getpid();
  const long max_fd = ::sysconf(_SC_OPEN_MAX);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(126);  // the parent died before prctl
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(in_fd >= 0 ? in_fd : null_fd, 0);
    ::dup2(out_fd >= 0 ? out_fd : null_fd, 1);
    ::dup2(err_fd >= 0 ? err_fd : null_fd, 2);
    if (::syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
      for (long fd = 3; fd < (max_fd > 0 ? max_fd : 4096); ++fd) ::close(static_cast<int>(fd));
    if (args.empty()) _exit(127);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  if (null_fd >= 0) {
    const int saved = errno;
    ::close(null_fd);
    errno = saved;
  }
  return pid;
}

/// The absolute path of program `name` found in $PATH (an executable regular
/// file), as execvp would pick it; `name` with a '/' is returned as is; ""
/// when not found. Call it in the parent, before spawn_child (which does no
/// PATH search).
inline std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    start = end + 1;
  }
  return "";
}

/// What a server child announced: "listening HOST:PORT".
struct listening_address {
  std::string host;  ///< as printed ("127.0.0.1", "::1" for "[::1]:PORT")
  std::uint16_t port = 0;  ///< 1..65535 (the port the OS picked for port 0)
  std::string line;  ///< the whole line, without its '\n'
};

/// Reads `fd` (the read end of a child's stdout pipe) one byte at a time up
/// to and including the first '\n' (nothing after it is consumed), waiting
/// at most `within` in all, and parses "listening HOST:PORT".
/// Errors (the message says what happened; the caller names the child):
///   error_code::timeout     no whole line within `within`;
///   error_code::unavailable the pipe was closed first (the child ended, or
///                           closed its stdout, before listening: reap it);
///   error_code::io          poll or read failed (errno in the message);
///   error_code::bad_format  the line is not "listening HOST:PORT" with a
///                           port from 1 to 65535 (the message quotes it).
/// Blocks the calling thread (poll); thread-safe for distinct descriptors.
inline result<listening_address> read_listening_line(int fd, std::chrono::milliseconds within) {
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + within;
  std::string line;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count();
    if (left <= 0)
      return make_error(error_code::timeout, "no 'listening HOST:PORT' line within " +
                                                 std::to_string(within.count()) + " ms" +
                                                 (line.empty() ? std::string() : " (so far: '" + line + "')"));
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (n < 0 && errno != EINTR)
      return make_error(error_code::io, std::string("poll on its stdout: ") + std::strerror(errno));
    if (n <= 0) continue;  // EINTR or the time is up: the loop re-checks the deadline
    char c = 0;
    const ssize_t k = ::read(fd, &c, 1);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) return make_error(error_code::io, std::string("reading its stdout: ") + std::strerror(errno));
    if (k == 0)
      return make_error(error_code::unavailable, "it ended before listening (stdout closed" +
                                                     (line.empty() ? std::string()
                                                                   : " after '" + line + "'") + ")");
    if (c == '\n') break;
    line.push_back(c);
  }
  const std::string prefix = "listening ";
  const auto colon = line.rfind(':');
  listening_address a;
  a.line = line;
  if (line.compare(0, prefix.size(), prefix) == 0 && colon != std::string::npos && colon > prefix.size()) {
    a.host = line.substr(prefix.size(), colon - prefix.size());
    if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
    const auto port = parse_uint<unsigned>(std::string_view(line).substr(colon + 1));
    if (port && *port >= 1 && *port <= 65535) {
      a.port = static_cast<std::uint16_t>(*port);
      return a;
    }
  }
  return make_error(error_code::bad_format, "its first line '" + line + "' is not 'listening HOST:PORT'");
}

}  // namespace cellshard
