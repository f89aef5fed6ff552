// `cellshard run` and `cellshard synth` as a user runs them: every fixture
// through the binary with both backends, exit codes and error messages.
#include "model/synth.hpp"
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include <fstream>

using namespace cellshard;

namespace {
std::vector<std::string> run_args(const test::fixture_case& fc, const std::string& kernels) {
  std::vector<std::string> a = {test::cellshard_bin(), "run",
                                "-m", test::shared_file("models/stories260K.bin"),
                                "-z", test::shared_file("models/tok512.bin"),
                                "-n", std::to_string(fc.steps),
                                "-t", std::to_string(fc.temperature),
                                "-p", std::to_string(fc.topp),
                                "--kernels", kernels};
  if (fc.seed) a.insert(a.end(), {"-s", std::to_string(fc.seed)});
  if (!fc.prompt.empty()) a.insert(a.end(), {"-i", fc.prompt});
  return a;
}
}  // namespace

TEST_CASE("cellshard run prints run.c's text and ids for every fixture", "[cli][fixtures]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("cli");
  for (const char* k : {"reference", "blas", "native", "spe"}) {
    for (const auto& fc : test::fixture_cases()) {
      DYNAMIC_SECTION(k << " " << fc.name) {
        auto args = run_args(fc, k);
        const std::string ids = dir + "/" + fc.name + "." + k + ".ids";
        args.insert(args.end(), {"--ids-out", ids, "--expect-ids",
                                 test::shared_file("fixtures/" + fc.name + ".ids")});
        auto r = test::run_command(args);
        INFO(r.err);
        CHECK(r.status == 0);
        CHECK(r.out == test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
        CHECK(test::read_file(ids) == test::read_file(test::shared_file("fixtures/" + fc.name + ".ids")));
        CHECK_THAT(r.err, Catch::Contains("achieved tok/s:"));
      }
    }
  }
}

TEST_CASE("cellshard run gives the same ids with --threads 1 and --threads 2", "[cli][threads]") {
  if (!test::have_shared()) return;
  // A synthetic model whose every matrix is above the 128 KiB below which
  // native does not split rows (256 x 256 floats), with tok512's vocabulary.
  const std::string dir = test::temp_dir("cli-threads");
  const std::string m = dir + "/s256.bin";
  auto s = test::run_command({test::cellshard_bin(), "synth", "--dim", "256", "--hidden", "688", "--layers", "2",
                              "--heads", "8", "--kv-heads", "4", "--vocab", "512", "--seq-len", "128", "-s", "3",
                              "-o", m});
  REQUIRE(s.status == 0);
  for (const char* weights : {"f32", "q8_0"}) {
    std::vector<std::string> ids;
    for (const char* threads : {"1", "2"}) {
      const std::string out = dir + "/" + weights + "." + threads + ".ids";
      auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", test::shared_file("models/tok512.bin"),
                                  "-n", "60", "-t", "0.8", "-s", "5", "--kernels", "native", "--weights", weights,
                                  "--threads", threads, "-q", "--ids-out", out});
      INFO(r.err);
      REQUIRE(r.status == 0);
      ids.push_back(test::read_file(out));
    }
    INFO(weights);
    CHECK(ids[0].size() > 20);
    CHECK(ids[0] == ids[1]);
  }
}

