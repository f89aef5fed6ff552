// GGUF tokenizers against llama.cpp's own expectations: the .inp/.out cases of
// ggml-vocab-llama-spm.gguf (SentencePiece) and ggml-vocab-llama-bpe.gguf
// (Llama 3 byte-level BPE), llama-2-tiny-random.gguf's "Hello", the
// stories260K.gguf vocabulary against tok512.bin, special tokens, decoding,
// stop ids and bad inputs.
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

using namespace cellshard;

namespace {

std::shared_ptr<const model::tokenizer> open_tok(const std::string& rel) {
  auto t = model::tokenizer::open(test::shared_file(rel));
  INFO(rel << ": " << (t ? std::string() : t.message()));
  REQUIRE(t.ok());
  return *t;
}

std::vector<std::string> split_cases(const std::string& text) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(sep, pos);
    if (hit == std::string::npos) {
      out.push_back(text.substr(pos));
      break;
    }
    out.push_back(text.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  return out;
}

std::vector<int> parse_line(const std::string& line) {
  std::istringstream in(line);
  std::vector<int> ids;
  int v;
  while (in >> v) ids.push_back(v);
  return ids;
}

/// Every case of llama.cpp's test-tokenizer-0 for `vocab` (add_special and
/// parse_special off, as that test tokenizes).
void check_vocab_cases(const std::string& vocab) {
  auto tok = open_tok("models/gguf/" + vocab);
  const auto inputs = split_cases(test::read_file(test::shared_file("models/gguf/" + vocab + ".inp")));
  std::ifstream out(test::shared_file("models/gguf/" + vocab + ".out"));
  REQUIRE(out.good());
  std::string line;
  size_t n = 0;
  while (std::getline(out, line)) {
    REQUIRE(n < inputs.size());
    INFO(vocab << " case " << n << ": '" << inputs[n] << "'");
    CHECK(tok->encode(inputs[n], false, false, false) == parse_line(line));
    ++n;
  }
  CHECK(n == 46);
}

}  // namespace

TEST_CASE("SentencePiece GGUF vocabulary passes llama.cpp's cases", "[tokenizer][gguf]") {
  if (!test::have_shared()) return;
  check_vocab_cases("ggml-vocab-llama-spm.gguf");
}

TEST_CASE("Llama 3 BPE GGUF vocabulary passes llama.cpp's cases", "[tokenizer][gguf]") {
  if (!test::have_shared()) return;
  check_vocab_cases("ggml-vocab-llama-bpe.gguf");
}

TEST_CASE("GGUF SentencePiece: kinds, BOS, special tokens, decode", "[tokenizer][gguf]") {
  if (!test::have_shared()) return;
  auto t = open_tok("models/gguf/llama-2-tiny-random.gguf");
  CHECK(t->kind() == model::tokenizer_kind::spm);
  CHECK(t->vocab_size() == 32000);
  CHECK(t->adds_bos());
  CHECK(t->encode("Hello", true, false) == std::vector<int>{1, 15043});
  CHECK(t->encode("", true, false) == std::vector<int>{1});
  CHECK(t->encode("", false, false).empty());
  // "<s>" written in the text is BOS, whole, when specials are parsed; the
  // text after it gets the space prefix again.
  CHECK(t->encode("<s>Hello", false, false) == std::vector<int>{1, 15043});
  CHECK(t->encode("<s>Hello", false, false, false) != std::vector<int>{1, 15043});
  // Stop: EOS 2 only.
  CHECK(t->is_stop(2));
  CHECK_FALSE(t->is_stop(1));
  // Decode: leading space dropped after BOS only, byte tokens, control tokens silent.
  CHECK(t->decode(1, 15043) == "Hello");
  CHECK(t->decode(100, 15043) == " Hello");
  CHECK(t->decode(100, 13) == "\n");  // <0x0A>
  CHECK(t->decode(100, 2).empty());
  CHECK(t->decode(100, 2, true) == "</s>");
  // Byte fallback round trip of a character outside the vocabulary.
  const std::string text = "x\xF0\x9F\xA6\x99y";  // x, U+1F999 (llama emoji), y
  std::string back;
  int prev = 1;
  for (int id : t->encode(text, true, false)) {
    if (id != 1) back += t->decode(prev, id);
    prev = id;
  }
  CHECK(back == text);
}

