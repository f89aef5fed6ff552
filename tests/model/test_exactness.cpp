// The exactness contract (docs/reliability.md) on a model bigger than
// stories260K, with sampling: a stories15m-shaped synthetic model (synth
// --config stories15m --seq-len 512, the 32000-token tokenizer.bin),
// -t 0.8 -p 0.9 -n 150, seeds 1-5.
// - The reference backend prints exactly what llama2.c's run.c prints (run.c
//   built here with `gcc -O3 run.c -lm` from ../shared/peers/llama2.c, in a
//   temporary folder; its code is not part of the project).
// - Every placement, with faults, produces the ids of its own fault-free run
//   (cellshard chaos: 0 diverged, 0 hung).
// Labelled `slow` (several minutes): `ctest -L slow -R exactness`.
#include "tests/support.hpp"

#include <sys/stat.h>

using namespace cellshard;

namespace {
struct fixture15m {
  std::string dir, model, tok, runc;
};

const fixture15m& setup() {
  static fixture15m f = [] {
    fixture15m x;
    x.dir = test::temp_dir("exactness");
    x.tok = test::shared_file("models/tokenizer.bin");
    x.model = x.dir + "/stories15m-512.bin";
    auto s = test::run_command({test::cellshard_bin(), "synth", "--config", "stories15m", "--seq-len", "512", "-s",
                                "15", "-o", x.model});
    REQUIRE(s.status == 0);
    x.runc = x.dir + "/runc";
    auto g = test::run_command({"/usr/bin/gcc", "-O3", test::shared_file("peers/llama2.c/run.c"), "-lm", "-o", x.runc},
                               300);
    INFO(g.err);
    REQUIRE(g.status == 0);
    return x;
  }();
  return f;
}
}  // namespace

TEST_CASE("the reference backend prints run.c's text on a stories15m-shaped model with sampling",
          "[exactness][slow]") {
  if (!test::have_shared()) return;
  const auto& f = setup();
  for (int seed = 1; seed <= 5; ++seed) {
    DYNAMIC_SECTION("seed " << seed) {
      const std::string s = std::to_string(seed);
      auto want = test::run_command({f.runc, f.model, "-z", f.tok, "-t", "0.8", "-p", "0.9", "-n", "150", "-s", s}, 600);
      REQUIRE(want.status == 0);
      REQUIRE(want.out.size() > 100);
      auto got = test::run_command({test::cellshard_bin(), "run", "-m", f.model, "-z", f.tok, "-t", "0.8", "-p", "0.9",
                                    "-n", "150", "-s", s, "--kernels", "reference"},
                                   600);
      INFO(got.err);
      CHECK(got.status == 0);
      CHECK(got.out == want.out);
    }
  }
}

TEST_CASE("every placement with faults produces its own fault-free ids on a stories15m-shaped model",
          "[exactness][slow]") {
  if (!test::have_shared()) return;
  const auto& f = setup();
  struct placement {
    const char* name;
    std::vector<std::string> flags;
  };
  const std::vector<placement> table = {
      {"pipeline:3", {"--nodes", "3", "--spares", "2", "--topology", "pipeline"}},
      {"tensor:3", {"--nodes", "3", "--spares", "2", "--topology", "tensor"}},
      {"hybrid:3x2", {"--nodes", "6", "--spares", "2", "--topology", "hybrid:3x2"}},
  };
  for (const auto& p : table) {
    DYNAMIC_SECTION(p.name) {
      std::vector<std::string> args = {test::cellshard_bin(), "chaos", "-m", f.model, "-z", f.tok, "-t", "0.8", "-p",
                                       "0.9", "-n", "60", "-s", "3", "--runs", "4", "--seed", "21", "--kinds",
                                       "crash,silence,drop,corrupt"};
      args.insert(args.end(), p.flags.begin(), p.flags.end());
      auto r = test::run_command(args, 900);
      INFO(r.out << r.err);
      CHECK(r.status == 0);
      CHECK_THAT(r.out, Catch::Contains("runs 4: 0 diverged, 0 hung"));
    }
  }
}