TEST_CASE("cellshard run: bad inputs exit 1 with their own message", "[cli][errors]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("cli-errors");
  const std::string model = test::shared_file("models/stories260K.bin");
  const std::string tok = test::shared_file("models/tok512.bin");
  auto bytes = test::read_file(model);
  auto run = [&](const std::string& m, const std::string& z) {
    return test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", z, "-n", "8", "-t", "0"});
  };
  SECTION("truncated model") {
    const std::string p = dir + "/truncated.bin";
    std::ofstream(p, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    auto r = run(p, tok);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains(p) && Catch::Contains("truncated") &&
                          Catch::Contains("expected 1056540 bytes"));
  }
  SECTION("corrupt header") {
    const std::string p = dir + "/corrupt.bin";
    std::string b = bytes;
    b[12] = '\x07';  // n_heads 8 -> 7: dim 64 is no longer divisible
    std::ofstream(p, std::ios::binary) << b;
    auto r = run(p, tok);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains(p) && Catch::Contains("n_heads 7"));
  }
  SECTION("tokenizer of another vocabulary") {
    auto r = run(model, test::shared_file("models/tokenizer.bin"));
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("32000 tokens") && Catch::Contains("vocab_size 512"));
  }
  SECTION("missing model file") {
    auto r = run(dir + "/nope.bin", tok);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains(dir + "/nope.bin") && Catch::Contains("No such file"));
  }
  SECTION("default tokenizer beside the model is missing") {
    const std::string p = dir + "/alone.bin";
    std::ofstream(p, std::ios::binary) << bytes;
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", p, "-n", "4"});
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains(dir + "/tokenizer.bin"));
  }
  SECTION("unknown backend is a usage error") {
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", model, "-z", tok, "--kernels", "gpu"});
    CHECK(r.status == 2);
    CHECK_THAT(r.err, Catch::Contains("gpu") && Catch::Contains("reference"));
  }
  SECTION("no crash on any of them") {
    auto r = test::run_command({test::cellshard_bin(), "run", "--bogus-flag"});
    CHECK(r.status == 2);
  }
}

TEST_CASE("run --expect-ids reports the first differing position and exits 3", "[cli]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("cli-expect");
  auto want = test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids"));
  want[17] += 1;
  std::ofstream(dir + "/wrong.ids") << [&] {
    std::string s;
    for (size_t i = 0; i < want.size(); ++i) s += (i ? "," : "") + std::to_string(want[i]);
    return s + "\n";
  }();
  auto r = test::run_command({test::cellshard_bin(), "run", "-m",
                              test::shared_file("models/stories260K.bin"), "-z",
                              test::shared_file("models/tok512.bin"), "-t", "0", "-n", "200",
                              "--expect-ids", dir + "/wrong.ids", "--json", dir + "/r.json"});
  CHECK(r.status == 3);
  CHECK_THAT(r.err, Catch::Contains("position 17"));
  CHECK_THAT(test::read_file(dir + "/r.json"), Catch::Contains("\"diverged\": true"));
}

// When the prompt fills every position (more prompt tokens than -n), no
// position is computed: run prints no rate (it printed "achieved tok/s:
// 0.000000", a rate of nothing); with one position left to compute after the
// first it prints run.c's line with a rate above 0.
TEST_CASE("run: no tok/s when the prompt fills every position and run.c's line otherwise", "[cli]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("cli-tps");
  const std::string m = test::shared_file("models/stories260K.bin"), z = test::shared_file("models/tok512.bin");
  const std::string prompt = "Once upon a time there was a little girl";
  auto tk = test::run_command({test::cellshard_bin(), "tokenize", "-m", m, "-z", z, "-i", prompt});
  REQUIRE(tk.status == 0);
  std::vector<int> prompt_ids;
  {
    std::istringstream in(tk.out);
    for (int id; in >> id;) prompt_ids.push_back(id);
  }
  const int n_prompt = static_cast<int>(prompt_ids.size());
  REQUIRE(n_prompt > 5);
  const std::vector<std::vector<std::string>> placements = {{}, {"--nodes", "2"}};
  for (const auto& nodes : placements) {
    DYNAMIC_SECTION((nodes.empty() ? "one node" : "two in-process nodes")) {
      auto args = [&](int n, const std::string& ids) {
        std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", m, "-z", z, "-i", prompt, "-t", "0",
                                      "-n", std::to_string(n), "--ids-out", ids};
        a.insert(a.end(), nodes.begin(), nodes.end());
        return a;
      };
      // -n 4: positions 0..3, all of them the prompt's.
      auto r = test::run_command(args(4, dir + "/n4.ids"));
      INFO(r.err);
      REQUIRE(r.status == 0);
      CHECK(test::read_ids(dir + "/n4.ids") == std::vector<int>(prompt_ids.begin(), prompt_ids.begin() + 5));
      CHECK_THAT(r.err, !Catch::Contains("achieved tok/s"));
      CHECK_THAT(r.err, Catch::Contains("tok/s not measured: the prompt's " + std::to_string(n_prompt) +
                                        " tokens fill all 4 positions, so no position was computed"));
      // -n = the prompt's length: position 0, then the rest of the prompt in
      // one prefill, whose last position samples: a rate over those positions.
      r = test::run_command(args(n_prompt, dir + "/nfull.ids"));
      INFO(r.err);
      REQUIRE(r.status == 0);
      CHECK(test::read_ids(dir + "/nfull.ids").size() == static_cast<size_t>(n_prompt) + 1);
      const auto at = r.err.rfind("achieved tok/s: ");
      REQUIRE(at != std::string::npos);
      CHECK(std::atof(r.err.c_str() + at + 16) > 0);
      CHECK_THAT(r.err, !Catch::Contains("not measured"));
    }
  }
}