TEST_CASE("GGUF Llama 3 BPE: BOS by default, specials, stop set, decode", "[tokenizer][gguf]") {
  if (!test::have_shared()) return;
  auto t = open_tok("models/gguf/ggml-vocab-llama-bpe.gguf");
  CHECK(t->kind() == model::tokenizer_kind::bpe);
  CHECK(t->vocab_size() == 128256);
  CHECK(t->bos() == 128000);
  CHECK(t->adds_bos());  // no add_bos key: llama-bpe adds BOS (llama.cpp)
  const auto ids = t->encode("Hello world", true, false);
  REQUIRE(ids.size() == 3);
  CHECK(ids[0] == 128000);
  // Header tokens are matched whole.
  const int start = t->special_id("<|start_header_id|>");
  const int eot = t->special_id("<|eot_id|>");
  REQUIRE(start >= 0);
  REQUIRE(eot >= 0);
  CHECK(t->encode("<|start_header_id|>user<|end_header_id|>", false, false).front() == start);
  CHECK(t->is_stop(eot));
  CHECK(t->is_stop(128001));  // EOS <|end_of_text|>
  CHECK_FALSE(t->is_stop(128000));
  std::string back;
  for (size_t i = 1; i < ids.size(); ++i) back += t->decode(ids[i - 1], ids[i]);
  CHECK(back == "Hello world");
  CHECK(t->decode(0, eot).empty());
  CHECK(t->decode(0, eot, true) == "<|eot_id|>");
  const std::string utf = "Äpfel 🦙 нещо";
  std::string round;
  for (int id : t->encode(utf, false, false)) round += t->decode(-1, id);
  CHECK(round == utf);
}

TEST_CASE("stories260K.gguf's tokenizer encodes run.c's tok512 cases the same", "[tokenizer][gguf]") {
  if (!test::have_shared()) return;
  auto t = open_tok("models/gguf/stories260K.gguf");
  CHECK(t->kind() == model::tokenizer_kind::spm);
  CHECK(t->vocab_size() == 512);
  std::ifstream in(test::shared_file("fixtures/tok512_cases.jsonl"));
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    const std::string prompt = j["prompt"];
    const std::vector<int> want = j["ids"];
    INFO("prompt: " << prompt);
    CHECK(t->encode(prompt, true, false) == want);
    ++n;
  }
  CHECK(n >= 4);
}

TEST_CASE("GGUF tokenizer bad inputs name the file and key", "[tokenizer][gguf]") {
  using model::vocab_spec;
  auto spec = vocab_spec::defaults_for(model::tokenizer_kind::spm);
  spec.name = "mem.gguf";
  spec.tokens = {"<unk>", "<s>", "</s>", "a"};
  spec.scores = {0, 0};
  auto r = model::tokenizer::from_vocab(spec);
  REQUIRE_FALSE(r.ok());
  CHECK(r.message() == "mem.gguf: key tokenizer.ggml.scores has 2 entries, expected one per token (4)");
  spec.scores.clear();
  spec.eos = 9;
  r = model::tokenizer::from_vocab(spec);
  REQUIRE_FALSE(r.ok());
  CHECK(r.message() == "mem.gguf: key tokenizer.ggml.eos_token_id is 9, expected a token id below 4");
  auto bpe = vocab_spec::defaults_for(model::tokenizer_kind::bpe, "tekken");
  bpe.name = "mem.gguf";
  bpe.tokens = {"a", "b"};
  bpe.bos = bpe.eos = -1;
  r = model::tokenizer::from_vocab(bpe);
  REQUIRE_FALSE(r.ok());
  CHECK(r.message().find("key tokenizer.ggml.pre is 'tekken', expected one of the supported") != std::string::npos);
  CHECK(r.message().find("qwen2") != std::string::npos);
  bpe.pre = "default";
  bpe.merges = {"ab"};
  r = model::tokenizer::from_vocab(bpe);
  REQUIRE_FALSE(r.ok());
  CHECK(r.message() == "mem.gguf: key tokenizer.ggml.merges entry 0 is 'ab', expected two pieces separated by a space");

  model::gguf::writer w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string_array("tokenizer.ggml.tokens", {"a"});
  auto f = model::gguf::file::from_bytes(w.bytes(), "w.gguf");
  REQUIRE(f.ok());
  auto t = model::tokenizer::from_gguf(**f);
  REQUIRE_FALSE(t.ok());
  CHECK(t.message() == "w.gguf: key tokenizer.ggml.model is 'bert', expected a supported tokenizer: llama "
                       "(SentencePiece) or gpt2 (byte-level BPE)");
  model::gguf::writer w2;
  w2.set_string("tokenizer.ggml.model", "gpt2");
  w2.set_string_array("tokenizer.ggml.tokens", {"a"});
  f = model::gguf::file::from_bytes(w2.bytes(), "w2.gguf");
  REQUIRE(f.ok());
  t = model::tokenizer::from_gguf(**f);
  REQUIRE_FALSE(t.ok());
  CHECK(t.message().find("tokenizer.ggml.merges") != std::string::npos);
}

