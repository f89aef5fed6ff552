// Bad inputs of issue #21 through the binary, as a user types them: each one
// exits with its status (2 usage, 1 error) and a message naming the flag or
// file and what was expected. One table row per input.
#include "model/checkpoint.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>

using namespace cellshard;

namespace {
bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

struct bad_input {
  const char* name;
  std::vector<std::string> args;  // after the binary; {M} = the model, {Z} = its tokenizer, {D} = a temp dir
  int status;
  std::vector<std::string> says;  // substrings of stderr
};
}  // namespace

TEST_CASE("every bad input of issue #21 exits with a message naming what and what was expected",
          "[cli][errors][validation]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("bad-inputs");
  const std::string m = test::shared_file("models/stories260K.bin");
  const std::string z = test::shared_file("models/tok512.bin");
  // A byte-swapped copy of the model: every 4-byte word reversed.
  const std::string swapped = dir + "/swapped.bin";
  {
    std::string b = test::read_file(m);
    for (size_t i = 0; i + 4 <= b.size(); i += 4) {
      std::swap(b[i], b[i + 3]);
      std::swap(b[i + 1], b[i + 2]);
    }
    std::ofstream(swapped, std::ios::binary) << b;
  }
  const std::string copy = dir + "/copy.bin";
  std::ofstream(copy, std::ios::binary) << test::read_file(m);
  // The "flipped weight bytes": one bit of a weight in the middle of
  // the file, the header intact, so only the digest can tell.
  const std::string flipped = dir + "/flipped.bin";
  {
    std::string b = test::read_file(m);
    b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 0x01);
    std::ofstream(flipped, std::ios::binary) << b;
  }
  // An empty download named .gguf, and a truncated one (16 bytes of text).
  std::ofstream(dir + "/empty.gguf", std::ios::binary).flush();
  std::ofstream(dir + "/text.GGUF", std::ios::binary) << "<html>not found\n";
  // A GGUF mixture of experts without tokenizer keys, as synth --experts writes it.
  REQUIRE(test::run_command({test::cellshard_bin(), "synth", "--experts", "2", "-o", dir + "/moe-notok.gguf"}).status ==
          0);
  const std::string vocab_only = test::shared_file("models/gguf/ggml-vocab-llama-spm.gguf");
  const std::vector<bad_input> table = {
      {"-t nan", {"run", "-m", "{M}", "-z", "{Z}", "-t", "nan"}, 2,
       {"-t/--temperature: got nan", "expected a finite number"}},
      {"-t inf", {"run", "-m", "{M}", "-z", "{Z}", "-t", "inf"}, 2, {"-t/--temperature: got inf", "finite"}},
      {"-p nan", {"run", "-m", "{M}", "-z", "{Z}", "-p", "nan"}, 2, {"-p/--topp: got nan", "expected a finite number"}},
      {"--spares -1", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--spares", "-1"}, 2,
       {"--spares: got -1", "expected 0 or more"}},
      {"--nodes 0", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "0"}, 2, {"--nodes: got 0", "expected at least 1"}},
      {"--batch 0", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--batch", "0"}, 2,
       {"--batch: got 0", "expected 1..4096"}},
      {"--batch -2", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--batch", "-2"}, 2,
       {"--batch: got -2", "expected 1..4096"}},
      {"a fault step beyond -n", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "-n", "20", "--fault",
                                  "crash:node=1:step=50"}, 2,
       {"crash:node=1:step=50", "step 50 is beyond the run's last position 19", "never fire",
        "expected a step below 20"}},
      {"--topology hybrid without PxT", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "4", "--topology", "hybrid"}, 2,
       {"--topology 'hybrid'", "hybrid needs P and T"}},
      // A topology that parses but that this model or these nodes cannot take, and a
      // fault for a placement index without a shard: usage errors (2) in run, as
      // inspect and plan report the same topologies (they exited 1 in run).
      {"--topology wider than the KV heads", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "8", "--topology",
                                              "tensor:8"}, 2,
       {"tensor group of 8 exceeds the model's 4 KV heads"}},
      {"--topology needing more nodes than --nodes", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--topology",
                                                      "hybrid:2x2"}, 2,
       {"hybrid:2x2 needs 4 nodes, 2 available"}},
      {"inspect --topology wider than the KV heads", {"inspect", "{M}", "--nodes", "8", "--topology", "tensor:8"}, 2,
       {"tensor group of 8 exceeds the model's 4 KV heads"}},
      {"a fault for a placement index without a shard", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "-n", "8",
                                                         "--fault", "crash:node=5:step=2"}, 2,
       {"placement index 5 holds no shard", "indices 0..1"}},
      {"--journal in a folder that does not exist",
       {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "-n", "8", "--journal", "/nonexistent/dir/j"}, 1,
       {"--journal /nonexistent/dir/j", "folder /nonexistent/dir does not exist"}},
      {"--expect-digest not hex", {"run", "-m", "{M}", "-z", "{Z}", "--expect-digest", "xyz"}, 2,
       {"--expect-digest 'xyz'", "expected a 64-bit hex digest"}},
      {"--expect-digest of another file", {"run", "-m", "{M}", "-z", "{Z}", "-n", "4", "--expect-digest",
                                           "0x0000000000000001"}, 1,
       {"stories260K.bin: digest 0xa63dd90f31c958a4, expected 0x0000000000000001", "corrupt or another version"}},
      {"a flipped weight bit under --expect-digest of the original",
       {"run", "-m", "{D}/flipped.bin", "-z", "{Z}", "-n", "4", "--expect-digest", "0xa63dd90f31c958a4"}, 1,
       {"flipped.bin: digest 0x", "expected 0xa63dd90f31c958a4", "corrupt or another version"}},
      // chaos takes the same sampling and node flags as run, and refuses the same values.
      {"chaos -t nan", {"chaos", "-m", "{M}", "-z", "{Z}", "-t", "nan"}, 2,
       {"-t/--temperature: got nan", "expected a finite number"}},
      {"chaos -p inf", {"chaos", "-m", "{M}", "-z", "{Z}", "-p", "inf"}, 2,
       {"-p/--topp: got inf", "expected a finite number"}},
      {"chaos --spares -1", {"chaos", "-m", "{M}", "-z", "{Z}", "--spares", "-1"}, 2,
       {"--spares: got -1", "expected 0 or more"}},
      {"chaos --nodes 0", {"chaos", "-m", "{M}", "-z", "{Z}", "--nodes", "0"}, 2,
       {"--nodes: got 0", "expected at least 1"}},
      {"chaos --runs 0", {"chaos", "-m", "{M}", "-z", "{Z}", "--runs", "0"}, 2, {"--runs: got 0", "expected at least 1"}},
      {"chaos --faults-per-run -1", {"chaos", "-m", "{M}", "-z", "{Z}", "--faults-per-run", "-1"}, 2,
       {"--faults-per-run: got -1", "expected 0 or more"}},
      {"quantize X X", {"quantize", "{D}/copy.bin", "{D}/copy.bin"}, 2,
       {"is the input file", "expected another path"}},
      {"quantize X ./X", {"quantize", "{D}/copy.bin", "{D}/./copy.bin"}, 2, {"is the input file"}},
      {"synth beyond the size limit", {"synth", "--config", "custom", "--dim", "16000000", "--heads", "1",
                                       "--kv-heads", "1", "-o", "{D}/huge.bin"}, 2,
       {"synth: dim 16000000", "TiB", "expected at most 64.0 GiB", "--max-size"}},
      {"synth beyond the free disk", {"synth", "--config", "custom", "--dim", "4096", "--hidden", "16384",
                                      "--heads", "32", "--kv-heads", "32", "--layers", "4000",
                                      "--max-size", "100000000000000", "-o", "{D}/big.bin"}, 1,
       {"big.bin would be", "TiB", "free; expected a smaller shape or another folder"}},
      // A shape flag given as 0 used to be taken for "not given": --dim 0 wrote dim 64.
      {"synth --dim 0", {"synth", "--config", "custom", "--dim", "0", "-o", "{D}/dim0.bin"}, 2,
       {"synth: --dim: got 0", "expected a positive number"}},
      {"synth --layers -3", {"synth", "--layers", "-3", "-o", "{D}/layers-3.bin"}, 2,
       {"synth: --layers: got -3", "expected a positive number"}},
      {"synth --experts 0", {"synth", "--experts", "0", "-o", "{D}/experts0.gguf"}, 2,
       {"synth: --experts: got 0", "expected a positive number"}},
      {"synth --experts-used 0", {"synth", "--experts", "4", "--experts-used", "0", "-o", "{D}/used0.gguf"}, 2,
       {"synth: --experts-used: got 0", "expected a positive number"}},
      // inspect's --nodes: CLI11's PositiveNumber printed "not in range 0.000000 to 1.8e308", and
      // 10^8 nodes ran for minutes; --topology was named twice.
      {"inspect --nodes 0", {"inspect", "{M}", "--nodes", "0"}, 2, {"--nodes: got 0", "expected 1 to 100000 nodes"}},
      {"inspect --nodes 100000000", {"inspect", "{M}", "--nodes", "100000000"}, 2,
       {"--nodes: got 100000000", "expected 1 to 100000 nodes"}},
      {"inspect --topology bogus", {"inspect", "{M}", "--topology", "bogus"}, 2,
       {"cellshard: error: --topology 'bogus': expected pipeline"}},
      // Files a user finds beside the models: each error says what the file is and what to pass.
      {"run -m a vocabulary-only GGUF", {"run", "-m", vocab_only, "-n", "4"}, 1,
       {"ggml-vocab-llama-spm.gguf: a vocabulary-only GGUF (tokenizer keys, no tensors)", "no weights to run"}},
      {"run -m a GGUF without a tokenizer and no -z", {"run", "-m", "{D}/moe-notok.gguf", "-n", "4"}, 1,
       {"moe-notok.gguf: missing key tokenizer.ggml.model", "-z FILE gives a tokenizer of the same vocabulary"}},
      {"tokenize -m a .bin whose default tokenizer.bin is another vocabulary", {"tokenize", "-m", "{M}", "-i", "Hello"},
       1, {"tokenizer.bin has 32000 tokens but model", "stories260K.bin has vocab_size 512", "-z"}},
      {"tokenize -m a GGUF -z a tokenizer of another vocabulary",
       {"tokenize", "-m", test::shared_file("models/gguf/stories260K.gguf"), "-z", test::shared_file("models/tokenizer.bin"),
        "-i", "hi"},
       1, {"tokenizer.bin has 32000 tokens but model", "stories260K.gguf has vocab_size 512"}},
      // Sizes that would not fail but run for minutes and take the machine's memory.
      {"--threads 100000", {"run", "-m", "{M}", "-z", "{Z}", "-n", "4", "--threads", "100000"}, 2,
       {"--threads: got 100000", "expected 0 (the CPUs this process may use) to 1024"}},
      {"--spares 100000000", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--spares", "100000000"}, 2,
       {"--nodes 2 + --spares 100000000", "expected at most 100000 in-process nodes"}},
      {"--nodes 1000000", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "1000000"}, 2,
       {"--nodes 1000000 + --spares 0", "expected at most 100000 in-process nodes"}},
      {"--batch 100000", {"run", "-m", "{M}", "-z", "{Z}", "--nodes", "2", "--batch", "100000"}, 2,
       {"--batch: got 100000", "expected 1..4096 concurrent requests"}},
      {"node --threads 100000", {"node", "--listen", "127.0.0.1:0", "--threads", "100000"}, 2,
       {"--threads: got 100000", "expected 0 (the CPUs this process may use) to 1024"}},
      // A file named .gguf that is not one: GGUF's error, not "tokenizer.bin is missing".
      {"run -m empty.gguf", {"run", "-m", "{D}/empty.gguf", "-n", "4"}, 1,
       {"empty.gguf: bad magic: expected \"GGUF\" (47 47 55 46) at offset 0, found only 0 bytes"}},
      {"tokenize -m empty.gguf", {"tokenize", "-m", "{D}/empty.gguf", "-i", "hi"}, 1,
       {"empty.gguf: bad magic: expected \"GGUF\"", "found only 0 bytes"}},
      {"inspect empty.gguf", {"inspect", "{D}/empty.gguf"}, 1, {"empty.gguf: bad magic", "found only 0 bytes"}},
      {"run -m text.GGUF", {"run", "-m", "{D}/text.GGUF", "-n", "4"}, 1,
       {"text.GGUF: bad magic: expected \"GGUF\" (47 47 55 46) at offset 0, found 3c 68 74 6d"}},
      {"a byte-swapped llama2.c file", {"run", "-m", "{D}/swapped.bin", "-z", "{Z}", "-n", "4"}, 1,
       {"swapped.bin: byte-swapped llama2.c checkpoint", "dim 64, hidden 172, layers 5",
        "expected the little-endian layout"}},
  };
  for (const auto& row : table) {
    DYNAMIC_SECTION(row.name) {
      std::vector<std::string> args = {test::cellshard_bin()};
      for (auto a : row.args) {
        for (auto [key, val] : {std::pair<std::string, std::string>{"{M}", m}, {"{Z}", z}, {"{D}", dir}}) {
          const auto at = a.find(key);
          if (at != std::string::npos) a.replace(at, key.size(), val);
        }
        args.push_back(a);
      }
      auto r = test::run_command(args);
      INFO(r.err);
      CHECK(r.status == row.status);
      for (const auto& s : row.says) CHECK_THAT(r.err, Catch::Contains(s));
    }
  }
  // Refused before writing: no partial file left behind, and the input intact.
  CHECK(!exists(dir + "/huge.bin"));
  CHECK(!exists(dir + "/big.bin"));
  for (const char* f : {"/dim0.bin", "/layers-3.bin", "/experts0.gguf", "/used0.gguf"}) CHECK(!exists(dir + f));
  CHECK(test::read_file(copy) == test::read_file(m));
}