TEST_CASE("run without -m is the demo: the built-in model, a crash and a freeze, identical output",
          "[cli][default][demo]") {
  auto r = test::run_command({"/usr/bin/env", "CELLSHARD_MODELS=/nonexistent", test::cellshard_bin(),
                              "run", "-n", "64", "-s", "7"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("built-in synthetic"));
  CHECK_THAT(r.out, Catch::Contains("identical to fault-free run: yes") &&
                        Catch::Contains("crash of placement index 1") &&
                        Catch::Contains("freeze of placement index 3") && Catch::Contains("TTFT"));
  if (!test::have_shared()) return;
  // With the real files: the text is llama2.c's, the report follows it.
  auto r2 = test::run_command({"/usr/bin/env", std::string("CELLSHARD_MODELS=") + CELLSHARD_SHARED_DIR + "/models",
                               test::cellshard_bin(), "run", "-n", "200", "-t", "0"});
  CHECK(r2.status == 0);
  CHECK_THAT(r2.err, Catch::Contains("stories260K.bin"));
  const auto want = test::read_file(test::shared_file("fixtures/greedy_bos_n200.txt"));
  CHECK(r2.out.substr(0, want.size()) == want);
  CHECK_THAT(r2.out, Catch::Contains("identical to fault-free run: yes") &&
                         Catch::Contains("detected in") && Catch::Contains("running on node"));
}

TEST_CASE("cellshard synth writes the same bytes for the same seed and they generate", "[cli][synth]") {
  const std::string dir = test::temp_dir("cli-synth");
  auto s = [&](const std::string& out, const std::string& seed) {
    return test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--dim", "48",
                              "--hidden", "96", "--layers", "3", "--heads", "6", "--kv-heads", "2",
                              "--vocab", "300", "--seq-len", "64", "-s", seed, "-o", out});
  };
  REQUIRE(s(dir + "/a.bin", "5").status == 0);
  REQUIRE(s(dir + "/b.bin", "5").status == 0);
  REQUIRE(s(dir + "/c.bin", "6").status == 0);
  const auto a = test::read_file(dir + "/a.bin");
  CHECK(a == test::read_file(dir + "/b.bin"));
  CHECK(a != test::read_file(dir + "/c.bin"));
  // A byte-level tokenizer file of the same vocabulary makes it runnable.
  auto tok = model::tokenizer::byte_level(300)->to_bytes();
  std::ofstream(dir + "/tokenizer.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(tok.data()), tok.size());
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", dir + "/a.bin", "-n", "20", "-t", "0",
                              "--ids-out", dir + "/a.ids"});
  CHECK(r.status == 0);
  const std::string ids = test::read_file(dir + "/a.ids");
  CHECK(std::count(ids.begin(), ids.end(), ',') == 20);  // BOS + 20 tokens
  auto bad = test::run_command({test::cellshard_bin(), "synth", "--config", "custom", "--dim", "50",
                                "--heads", "8", "-o", dir + "/x.bin"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.err, Catch::Contains("dim 50"));
}

