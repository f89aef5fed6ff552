// The cluster fingerprint: a node whose copy of the model file (in a tensor
// its slice holds: the weight manifest, issue #17) or of the tokenizer
// differs from the front end's is refused, and the error names the node
// (host:port) and what differs; a node without the files gets its slice
// shipped. And the deadlines: an
// unreachable or frozen daemon at start-up ends the front end with a clear
// error instead of a hang.
#include "tests/net/net_support.hpp"
#include "tests/support.hpp"

#include <chrono>
#include <memory>
#include <sys/stat.h>

using namespace cellshard;

namespace {

test::command_result run_on(const std::string& cluster_file, double timeout_s = 60) {
  return test::run_command({test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"),
                            "-z", test::shared_file("models/tok512.bin"), "-t", "0", "-n", "20", "-q",
                            "--cluster", cluster_file},
                           timeout_s);
}

}  // namespace

TEST_CASE("a node with another model file or tokenizer is refused, naming the node", "[net][fingerprint]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-fingerprint");
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  // Folders of the same file names with other contents.
  for (auto sub : {"/good", "/other-model", "/other-tok", "/empty"}) test::run_command({"/bin/mkdir", "-p", dir + sub});
  test::copy_file(m, dir + "/good/stories260K.bin");
  test::copy_file(z, dir + "/good/tok512.bin");
  // A byte of the token embedding table (byte 100 of the file), which node 1
  // holds as the tied classifier. (A byte of the unused RoPE tables near the
  // end is in no slice's manifest, so no node would notice it.)
  struct stat msb;
  REQUIRE(::stat(m.c_str(), &msb) == 0);
  test::copy_with_flip(m, dir + "/other-model/stories260K.bin", static_cast<long>(msb.st_size) - 100);
  test::copy_file(z, dir + "/other-model/tok512.bin");
  test::copy_file(m, dir + "/other-tok/stories260K.bin");
  test::copy_with_flip(z, dir + "/other-tok/tok512.bin", 2);  // a byte of the last piece

  test::daemon_process good(dir, {"--models", dir + "/good"});
  test::daemon_process other_model(dir, {"--models", dir + "/other-model"});
  test::daemon_process other_tok(dir, {"--models", dir + "/other-tok"});
  test::daemon_process empty(dir, {"--models", dir + "/empty"});
  for (auto* d : {&good, &other_model, &other_tok, &empty}) {
    INFO(d->log());
    REQUIRE(d->ok());
  }

  SECTION("matching copies join") {
    auto r = run_on(test::write_cluster_file(dir + "/good.json", {good.port()}));
    INFO(r.err);
    CHECK(r.status == 0);
  }
  SECTION("another model file") {
    auto r = run_on(test::write_cluster_file(dir + "/m.json", {good.port(), other_model.port()}));
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 1 (" + other_model.address() + ")") &&
                          Catch::Contains("model differs") && Catch::Contains("stories260K.bin") &&
                          Catch::Contains("tensor token_embedding"));
    CHECK_THAT(r.err, !Catch::Contains("tokenizer differs") && !Catch::Contains(good.address()));
  }
  SECTION("another tokenizer") {
    auto r = run_on(test::write_cluster_file(dir + "/t.json", {other_tok.port(), good.port()}));
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 0 (" + other_tok.address() + ")") &&
                          Catch::Contains("tokenizer differs") && Catch::Contains("tok512.bin"));
    CHECK_THAT(r.err, !Catch::Contains("model differs"));
  }
  SECTION("no such file on the node: its slice is shipped") {
    auto r = run_on(test::write_cluster_file(dir + "/e.json", {good.port(), empty.port()}));
    INFO(r.err << "\n" << empty.log());
    CHECK(r.status == 0);
    CHECK_THAT(empty.log(), Catch::Contains("placement index 1: shipped"));
  }
}