TEST_CASE("a small byte-level BPE with the default pre-tokenizer merges by rank", "[tokenizer][gguf]") {
  // Independent hand check: "aab" with merges (a a) rank 1, (a b) rank 0:
  // "ab" merges first (lower rank), then nothing: [a, ab].
  auto s = model::vocab_spec::defaults_for(model::tokenizer_kind::bpe, "default");
  s.name = "mem";
  s.tokens = {"a", "b", "aa", "ab", "\xC4\xA0", "\xC4\xA0" "a"};  // Ġ = byte-encoded space
  s.merges = {"a b", "a a", "\xC4\xA0 a"};
  s.bos = s.eos = -1;
  auto t = model::tokenizer::from_vocab(s);
  REQUIRE(t.ok());
  CHECK((*t)->encode("aab", false, false) == std::vector<int>{0, 3});
  CHECK((*t)->encode("aa", false, false) == std::vector<int>{2});
  // " a" is one pre-token: byte-encoded space + a merge into "Ġa".
  CHECK((*t)->encode("b a", false, false) == std::vector<int>{1, 5});
  CHECK((*t)->decode(-1, 5) == " a");
}

TEST_CASE("qwen2 and gpt-2 pre-tokenizers split digits and punctuation as their patterns say",
          "[tokenizer][gguf]") {
  // Independent hand check on one byte-level vocabulary (ASCII bytes are
  // their own symbols): merges "1 2" then "12 3" make "123"; "( a" then
  // "(a b" make "(ab". Which merges can apply depends only on the pre-tokens:
  //  - llama-bpe: digits in groups of up to 3 ("123" "4"); an optional
  //    non-letter joins the letters after it ("x" "(ab");
  //  - qwen2: the same, but every digit alone;
  //  - gpt-2: " ?\p{N}+" keeps "1234" together ("123" then "4" by the
  //    merges); "(" and "ab" are separate pre-tokens (letters only after an
  //    optional space), and "ab" has no merge.
  const std::vector<std::string> tokens = {"1", "2", "3", "4", "12", "123", "(", "a", "b", "x", "(a", "(ab"};
  auto make = [&](const std::string& pre) {
    auto s = model::vocab_spec::defaults_for(model::tokenizer_kind::bpe, pre);
    s.name = "mem-" + pre;
    s.tokens = tokens;
    s.merges = {"1 2", "12 3", "( a", "(a b"};
    s.bos = s.eos = -1;
    s.add_bos = false;
    auto t = model::tokenizer::from_vocab(s);
    INFO(pre << ": " << (t ? std::string() : t.message()));
    REQUIRE(t.ok());
    return *t;
  };
  using ids = std::vector<int>;
  const auto llama3 = make("llama-bpe"), qwen2 = make("qwen2"), gpt2 = make("gpt-2");
  CHECK(llama3->encode("1234", false, false) == ids{5, 3});
  CHECK(qwen2->encode("1234", false, false) == ids{0, 1, 2, 3});
  CHECK(gpt2->encode("1234", false, false) == ids{5, 3});
  CHECK(llama3->encode("x(ab", false, false) == ids{9, 11});
  CHECK(qwen2->encode("x(ab", false, false) == ids{9, 11});
  CHECK(gpt2->encode("x(ab", false, false) == ids{9, 6, 7, 8});
  // The other names llama.cpp maps to the same types.
  CHECK(make("deepseek-r1-qwen")->encode("1234", false, false) == ids{0, 1, 2, 3});
  CHECK(make("phi-2")->encode("x(ab", false, false) == ids{9, 6, 7, 8});
}