TEST_CASE("the format is told by the magic: a llama2.c checkpoint named .gguf loads as one",
          "[cli][validation]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("named-gguf");
  const std::string named = dir + "/stories260K.gguf";
  std::ofstream(named, std::ios::binary) << test::read_file(test::shared_file("models/stories260K.bin"));
  auto f = model::model_file::open(named);
  INFO((f ? std::string() : f.message()));
  REQUIRE(f);
  CHECK((*f)->cfg().dim == 64);
  CHECK((*f)->cfg().n_layers == 5);
  // run finds its tokenizer.bin beside it, as for any llama2.c file.
  std::ofstream(dir + "/tokenizer.bin", std::ios::binary) << test::read_file(test::shared_file("models/tok512.bin"));
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", named, "-n", "8", "-t", "0", "-q"});
  INFO(r.err);
  CHECK(r.status == 0);
  CHECK(model::gguf::file::named_gguf("a/b.GgUf"));
  CHECK(!model::gguf::file::named_gguf("a/b.gguf.bin"));
  CHECK(!model::gguf::file::named_gguf("gguf"));
}

TEST_CASE("a run given its file's own digest with --expect-digest runs", "[cli][validation]") {
  if (!test::have_shared()) return;
  const std::string m = test::shared_file("models/stories260K.bin");
  auto f = model::model_file::open(m);
  REQUIRE(f);
  const std::string d = model::format_digest((*f)->digest());
  CHECK(d == "0xa63dd90f31c958a4");  // the digest docs and the fingerprint tests name
  auto r = test::run_command({test::cellshard_bin(), "run", "-m", m, "-z", test::shared_file("models/tok512.bin"),
                              "-n", "8", "-t", "0", "-q", "--expect-digest", d, "--ids-out",
                              test::temp_dir("expect-digest") + "/ids"});
  INFO(r.err);
  CHECK(r.status == 0);
}