TEST_CASE("a node with another GGUF file is refused, naming the node", "[net][fingerprint][gguf]") {
  // Issue #16: a GGUF model is fingerprinted like a .bin. The GGUF is its own
  // tokenizer (no -z), so the node's copy is checked as both.
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-fingerprint-gguf");
  const std::string g = test::shared_file("models/gguf/stories260K.gguf");
  for (auto sub : {"/good", "/other"}) test::run_command({"/bin/mkdir", "-p", dir + sub});
  test::copy_file(g, dir + "/good/stories260K.gguf");
  test::copy_with_flip(g, dir + "/other/stories260K.gguf", 5);  // a byte of the last tensor
  test::daemon_process good(dir, {"--models", dir + "/good"});
  test::daemon_process other(dir, {"--models", dir + "/other"});
  for (auto* d : {&good, &other}) {
    INFO(d->log());
    REQUIRE(d->ok());
  }
  auto run_gguf = [&](const std::string& cluster) {
    return test::run_command({test::cellshard_bin(), "run", "-m", g, "--ctx", "512", "-t", "0", "-n", "20", "-q",
                              "--cluster", cluster},
                             60);
  };
  SECTION("matching copies join") {
    auto r = run_gguf(test::write_cluster_file(dir + "/good.json", {good.port()}));
    INFO(r.err);
    CHECK(r.status == 0);
  }
  SECTION("another copy of the GGUF") {
    auto r = run_gguf(test::write_cluster_file(dir + "/m.json", {good.port(), other.port()}));
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 1 (" + other.address() + ")") && Catch::Contains("model differs") &&
                          Catch::Contains("stories260K.gguf"));
    CHECK_THAT(r.err, !Catch::Contains("node 0 (" + good.address() + ")"));
  }
}

TEST_CASE("an unreachable or frozen daemon at start-up is a clear error within the deadline", "[net][deadline]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-deadline");
  test::daemon_process good(dir, {"--models", test::shared_file("models")});
  INFO(good.log());
  REQUIRE(good.ok());
  using clk = std::chrono::steady_clock;

  SECTION("nothing listening") {
    const uint16_t port = test::closed_port();
    const auto t0 = clk::now();
    auto r = run_on(test::write_cluster_file(dir + "/closed.json", {good.port(), port}));
    WARN("unreachable: front end ended after "
         << std::chrono::duration<double>(clk::now() - t0).count() << " s");
    INFO(r.err);
    CHECK(r.status == 1);  // -1 would mean run_command had to kill it
    CHECK_THAT(r.err, Catch::Contains("node 1 (127.0.0.1:" + std::to_string(port) + ")") &&
                          Catch::Contains("cannot connect"));
  }
  SECTION("a frozen (SIGSTOPped) daemon") {
    test::daemon_process frozen(dir, {"--models", test::shared_file("models")});
    REQUIRE(frozen.ok());
    frozen.freeze();
    const auto t0 = clk::now();
    auto r = run_on(test::write_cluster_file(dir + "/frozen.json", {good.port(), frozen.port()}));
    WARN("frozen: front end ended after " << std::chrono::duration<double>(clk::now() - t0).count() << " s");
    INFO(r.err);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("node 1 (" + frozen.address() + ")") && Catch::Contains("timeout"));
    CHECK_THAT(r.err, !Catch::Contains(good.address()));
  }
}

TEST_CASE("a daemon whose own memory budget cannot hold its slice is not used, naming the node", "[net][memory]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("net-memory");
  test::daemon_process small(dir, {"--models", test::shared_file("models"), "--memory", "300KiB"});
  test::daemon_process big(dir, {"--models", test::shared_file("models")});
  REQUIRE(small.ok());
  REQUIRE(big.ok());
  // The cluster file claims the default (host) budget; the daemon knows
  // better: it says so, and the model is placed on the other node alone.
  auto r = run_on(test::write_cluster_file(dir + "/m.json", {small.port(), big.port()}));
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("warning: node 0 (" + small.address() + ") not used") &&
                        Catch::Contains("out of memory") && Catch::Contains("300 KiB"));
  // Alone, it leaves nothing to place on: a clear error naming it.
  auto alone = run_on(test::write_cluster_file(dir + "/s.json", {small.port()}));
  INFO(alone.err);
  CHECK(alone.status == 1);
  CHECK_THAT(alone.err, Catch::Contains("node 0 (" + small.address() + ") not used") &&
                            Catch::Contains("out of memory") && Catch::Contains("300 KiB"));
  // Its front ends gone, the daemon serves the next one.
  auto ok = run_on(test::write_cluster_file(dir + "/b.json", {big.port()}));
  INFO(ok.err);
  CHECK(ok.status == 0);
}
