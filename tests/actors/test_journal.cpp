// Session journal and resume (issue #7): a front end killed mid-generation
// (SIGKILL, paced with a `slow` fault so that "mid-generation" is certain)
// is resumed from its journal and produces the same remaining tokens.
#include "base/spawn.hpp"
#include "tests/support.hpp"

#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

using namespace cellshard;

namespace {
/// Starts argv with stdout on a pipe; returns the pid and the read end.
std::pair<pid_t, int> spawn(const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  const pid_t pid = spawn_child(args, -1, fds[1], -1);  // stderr to /dev/null (base/spawn.hpp)
  ::close(fds[1]);
  REQUIRE(pid > 0);
  return {pid, fds[0]};
}

/// Reads until `bytes` bytes of output arrived (or the deadline passed).
std::string read_at_least(int fd, size_t bytes, std::chrono::seconds deadline) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + deadline;
  char buf[4096];
  while (out.size() < bytes && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}
}  // namespace

namespace {
/// Runs the topp fixture with `model` flags on 2 in-process nodes, paced,
/// journaling; kills it after ~60 tokens; resumes with `resume_model` flags
/// and checks the rest of the text and the whole ids.
void kill_and_resume(const std::string& name, const std::vector<std::string>& model,
                     const std::vector<std::string>& resume_model) {
  const std::string dir = test::temp_dir(name);
  const std::string journal = dir + "/run.jsonl";
  const std::string fixture = "topp_t1.0_p0.9_s133742_n256";
  // 20 ms per step on node 1 from position 0 on: the run takes ~5 s.
  std::vector<std::string> first = {test::cellshard_bin(), "run"};
  first.insert(first.end(), model.begin(), model.end());
  first.insert(first.end(), {"-t", "1.0", "-p", "0.9", "-s", "133742", "-n", "256", "--nodes", "2", "--fault",
                             "slow:node=1:step=0:ms=20", "--journal", journal});
  auto [pid, fd] = spawn(first);
  // Wait for ~60 tokens of text on stdout, then kill the front end.
  const std::string seen = read_at_least(fd, 250, std::chrono::seconds(60));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  REQUIRE(seen.size() >= 250);
  CHECK(WIFSIGNALED(status));
  const std::string text = test::read_file(test::shared_file("fixtures/" + fixture + ".txt"));
  CHECK(text.substr(0, seen.size()) == seen);  // what it printed so far was right

  std::vector<std::string> again = {test::cellshard_bin(), "run"};
  again.insert(again.end(), resume_model.begin(), resume_model.end());
  again.insert(again.end(),
               {"--nodes", "2", "--resume", journal, "--expect-ids", test::shared_file("fixtures/" + fixture + ".ids")});
  auto r = test::run_command(again);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("resuming"));
  // The resumed run printed exactly the rest of the text.
  REQUIRE(r.out.size() < text.size());
  CHECK(text.substr(text.size() - r.out.size()) == r.out);
}
}  // namespace

TEST_CASE("a killed front end resumed from its journal reproduces the fixture", "[journal]") {
  if (!test::have_shared()) return;
  const std::vector<std::string> mz = {"-m", test::shared_file("models/stories260K.bin"), "-z",
                                       test::shared_file("models/tok512.bin")};
  kill_and_resume("journal", mz, mz);
}

TEST_CASE("gguf: a killed front end resumed from its journal alone reproduces the fixture", "[journal][gguf]") {
  // Issue #16: journal and resume on a GGUF model. The journal names the
  // model (its own tokenizer) and the --ctx it ran with, so --resume needs
  // neither -m nor --ctx; a --ctx that disagrees is refused.
  if (!test::have_shared()) return;
  const std::string g = test::shared_file("models/gguf/stories260K.gguf");
  kill_and_resume("journal-gguf", {"-m", g, "--ctx", "512"}, {});
  const std::string dir = test::temp_dir("journal-gguf-ctx");
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", g, "--ctx", "512", "-n", "20", "-t", "0",
                              "--nodes", "2", "-q", "--journal", dir + "/j.jsonl"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(test::read_file(dir + "/j.jsonl"), Catch::Contains("\"ctx\":512"));
  auto bad = test::run_command({test::cellshard_bin(), "run", "--ctx", "256", "--nodes", "2", "-q", "--resume",
                                dir + "/j.jsonl"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("--ctx 256 conflicts with the journal's --ctx 512"));
}

TEST_CASE("a journal names its model: resuming on another model or tokenizer is refused", "[journal]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("journal-identity");
  const std::string journal = dir + "/run.jsonl";
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-n", "20", "-t", "0", "--nodes", "2",
                              "-q", "--journal", journal});
  REQUIRE(r.status == 0);
  const std::string header = test::read_file(journal).substr(0, test::read_file(journal).find('\n'));
  CHECK_THAT(header, Catch::Contains("\"model\":\"stories260K.bin\"") &&
                         Catch::Contains("\"model_digest\":\"0xa63dd90f31c958a4\"") &&
                         Catch::Contains("\"tokenizer\":\"tok512.bin\""));
  // Same shape, other weights: the ids would be garbage, so it is refused.
  const std::string other = dir + "/other.bin";
  REQUIRE(test::run_command({test::cellshard_bin(), "synth", "--config", "stories260k", "-s", "5", "-o", other})
              .status == 0);
  auto bad = test::run_command({test::cellshard_bin(), "run", "-m", other, "-z", z, "--nodes", "2", "-q", "--resume",
                                journal});
  CHECK(bad.status == 1);
  CHECK_THAT(bad.err, Catch::Contains("journaled on model stories260K.bin (digest 0xa63dd90f31c958a4)") &&
                          Catch::Contains(other));
}

TEST_CASE("a fault for a placement index without a shard, and a daemon listed twice, are errors", "[faults][cli]") {
  if (!test::have_shared()) return;
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-n", "10", "--nodes", "2", "--spares",
                              "1", "-q", "--fault", "crash:node=2:step=1"});
  CHECK(r.status == 2);  // a usage error, as inspect's and plan's bad topologies
  CHECK_THAT(r.err, Catch::Contains("placement index 2 holds no shard") && Catch::Contains("indices 0..1"));
  const std::string dir = test::temp_dir("cluster-twice");
  const std::string file = dir + "/cluster.json";
  {
    std::ofstream f(file);
    f << R"({"nodes": [{"host": "127.0.0.1", "port": 4242}, {"host": "127.0.0.1", "port": 4243},
                       {"host": "127.0.0.1", "port": 4242, "spare": true}]})";
  }
  auto c = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-n", "10", "-q", "--cluster", file});
  CHECK(c.status == 1);
  CHECK_THAT(c.err, Catch::Contains("nodes[2] and nodes[0] are the same daemon (127.0.0.1:4242)"));
}