TEST_CASE("cellshard run -m model.gguf: fixtures, --ctx, clamping, pipeline, quantize", "[cli][gguf]") {
  const std::string gguf = test::shared_file("models/gguf/stories260K.gguf");
  if (gguf.empty()) return;
  const std::string tok = test::shared_file("models/tok512.bin");
  const std::string dir = test::temp_dir("cli_gguf");
  const std::string want = test::shared_file("fixtures/greedy_bos_n200.ids");
  SECTION("one node and a pipeline of 3 reproduce the fixture with --ctx 512") {
    for (std::vector<std::string> extra : {std::vector<std::string>{},
                                           std::vector<std::string>{"--nodes", "3"}}) {
      std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", gguf, "-z", tok, "--ctx", "512",
                                    "-t", "0", "-n", "200", "--expect-ids", want, "-q"};
      a.insert(a.end(), extra.begin(), extra.end());
      auto r = test::run_command(a);
      INFO(r.err);
      CHECK(r.status == 0);
    }
  }
  SECTION("without --ctx -n is clamped to the file's 128 with a warning") {
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", gguf, "-z", tok, "-t", "0", "-n", "200",
                                "--ids-out", dir + "/128.ids", "-q"});
    CHECK(r.status == 0);
    CHECK_THAT(r.err, Catch::Contains("warning: -n 200 is above the context length 128; clamped to 128") &&
                          Catch::Contains("--ctx"));
    CHECK(test::read_ids(dir + "/128.ids").size() == 129);  // BOS + 128 positions
  }
  SECTION("without -z the GGUF's own tokenizer encodes the prompt as run.c with tok512") {
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", gguf, "--ctx", "512", "-t", "0", "-n", "100",
                                "-i", "Lily and Tom went to the park with their dog", "--expect-ids",
                                test::shared_file("fixtures/greedy_prompt_lily_tom_n100.ids"), "-q"});
    INFO(r.err);
    CHECK(r.status == 0);
  }
  SECTION("--matmul takes exact or ggml") {
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", gguf, "-z", tok, "--matmul", "fast"});
    CHECK(r.status != 0);
    CHECK_THAT(r.err, Catch::Contains("--matmul"));
    auto h = test::run_command({test::cellshard_bin(), "run", "--help"});
    CHECK_THAT(h.out, Catch::Contains("Default: exact") && Catch::Contains("for F32 weights, ggml otherwise"));
  }
  SECTION("quantize --type q4_0 writes a GGUF that runs; IN == OUT is refused") {
    const std::string out = dir + "/stories-q4_0.gguf";
    auto q = test::run_command({test::cellshard_bin(), "quantize", "--type", "q4_0", gguf, out});
    INFO(q.err);
    REQUIRE(q.status == 0);
    auto r = test::run_command({test::cellshard_bin(), "run", "-m", out, "-z", tok, "-t", "0", "-n", "20",
                                "--ids-out", dir + "/q4.ids", "-q"});
    INFO(r.err);
    CHECK(r.status == 0);
    CHECK(test::read_ids(dir + "/q4.ids").size() == 21);  // BOS + 20 positions
    auto same = test::run_command({test::cellshard_bin(), "quantize", out, out});
    CHECK(same.status != 0);
    CHECK_THAT(same.err, Catch::Contains("is the input file"));
    auto bin = test::run_command({test::cellshard_bin(), "quantize", "--type", "q4_0",
                                  test::shared_file("models/stories260K.bin"), dir + "/x.q4"});
    CHECK(bin.status != 0);
    CHECK_THAT(bin.err, Catch::Contains("needs a GGUF input"));
  }
  SECTION("quantize --type q4_k|q6_k: K-quants refuse 64-wide rows naming the tensor and llama.cpp's fallback") {
    auto q = test::run_command({test::cellshard_bin(), "quantize", "--type", "Q4_K", gguf, dir + "/k.gguf"});
    CHECK(q.status != 0);
    CHECK_THAT(q.err, Catch::Contains("tensor token_embd.weight has rows of 64 elements") &&
                          Catch::Contains("multiple of 256") && Catch::Contains("as q5_0 instead"));
    auto bad = test::run_command({test::cellshard_bin(), "quantize", "--type", "q5_0", gguf, dir + "/k.gguf"});
    CHECK(bad.status != 0);
    CHECK_THAT(bad.err, Catch::Contains("--type"));
  }
  SECTION("quantize --type q6_k on a 256-wide model: classifier Q6_K, matrices Q6_K, norms F32; --type bf16") {
    const std::string small = test::shared_file("models/gguf/llama2-small-f32.gguf");
    if (small.empty()) return;
    for (const char* t : {"q6_k", "bf16", "q4_k"}) {
      const std::string out = dir + "/small-" + t + ".gguf";
      auto q = test::run_command({test::cellshard_bin(), "quantize", "--type", t, small, out});
      INFO(q.err);
      REQUIRE(q.status == 0);
      auto i = test::run_command({test::cellshard_bin(), "inspect", out});
      REQUIRE(i.status == 0);
      const std::string T = std::string(t) == "q6_k" ? "Q6_K" : std::string(t) == "bf16" ? "BF16" : "Q4_K";
      CHECK_THAT(i.out, Catch::Contains("blk.0.attn_q.weight          " + T) &&
                            Catch::Contains("blk.0.attn_norm.weight       F32") &&
                            Catch::Contains(std::string("output.weight                ") +
                                            (T == "BF16" ? "BF16" : "Q6_K")));
      auto r = test::run_command({test::cellshard_bin(), "run", "-m", out, "-t", "0", "-n", "12", "--ignore-eos",
                                  "--ids-out", dir + "/k.ids", "-q"});
      INFO(r.err);
      CHECK(r.status == 0);
      CHECK(test::read_ids(dir + "/k.ids").size() == 13);
    }
  }
}

