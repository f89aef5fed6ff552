// Both tokenizer case files (llama2.c test.c's expectations for the 32000-token
// vocabulary, run.c's encodings for tok512), plus decode rules.
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <fstream>

using namespace cellshard;

namespace {
void check_cases(const std::string& tok_file, const std::string& cases_file) {
  auto tok = model::tokenizer::open(test::shared_file("models/" + tok_file));
  REQUIRE(tok.ok());
  std::ifstream in(test::shared_file("fixtures/" + cases_file));
  REQUIRE(in.good());
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    const std::string prompt = j["prompt"];
    const std::vector<int> want = j["ids"];
    INFO(cases_file << " prompt: " << prompt);
    CHECK((*tok)->encode(prompt, true, false) == want);
    ++n;
  }
  CHECK(n >= 4);
}
}  // namespace

TEST_CASE("tokenizer.bin (32000) passes llama2.c test.c cases", "[tokenizer]") {
  if (!test::have_shared()) return;
  check_cases("tokenizer.bin", "tokenizer32000_cases.jsonl");
}

TEST_CASE("tok512.bin passes run.c's encodings", "[tokenizer]") {
  if (!test::have_shared()) return;
  check_cases("tok512.bin", "tok512_cases.jsonl");
}

TEST_CASE("tokenizer vocabulary sizes and decode rules", "[tokenizer]") {
  if (!test::have_shared()) return;
  auto t512 = model::tokenizer::open(test::shared_file("models/tok512.bin"));
  auto t32k = model::tokenizer::open(test::shared_file("models/tokenizer.bin"));
  REQUIRE(t512.ok());
  REQUIRE(t32k.ok());
  CHECK((*t512)->vocab_size() == 512);
  CHECK((*t512)->max_token_length() == 7);
  CHECK((*t32k)->vocab_size() == 32000);
  CHECK((*t32k)->max_token_length() == 27);
  const auto& t = **t32k;
  // Raw byte pieces: <0x0A> (id 13) prints a newline; <0x01> (id 4) prints nothing.
  CHECK(t.piece(13) == "<0x0A>");
  CHECK(t.decode(100, 13) == "\n");
  CHECK(t.decode(100, 4).empty());
  // Leading space dropped after BOS only.
  const int once = t.encode("Once", false, false).back();
  REQUIRE(t.piece(once)[0] == ' ');
  CHECK(t.decode(model::bos_id, once) == t.piece(once).substr(1));
  CHECK(t.decode(500, once) == t.piece(once));
}

TEST_CASE("byte-level tokenizer round-trips through its file format", "[tokenizer]") {
  auto t = model::tokenizer::byte_level(512);
  CHECK(t->vocab_size() == 512);
  auto ids = t->encode("Hi!", true, false);
  // BOS, " " (259), then bytes + 3.
  CHECK(ids == std::vector<int>{1, 259, 'H' + 3, 'i' + 3, '!' + 3});
  std::string text;
  int prev = ids[0];
  for (size_t i = 1; i < ids.size(); ++i) {
    text += t->decode(prev, ids[i]);
    prev = ids[i];
  }
  CHECK(text == "Hi!");
  auto again = model::tokenizer::from_bytes(t->to_bytes(), "mem");
  REQUIRE(again.ok());
  CHECK((*again)->vocab_size() == 512);
  CHECK((*again)->digest() == t->digest());
}

TEST_CASE("malformed tokenizer files are clear errors", "[tokenizer][errors]") {
  auto t = model::tokenizer::byte_level(300);
  auto bytes = t->to_bytes();
  bytes.resize(bytes.size() - 3);  // cut into the last record
  auto r = model::tokenizer::from_bytes(bytes, "cut.bin");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.message(), Catch::Contains("cut.bin") && Catch::Contains("token 299"));
  auto r2 = model::tokenizer::from_bytes({1, 0}, "tiny.bin");
  REQUIRE_FALSE(r2.ok());
  CHECK_THAT(r2.message(), Catch::Contains("tiny.bin"));
  auto r3 = model::tokenizer::open("/nonexistent/tok.bin");
  REQUIRE_FALSE(r3.ok());
  CHECK_THAT(r3.message(), Catch::Contains("/nonexistent/tok.bin"));
}
