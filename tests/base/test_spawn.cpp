// base/spawn.hpp: a child holds only descriptors 0, 1 and 2 (none of the
// parent's, even without close-on-exec), gets SIGKILL when the thread that
// started it ends, and an exec failure is exit status 127. Real processes;
// every wait is on the child's own output or end, with no timing.
#include "base/spawn.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>

using namespace cellshard;

namespace {

/// Everything a child writes to `fd` until it closes it.
std::string read_all(int fd) {
  std::string out;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

TEST_CASE("spawn_child: the child holds only 0, 1 and 2", "[spawn]") {
  // Descriptors the parent leaks on purpose (no O_CLOEXEC), at numbers the
  // child's own work cannot take.
  int leak[2];
  REQUIRE(::pipe(leak) == 0);
  REQUIRE(::dup2(leak[0], 40) == 40);
  REQUIRE(::dup2(leak[1], 41) == 41);
  ::close(leak[0]);
  ::close(leak[1]);
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  // The shell lists its own descriptors; reading the folder takes the lowest
  // free one, 3, for itself.
  const pid_t pid = spawn_child({"/bin/sh", "-c", "cd /proc/self/fd && echo *"}, -1, out[1], -1);
  ::close(out[1]);
  REQUIRE(pid > 0);
  const std::string listed = read_all(out[0]);
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  INFO("the child's descriptors: " << listed << " (the parent leaked 40 and 41)");
  CHECK(listed == "0 1 2 3\n");
  ::close(40);
  ::close(41);
}

TEST_CASE("spawn_child: the child dies with the thread that started it", "[spawn]") {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  pid_t pid = -1;
  std::thread starter([&] {
    pid = spawn_child({"/bin/sh", "-c", "echo ready; exec sleep 60"}, -1, out[1], -1);
    if (pid <= 0) return;
    // "ready" comes after the child set its parent-death signal (before exec).
    char c = 0;
    while (::read(out[0], &c, 1) == 1 && c != '\n') {
    }
  });
  starter.join();  // the thread ends: the kernel SIGKILLs the child
  ::close(out[1]);
  ::close(out[0]);
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);  // at worst after the 60 s sleep, which then fails below
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

TEST_CASE("spawn_child: a program that cannot run is exit status 127", "[spawn]") {
  const pid_t pid = spawn_child({"/nonexistent/program"});
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 127);
  CHECK(find_program("sh").find("/sh") != std::string::npos);
  CHECK(find_program("no-such-program-anywhere").empty());
  CHECK(find_program("/bin/sh") == "/bin/sh");
}
