// `cellshard tokenize`, `inspect`, and run's --ignore-eos, --logits-out and
// --chat through the binary, with their bad inputs.
#include "model/checkpoint.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

using namespace cellshard;

namespace {
std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}
std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  while (!s.empty() && s.front() == ' ') s.erase(0, 1);
  return s;
}
std::vector<float> read_f32(const std::string& path) {
  const std::string b = test::read_file(path);
  std::vector<float> v(b.size() / 4);
  for (size_t i = 0; i < v.size(); ++i) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<unsigned char>(b[4 * i + k])) << (8 * k);
    std::memcpy(&v[i], &u, 4);
  }
  return v;
}
}  // namespace

TEST_CASE("cellshard tokenize prints llama.cpp's ids, with and without BOS, and decodes", "[cli][tokenize]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  for (auto [vocab, bos] : {std::pair<const char*, const char*>{"ggml-vocab-llama-spm.gguf", "1"},
                            {"ggml-vocab-llama-bpe.gguf", "128000"}}) {
    const std::string m = test::shared_file(std::string("models/gguf/") + vocab);
    const auto want = lines_of(m + ".out");
    REQUIRE(want.size() > 12);
    // Case 11 of llama.cpp's inputs is "Hello world".
    auto r = test::run_command({bin, "tokenize", "-m", m, "-i", "Hello world"});
    INFO(vocab << ": " << r.err);
    CHECK(r.status == 0);
    CHECK(r.out == std::string(bos) + " " + trim(want[11]) + "\n");
    r = test::run_command({bin, "tokenize", "-m", m, "-i", "Hello world", "--no-bos"});
    CHECK(r.out == trim(want[11]) + "\n");
    r = test::run_command({bin, "tokenize", "-m", m, "--decode", std::string(bos) + " " + trim(want[11])});
    CHECK(r.status == 0);
    CHECK(r.out == "Hello world\n");
  }
  // A llama2.c model with -z: run.c's encoding.
  auto r = test::run_command({bin, "tokenize", "-m", test::shared_file("models/stories260K.bin"), "-z",
                              test::shared_file("models/tok512.bin"), "-i", "Once upon a time"});
  CHECK(r.status == 0);
  CHECK(r.out == "1 403 407 261 378\n");
  r = test::run_command({bin, "tokenize", "-z", test::shared_file("models/tok512.bin"), "--decode", "1,403,407,261,378"});
  CHECK(r.out == "Once upon a time\n");
}

TEST_CASE("cellshard tokenize: bad inputs", "[cli][tokenize][errors]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  const std::string m = test::shared_file("models/gguf/ggml-vocab-llama-spm.gguf");
  auto r = test::run_command({bin, "tokenize", "-m", m, "--decode", "1 x 3"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("--decode: entry 1 is 'x', expected a token id in 0..31999"));
  r = test::run_command({bin, "tokenize", "-m", m, "--decode", "32000"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("entry 0 is '32000'"));
  r = test::run_command({bin, "tokenize", "-m", m});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("give either -i TEXT"));
  r = test::run_command({bin, "tokenize", "-m", "/nonexistent/x.gguf", "-i", "a"});
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("/nonexistent"));
}

TEST_CASE("cellshard inspect: .bin, CSQ8 and vocabulary-only GGUF, digest and memory fit", "[cli][inspect]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  const std::string dir = test::temp_dir("inspect");
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string bytes = test::read_file(m);
  const std::string digest = model::format_digest(XXH64(bytes.data(), bytes.size(), 0));
  auto r = test::run_command({bin, "inspect", m, "-z", test::shared_file("models/tok512.bin"), "--json",
                              dir + "/a.json"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("format: llama2.c version 0 (f32)") && Catch::Contains("digest: " + digest) &&
                        Catch::Contains("dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512") &&
                        Catch::Contains("tokenizer: llama2.c, 512 tokens") && Catch::Contains("fits: yes"));
  auto j = nlohmann::json::parse(test::read_file(dir + "/a.json"));
  CHECK(j["digest"] == digest);
  CHECK(j["config"]["n_layers"] == 5);
  CHECK(j["tensors"].size() == 1 + 5 * 9 + 1);
  uint64_t total = 0;
  for (const auto& t : j["tensors"]) total += t["bytes"].get<uint64_t>();
  // Every weight of the file but its 7-int header and the unused RoPE tables (512 x 4 floats x 2).
  CHECK(total == bytes.size() - 28 - 2 * 512 * 4 * 4);
  // Five pipeline stages on ps3 nodes with a budget too small for stage 0's embedding.
  r = test::run_command({bin, "inspect", m, "--nodes", "5", "--profile", "ps3", "--memory", "64KiB", "--json",
                         dir + "/b.json"});
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("fits: no") && Catch::Contains("DOES NOT FIT"));
  j = nlohmann::json::parse(test::read_file(dir + "/b.json"));
  CHECK(j["placement"]["per_node"].size() == 5);
  CHECK(j["placement"]["fits"] == false);
  // CSQ8 (quantize writes it).
  const std::string q = dir + "/q8.bin";
  r = test::run_command({bin, "quantize", m, q});
  REQUIRE(r.status == 0);
  r = test::run_command({bin, "inspect", q, "--json", dir + "/c.json"});
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("format: CSQ8") && Catch::Contains("Q8_0"));
  // A vocabulary-only GGUF: tokenizer, no shapes, no placement.
  const std::string v = test::shared_file("models/gguf/ggml-vocab-llama-bpe.gguf");
  r = test::run_command({bin, "inspect", v, "--json", dir + "/d.json"});
  REQUIRE(r.status == 0);
  CHECK_THAT(r.out, Catch::Contains("format: GGUF v3") &&
                        Catch::Contains("tokenizer: gpt2 (byte-level BPE, pre llama-bpe), 128256 tokens, BOS 128000 (added)") &&
                        Catch::Contains("shape: none"));
  j = nlohmann::json::parse(test::read_file(dir + "/d.json"));
  CHECK(j["placement"].is_null());
  const std::string vb = test::read_file(v);
  CHECK(j["digest"] == model::format_digest(XXH64(vb.data(), vb.size(), 0)));
  r = test::run_command({bin, "inspect", "/nonexistent.bin"});
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("/nonexistent.bin"));
}

