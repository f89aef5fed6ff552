#include "tools/stop_signals.hpp"

#include "tools/common.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace cellshard::tools {

namespace {

int pipe_fds[2] = {-1, -1};  // [0] read by wait(), [1] written by the handler and cancel()

void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(pipe_fds[1], &b, 1);
  errno = saved;
}

}  // namespace

stop_signals::stop_signals() {
  if (pipe_fds[0] >= 0) throw cli_error("stop_signals: one instance at a time");
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw cli_error(std::string("stop_signals: pipe: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM})
    if (::sigaction(sig, &sa, nullptr) != 0)
      throw cli_error(std::string("stop_signals: sigaction: ") + std::strerror(errno));
  // A thread of ours that blocked them earlier would still take them: unblock here.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

stop_signals::~stop_signals() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  for (int& fd : pipe_fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

int stop_signals::wait() {
  for (;;) {
    unsigned char b = 0;
    const ssize_t n = ::read(pipe_fds[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    return 0;  // the pipe failed: treat as a stop
  }
}

void stop_signals::cancel() {
  const unsigned char b = 0;
  (void)!::write(pipe_fds[1], &b, 1);
}

}  // namespace cellshard::tools