TEST_CASE("a header whose size overflows 64 bits is refused, not wrapped", "[model][validation]") {
  // dim 2^24 - 2 with 2^24 - 1 layers: dim^2 x layers is ~2^72 floats.
  const int32_t raw[7] = {(1 << 24) - 4, 1 << 20, (1 << 24) - 1, 2, 2, 512, 256};
  auto c = model::model_file::parse_fields(raw, "big.bin");
  REQUIRE(!c);
  CHECK_THAT(c.message(), Catch::Contains("big.bin: corrupt header") && Catch::Contains("TiB") &&
                              Catch::Contains("expected at most 2^46 bytes"));
}

TEST_CASE("a vocabulary without byte pieces encodes unknown bytes as <unk>, inside the vocabulary",
          "[model][tokenizer][validation]") {
  // Found by fuzz/tokenizer.cpp (fuzz/regressions/tokenizer/): the byte
  // fallback id byte + 3 pointed past a small vocabulary.
  std::vector<uint8_t> b = {5, 0, 0, 0};  // max_token_length 5
  auto add = [&](const std::string& piece, float score) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(&score);
    b.insert(b.end(), s, s + 4);
    const int32_t n = static_cast<int32_t>(piece.size());
    const uint8_t* l = reinterpret_cast<const uint8_t*>(&n);
    b.insert(b.end(), l, l + 4);
    b.insert(b.end(), piece.begin(), piece.end());
  };
  for (const char* p : {"<unk>", "<s>", "</s>", " ", "a", "b", "ab"}) add(p, 0.0f);
  auto t = model::tokenizer::from_bytes(b, "tiny.tok");
  REQUIRE(t);
  const auto ids = (*t)->encode("ab\xff z", true, true);
  CHECK(ids == std::vector<int>{1, 3, 6, 0, 3, 0, 2});  // BOS, " ", "ab", <unk>, " ", <unk>, EOS
}

