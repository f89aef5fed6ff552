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
