// `cellshard run` with in-process nodes: fixtures through the binary on a
// tensor group, --print-placement, and the memory-fit error's exit status.
#include "tests/support.hpp"

using namespace cellshard;

TEST_CASE("cellshard run --nodes reproduces fixtures and prints the placement", "[cli][actors]") {
  if (!test::have_shared()) return;
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-t", "1.0", "-p", "0.9",
                              "-s", "133742", "-n", "256", "--nodes", "3", "--topology", "tensor",
                              "--print-placement", "--expect-ids",
                              test::shared_file("fixtures/topp_t1.0_p0.9_s133742_n256.ids")});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == test::read_file(test::shared_file("fixtures/topp_t1.0_p0.9_s133742_n256.txt")));
  CHECK_THAT(r.err, Catch::Contains("placement tensor") && Catch::Contains("tp rank 2"));
  auto r8 = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-t", "0", "-n", "200",
                               "--nodes", "8", "--print-placement", "--expect-ids",
                               test::shared_file("fixtures/greedy_bos_n200.ids")});
  CHECK(r8.status == 0);
  CHECK_THAT(r8.err, Catch::Contains("3 spares"));
}

TEST_CASE("cellshard run: a node budget too small is exit 1 naming the node", "[cli][actors]") {
  if (!test::have_shared()) return;
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", test::shared_file("models/stories260K.bin"),
                              "-z", test::shared_file("models/tok512.bin"), "--nodes", "2", "--memory",
                              "512KiB", "-n", "10"});
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("node 0") && Catch::Contains("512"));
  auto bad = test::run_command({test::cellshard_bin(), "run", "--nodes", "2", "--memory", "lots"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("--memory"));
}

TEST_CASE("step timeout flags on run, serve and chaos: checked, and a run with them recovers a lost message",
          "[cli][actors]") {
  if (!test::have_shared()) return;
  const std::string bin = test::cellshard_bin();
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  for (const std::string cmd : {"run", "serve", "chaos"}) {
    INFO(cmd);
    auto crossed = test::run_command({bin, cmd, "-m", m, "-z", z, "--step-timeout-min", "5000",
                                      "--step-timeout-max", "100"},
                                     60);
    CHECK(crossed.status == 2);
    CHECK_THAT(crossed.err, Catch::Contains("--step-timeout-min (5000 ms) exceeds --step-timeout-max (100 ms)"));
    auto zero = test::run_command({bin, cmd, "-m", m, "-z", z, "--step-timeout-min", "0"}, 60);
    CHECK(zero.status == 2);
    CHECK_THAT(zero.err, Catch::Contains("--step-timeout-min"));
  }
  // A message dropped at position 10: the step's deadline (floored at 300 ms,
  // capped at 20 s) passes, the probe finds nobody working on the step and
  // nothing in transit, and the re-sent step gives the fixture's ids.
  const std::string dir = test::temp_dir("cli-step-timeouts");
  auto r = test::run_command({bin, "run", "-m", m, "-z", z, "-t", "0", "-n", "200", "--nodes", "2", "--fault",
                              "drop:node=1:step=10", "--step-timeout-min", "300", "--step-timeout-max", "20000",
                              "--expect-ids", test::shared_file("fixtures/greedy_bos_n200.ids"), "--json",
                              dir + "/run.json"},
                             120);
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(r.out == test::read_file(test::shared_file("fixtures/greedy_bos_n200.txt")));
  const std::string j = test::read_file(dir + "/run.json");
  CHECK_THAT(j, Catch::Contains("\"kind\": \"drop\""));
}