TEST_CASE("a GGUF string longer than the file is refused before it is allocated", "[model][gguf][validation]") {
  // Found by fuzz/gguf.cpp (fuzz/regressions/gguf/): a 3-byte key claiming
  // 512 MiB made the reader allocate and clear 512 MiB first.
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  u64(0);          // tensors
  u64(1);          // metadata keys
  u64(1ull << 29); // the key's length
  b.insert(b.end(), {'a', 'b', 'c'});
  auto f = model::gguf::file::from_bytes(b, "short.gguf");
  REQUIRE(!f);
  CHECK_THAT(f.message(), Catch::Contains("short.gguf: key of metadata entry 0 has length 536870912") &&
                              Catch::Contains("but only 3 bytes follow"));
}

TEST_CASE("run --weights on a file of quantized matrices says it is ignored and --json names what ran",
          "[cli][validation]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("weights-ignored");
  const std::string q8 = test::shared_file("models/gguf/stories260K-q8_0.gguf");
  const std::string f32 = test::shared_file("models/gguf/stories260K.gguf");
  auto run = [&](const std::string& m, const std::vector<std::string>& extra, const std::string& json) {
    std::vector<std::string> a = {test::cellshard_bin(), "run", "-m", m, "-i", "Once upon a time", "-n", "12",
                                  "-t", "0", "-q", "--json", json};
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = test::run_command(a);
    INFO(r.err);
    REQUIRE(r.status == 0);
    return std::make_pair(r.err, nlohmann::json::parse(test::read_file(json)));
  };
  // A Q8_0 GGUF runs its matrices as stored: the same ids and memory with and without --weights q4_0.
  auto [err0, plain] = run(q8, {}, dir + "/plain.json");
  auto [err1, asked] = run(q8, {"--weights", "q4_0"}, dir + "/q4.json");
  CHECK_THAT(err0, !Catch::Contains("--weights"));
  CHECK_THAT(err1, Catch::Contains("note: --weights q4_0 is ignored: " + q8 + " stores quantized matrices"));
  CHECK(plain["weights"] == "gguf");
  CHECK(asked["weights"] == "gguf");  // was "q4_0"
  CHECK(asked["ids"] == plain["ids"]);
  CHECK(asked["nodes"][0]["memory_bytes"] == plain["nodes"][0]["memory_bytes"]);
  // An F32 GGUF is quantized at load time as asked: fewer bytes, no note.
  auto [err2, f] = run(f32, {}, dir + "/f32.json");
  auto [err3, fq] = run(f32, {"--weights", "q4_0"}, dir + "/f32q4.json");
  CHECK_THAT(err3, !Catch::Contains("ignored"));
  CHECK(f["weights"] == "f32");
  CHECK(fq["weights"] == "q4_0");
  CHECK(fq["nodes"][0]["memory_bytes"].get<uint64_t>() < f["nodes"][0]["memory_bytes"].get<uint64_t>());
}

TEST_CASE("quantize of a GGUF whose matrices are already quantized says the loss compounds", "[cli][validation]") {
  if (!test::have_shared()) return;
  const std::string dir = test::temp_dir("requantize");
  auto quantize = [&](const std::string& in, const char* type) {
    auto r = test::run_command({test::cellshard_bin(), "quantize", "--type", type, test::shared_file(in),
                                dir + "/out-" + type + ".gguf"});
    INFO(r.err);
    CHECK(r.status == 0);  // it still writes the file, as before
    return r.err;
  };
  CHECK_THAT(quantize("models/gguf/stories260K-q8_0.gguf", "q4_0"),
             Catch::Contains("stories260K-q8_0.gguf stores q8_0 matrices: they are dequantized and quantized again "
                             "to q4_0") &&
                 Catch::Contains("--allow-requantize"));
  // F16 and F32 sources are the usual ones: no note.
  CHECK_THAT(quantize("models/gguf/stories260K-f16.gguf", "q8_0"), !Catch::Contains("note:"));
  CHECK_THAT(quantize("models/gguf/stories260K.gguf", "f16"), !Catch::Contains("note:"));
}