TEST_CASE("run --logits-out: one row per position, greedy ids are the rows' argmax, same on a pipeline",
          "[cli][logits]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  const std::string dir = test::temp_dir("logits");
  const std::vector<std::string> base = {bin, "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                                         test::shared_file("models/tok512.bin"), "-i", "Once upon a time", "-n",
                                         "12", "-t", "0", "--kernels", "reference", "-q"};
  auto one = base;
  one.insert(one.end(), {"--logits-out", dir + "/one.f32", "--ids-out", dir + "/one.ids"});
  auto r = test::run_command(one);
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto ids = test::read_ids(dir + "/one.ids");
  REQUIRE(ids.size() == 13);
  const auto l = read_f32(dir + "/one.f32");
  REQUIRE(l.size() == 12u * 512);
  for (int p = 4; p < 12; ++p) {  // sampled positions: the next id is the row's first maximum
    const float* row = &l[p * 512];
    CHECK(std::max_element(row, row + 512) - row == ids[p + 1]);
  }
  auto pipe = base;
  pipe.insert(pipe.end(), {"--nodes", "3", "--logits-out", dir + "/pipe.f32", "--ids-out", dir + "/pipe.ids"});
  r = test::run_command(pipe);
  REQUIRE(r.status == 0);
  CHECK(test::read_ids(dir + "/pipe.ids") == ids);
  const auto lp = read_f32(dir + "/pipe.f32");
  REQUIRE(lp.size() == l.size());
  double worst = 0;
  for (size_t i = 0; i < l.size(); ++i) worst = std::max(worst, std::abs(double(l[i]) - lp[i]));
  CHECK(worst <= 1e-4);
  auto bad = base;
  bad.insert(bad.end(), {"--logits-out", "/nonexistent/dir/x.f32"});
  r = test::run_command(bad);
  CHECK(r.status == 1);
  CHECK_THAT(r.err, Catch::Contains("/nonexistent/dir/x.f32: cannot write"));
}

TEST_CASE("run --chat: messages joined for a model without a template, --chat-format checked", "[cli][chat]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  const std::string dir = test::temp_dir("chat");
  const std::string m = test::shared_file("models/stories260K.bin"), z = test::shared_file("models/tok512.bin");
  auto r = test::run_command({bin, "run", "-m", m, "-z", z, "--chat", "--system", "Lily was happy.", "-i",
                              "Once upon a time", "-n", "20", "-t", "0", "-q", "--ids-out", dir + "/chat.ids"});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("chat format: none"));
  auto t = test::run_command({bin, "tokenize", "-m", m, "-z", z, "-i", "Lily was happy.\nOnce upon a time"});
  std::vector<int> want;
  std::istringstream in(t.out);
  int v;
  while (in >> v) want.push_back(v);
  const auto got = test::read_ids(dir + "/chat.ids");
  REQUIRE(got.size() >= want.size());
  CHECK(std::vector<int>(got.begin(), got.begin() + want.size()) == want);
  r = test::run_command({bin, "run", "-m", m, "-z", z, "--chat", "--chat-format", "vicuna", "-i", "x", "-n", "4"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("--chat-format: chat format 'vicuna' is not known"));
  r = test::run_command({bin, "run", "-m", m, "-z", z, "--system", "x", "-i", "x", "-n", "4"});
  CHECK(r.status == 2);
  CHECK_THAT(r.err, Catch::Contains("need --chat"));
}

TEST_CASE("run stops when a llama2.c model samples BOS, --ignore-eos runs exactly -n positions, on a cluster too",
          "[cli][stop]") {
  if (!test::have_shared()) return;
  const auto bin = test::cellshard_bin();
  const std::string dir = test::temp_dir("stop");
  // Seed 7 at temperature 1 samples BOS at position 164 (the story ends).
  const std::vector<std::string> base = {bin, "run", "-m", test::shared_file("models/stories260K.bin"), "-z",
                                         test::shared_file("models/tok512.bin"), "-t", "1", "-s", "7", "-n", "512",
                                         "-q"};
  auto stop = base;
  stop.insert(stop.end(), {"--ids-out", dir + "/stop.ids"});
  auto r = test::run_command(stop);
  REQUIRE(r.status == 0);
  const auto stopped = test::read_ids(dir + "/stop.ids");
  REQUIRE(stopped.size() < 513);
  CHECK(stopped.back() == 1);
  for (const auto& extra : {std::vector<std::string>{}, std::vector<std::string>{"--nodes", "2"}}) {
    auto all = base;
    all.insert(all.end(), {"--ignore-eos", "--ids-out", dir + "/all.ids"});
    all.insert(all.end(), extra.begin(), extra.end());
    r = test::run_command(all);
    INFO(r.err);
    REQUIRE(r.status == 0);
    const auto ids = test::read_ids(dir + "/all.ids");
    CHECK(ids.size() == 513);
    CHECK(std::vector<int>(ids.begin(), ids.begin() + stopped.size()) == stopped);
  }
}
