// Mixture of experts through the binary: llama.cpp's ids on moe-small-f32.gguf
// from `cellshard run` (one node and in-process pipelines), `inspect`'s expert
// counts, and `synth --experts` models giving one set of ids everywhere.
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

using namespace cellshard;

namespace {

std::vector<int> want_ids(const std::string& prompt) {
  return test::gguf_reference_ids("moe-small-f32.gguf", prompt);
}

std::vector<int> ids_of(const test::command_result& r, const std::string& path) {
  return test::ids_written(r, path);
}

}  // namespace

TEST_CASE("cellshard run: moe-small-f32.gguf gives llama.cpp's ids on one node and on pipelines",
          "[cli][moe]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  const std::string dir = test::temp_dir("cli-moe");
  const auto want = want_ids("Once upon a time");
  const std::vector<std::vector<std::string>> placements = {
      {},                                                  // the single-process engine
      {"--nodes", "2", "--topology", "pipeline"},          // each stage its layers' experts
      {"--nodes", "4", "--topology", "hybrid:2x2"},        // experts' units split in two
  };
  int i = 0;
  for (const auto& extra : placements) {
    const std::string out = dir + "/once" + std::to_string(i++) + ".ids";
    std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", model, "-i", "Once upon a time",
                                  "-n", std::to_string(want.size() - 1), "-t", "0", "--ignore-eos",
                                  "--ids-out", out, "-q"};
    a.insert(a.end(), extra.begin(), extra.end());
    INFO("placement " << (extra.empty() ? std::string("engine") : extra[3]));
    CHECK(ids_of(test::run_command(a), out) == want);
  }
  // The short form the README shows: -n 20 runs 20 positions, and the ids
  // file holds the 21 ids they read and produced (docs/formats.md).
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", model, "-i", "Once upon a time",
                              "-n", "20", "-t", "0", "--ids-out", dir + "/n20.ids"});
  const auto got = ids_of(r, dir + "/n20.ids");
  CHECK(got == std::vector<int>(want.begin(), want.begin() + 21));
}

TEST_CASE("cellshard inspect shows the expert counts", "[cli][moe]") {
  const auto model = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (model.empty()) return;
  auto r = test::run_command({test::cellshard_bin(), "inspect", model});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("experts: 8 per layer, 2 used per token, expert hidden 256, "
                                    "top-k weights renormalised"));
  const std::string json = test::temp_dir("cli-moe") + "/inspect.json";
  r = test::run_command({test::cellshard_bin(), "inspect", model, "--json", json});
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(test::read_file(json));
  CHECK(j["config"]["experts"] == 8);
  CHECK(j["config"]["experts_used"] == 2);
  // 4 layers x 6 unused experts x 3 matrices of 128 x 256 are not active.
  CHECK(j["config"]["params"].get<uint64_t>() - j["config"]["active_params"].get<uint64_t>() ==
        4ull * 6 * 3 * 128 * 256);
}

TEST_CASE("cellshard synth --experts: one set of ids on every backend and placement", "[cli][moe][synth]") {
  const auto tok = test::shared_file("models/tok512.bin");
  if (tok.empty()) return;
  const std::string dir = test::temp_dir("cli-moe-synth");
  for (int shared : {0, 1}) {
    const std::string model = dir + "/moe" + std::to_string(shared) + ".gguf";
    auto s = test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--dim", "64",
                                "--hidden", "32", "--layers", "4", "--heads", "4", "--kv-heads", "2",
                                "--vocab", "512", "--seq-len", "128", "--experts", "6",
                                "--experts-used", "2", "--shared-experts", std::to_string(shared),
                                "-s", "11", "-o", model});
    INFO(s.err);
    REQUIRE(s.status == 0);
    std::vector<int> first;
    const std::vector<std::vector<std::string>> runs = {
        {"--kernels", "reference"},
        {"--kernels", "blas"},
        {"--kernels", "spe"},
        {"--kernels", "native"},
        {"--nodes", "2", "--topology", "pipeline"},
        {"--nodes", "2", "--topology", "tensor"},
    };
    int i = 0;
    for (const auto& extra : runs) {
      const std::string out = dir + "/s" + std::to_string(shared) + "_" + std::to_string(i++) + ".ids";
      std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", model, "-z", tok,
                                    "-i", "Once upon a time", "-n", "40", "-t", "0",
                                    "--ignore-eos", "--ids-out", out, "-q"};
      a.insert(a.end(), extra.begin(), extra.end());
      INFO("shared " << shared << " " << extra[0] << " " << extra[1]);
      const auto ids = ids_of(test::run_command(a), out);
      CHECK(ids.size() == 41);
      if (first.empty()) first = ids;
      CHECK(ids == first);
    }
  }
  SECTION("bad flags") {
    auto r = test::run_command({test::cellshard_bin(), "synth", "--experts", "4", "--experts-used", "5",
                                "-o", dir + "/bad.gguf"});
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains("--experts-used is 5, expected 1..--experts (4)"));
  }
}