TEST_CASE("run gives the same ids for every --batch-size, and bench prefill checks its logits",
          "[cli][prefill]") {
  if (!test::have_shared()) return;
  // A long prompt over a model whose matrices are split over 2 threads:
  // chunks of 1 (one position at a time), 5 (a partial last chunk) and 32.
  const std::string dir = test::temp_dir("cli-prefill");
  const std::string m = dir + "/s256.bin";
  auto s = test::run_command({test::cellshard_bin(), "synth", "--dim", "256", "--hidden", "688", "--layers", "2",
                              "--heads", "8", "--kv-heads", "4", "--vocab", "512", "--seq-len", "128", "-s", "3",
                              "-o", m});
  REQUIRE(s.status == 0);
  const std::string prompt =
      "Once upon a time there was a little girl named Lily who liked to play in the park with her dog. "
      "They ran and jumped in the sun all day long";
  // More than 32 prompt tokens, so that chunks of 32 split it too.
  auto t = test::run_command({test::cellshard_bin(), "tokenize", "-m", m, "-z", test::shared_file("models/tok512.bin"),
                              "-i", prompt});
  REQUIRE(t.status == 0);
  CHECK(std::count(t.out.begin(), t.out.end(), ' ') >= 33);
  for (const char* weights : {"f32", "q4_0"}) {
    std::vector<std::string> ids;
    for (const char* batch : {"1", "5", "32"}) {
      const std::string out = dir + "/" + weights + "." + batch + ".ids";
      auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", test::shared_file("models/tok512.bin"),
                                  "-n", "80", "-t", "0", "-i", prompt, "--weights", weights, "--threads", "2",
                                  "--batch-size", batch, "-q", "--ids-out", out});
      INFO(r.err);
      REQUIRE(r.status == 0);
      ids.push_back(test::read_file(out));
    }
    INFO(weights);
    CHECK(std::count(ids[0].begin(), ids[0].end(), ',') == 80);  // BOS + 80 positions
    CHECK(ids[0] == ids[1]);
    CHECK(ids[0] == ids[2]);
  }
  auto b = test::run_command({test::cellshard_bin(), "bench", "prefill", "-m", m, "--positions", "40",
                              "--batch-size", "7", "--repeat", "1", "--weights", "f32,q8_0"});
  INFO(b.err);
  CHECK(b.status == 0);
  CHECK_THAT(b.out, Catch::Contains("identical_logits=yes"));
  CHECK_THAT(b.out, !Catch::Contains("identical_logits=NO"));
}
