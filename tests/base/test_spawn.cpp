// base/spawn.hpp: a child holds only descriptors 0, 1 and 2 (none of the
// parent's, even without close-on-exec), gets SIGKILL when the thread that
// started it ends, and an exec failure is exit status 127. Real processes;
// every wait is on the child's own output or end, with no timing.
#include "base/cgroup.hpp"
#include "base/parse.hpp"
#include "base/spawn.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <csignal>
#include <sys/stat.h>
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

namespace {

/// A pipe holding `bytes`; its write end closed when `close_writer`.
struct filled_pipe {
  int fds[2] = {-1, -1};
  filled_pipe(const std::string& bytes, bool close_writer) {
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    REQUIRE(::write(fds[1], bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    if (close_writer) {
      ::close(fds[1]);
      fds[1] = -1;
    }
  }
  ~filled_pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TEST_CASE("read_listening_line: a server child's first line, parsed, and nothing after it consumed", "[spawn]") {
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  const pid_t pid = spawn_child({"/bin/sh", "-c", "echo listening 127.0.0.1:4242; echo second line"}, -1, out[1], -1);
  ::close(out[1]);
  REQUIRE(pid > 0);
  auto a = read_listening_line(out[0], std::chrono::minutes(1));
  INFO((a.ok() ? a->line : a.message()));
  REQUIRE(a);
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 4242);
  CHECK(a->line == "listening 127.0.0.1:4242");
  CHECK(read_all(out[0]) == "second line\n");  // nothing after the first line was consumed
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);

  filled_pipe v6("listening [::1]:65535\n", false);
  auto b = read_listening_line(v6.fds[0], std::chrono::minutes(1));
  REQUIRE(b);
  CHECK(b->host == "::1");
  CHECK(b->port == 65535);
}

TEST_CASE("read_listening_line: each way of not listening is its own error", "[spawn]") {
  SECTION("the child ends first") {
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    const pid_t pid = spawn_child({"/bin/sh", "-c", "printf 'listen'; exit 3"}, -1, out[1], -1);
    ::close(out[1]);
    REQUIRE(pid > 0);
    auto r = read_listening_line(out[0], std::chrono::minutes(1));
    ::close(out[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WEXITSTATUS(status) == 3);
    REQUIRE_FALSE(r);
    CHECK(r.code() == error_code::unavailable);
    CHECK(r.message() == "it ended before listening (stdout closed after 'listen')");
  }
  SECTION("no line by the deadline (the writer stays open)") {
    filled_pipe p("listening 127.0.0.1:1", false);  // no '\n' yet
    auto r = read_listening_line(p.fds[0], std::chrono::milliseconds(0));
    REQUIRE_FALSE(r);
    CHECK(r.code() == error_code::timeout);
    CHECK(r.message() == "no 'listening HOST:PORT' line within 0 ms");
  }
  SECTION("some other line") {
    for (const std::string bad : {"error: no model\n", "listening 127.0.0.1:0\n", "listening 127.0.0.1:65536\n",
                                  "listening 127.0.0.1:80x\n", "listening :80\n", "listening host\n", "\n"}) {
      INFO(bad);
      filled_pipe p(bad, true);
      auto r = read_listening_line(p.fds[0], std::chrono::minutes(1));
      REQUIRE_FALSE(r);
      CHECK(r.code() == error_code::bad_format);
      CHECK(r.message() == "its first line '" + bad.substr(0, bad.size() - 1) + "' is not 'listening HOST:PORT'");
    }
  }
}

// base/cgroup.hpp: a busy child in a cgroup capped at 10% of a core is
// throttled by the kernel (the cgroup's cpu.stat counts throttled periods);
// the quota file holds 1000 us per 10,000 us. Needs root and a cgroup CPU
// controller: skipped with a message otherwise (CI runs as root).
TEST_CASE("cpu_cap: a child in a capped cgroup is throttled", "[spawn][cgroup]") {
  cpu_cap cap;
  const std::string name = "cellshard-test-" + std::to_string(::getpid());
  auto made = cap.create(name, 10.0);
  if (!made) {
    if (::geteuid() != 0) {
      WARN("skipped: " << made.message());
      return;
    }
    FAIL(made.message());
  }
  const bool v2 = cap.dir().rfind("/sys/fs/cgroup/cpu/", 0) != 0;
  auto read_text = [](const std::string& path) {
    std::string s;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return s;
    s = read_all(fd);
    ::close(fd);
    return s;
  };
  if (v2)
    CHECK(read_text(cap.dir() + "/cpu.max") == "1000 10000\n");
  else
    CHECK(read_text(cap.dir() + "/cpu.cfs_quota_us") == "1000\n");
  const pid_t pid = spawn_child({"/bin/sh", "-c", "while :; do :; done"}, -1, -1, -1);
  REQUIRE(pid > 0);
  auto added = cap.add(pid);
  CHECK(added);
  // The kernel throttles it within a few 10 ms periods; bounded at 20 s.
  uint64_t throttled = 0;
  for (int i = 0; i < 2000 && added && throttled == 0; ++i) {
    const std::string stat = read_text(cap.dir() + "/cpu.stat");
    const auto at = stat.find("nr_throttled ");
    if (at != std::string::npos) {
      const auto end = stat.find('\n', at);
      throttled = parse_uint<uint64_t>(std::string_view(stat).substr(at + 13, end - (at + 13))).value_or(0);
    }
    if (throttled == 0) ::usleep(10000);
  }
  CHECK(throttled > 0);
  CHECK(read_text(cap.dir() + "/cgroup.procs").find(std::to_string(pid)) != std::string::npos);
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  // Empty now: remove() takes the group away.
  const std::string dir = cap.dir();
  cap.remove();
  struct stat sb;
  CHECK(::stat(dir.c_str(), &sb) != 0);
}

TEST_CASE("cpu_cap: a share that is not one is refused, naming it", "[spawn][cgroup]") {
  cpu_cap cap;
  for (double bad : {0.0, -5.0, 20000.0}) {
    auto r = cap.create("cellshard-bad", bad);
    REQUIRE_FALSE(r);
    CHECK(r.message().find("expected 0 < PCT <= 10000") != std::string::npos);
  }
  CHECK(cap.dir().empty());
}
