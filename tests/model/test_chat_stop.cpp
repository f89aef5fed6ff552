// Chat prompt formats (model/chat.hpp) and the generation stop rule
// (tokenizer::is_stop through model::generate, with --ignore-eos).
#include "model/chat.hpp"
#include "model/generate.hpp"
#include "model/tokenizer.hpp"
#include "tests/support.hpp"

using namespace cellshard;
using model::chat::format;

TEST_CASE("chat formats lay out system and user turns", "[chat]") {
  const std::vector<model::chat::message> m = {{"system", "Be brief."}, {"user", "Hi"}};
  auto text = [&](format f) {
    auto p = model::chat::apply(f, m);
    REQUIRE(p.ok());
    CHECK(p->add_bos);
    return p->text;
  };
  CHECK(text(format::none) == "Be brief.\nHi");
  CHECK(text(format::llama2) == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]");
  CHECK(text(format::llama3) ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(text(format::chatml) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(text(format::zephyr) == "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n");
  // A conversation with an answer: Llama 2 closes the turn and opens the next.
  auto p = model::chat::apply(format::llama2, {{"user", "A"}, {"assistant", "B"}, {"user", "C"}});
  REQUIRE(p.ok());
  CHECK(p->text == "[INST] A [/INST] B </s><s>[INST] C [/INST]");
}

TEST_CASE("chat templates are recognised by their markers, bad inputs named", "[chat]") {
  CHECK(model::chat::detect("{{ '<|start_header_id|>' + message['role'] }}") == format::llama3);
  CHECK(model::chat::detect("{{'<|im_start|>' + message['role'] + '\\n'}}") == format::chatml);
  CHECK(model::chat::detect("{{ bos_token + '[INST] ' + content + ' [/INST]' }}") == format::llama2);
  CHECK(model::chat::detect("{{ '<|user|>\\n' + message['content'] + eos_token }}") == format::zephyr);
  CHECK(model::chat::detect("") == format::none);
  CHECK(model::chat::detect("{{ message }}") == format::none);
  auto f = model::chat::parse_format("vicuna");
  REQUIRE_FALSE(f.ok());
  CHECK(f.message() == "chat format 'vicuna' is not known, expected one of: llama2, llama3, chatml, zephyr, none");
  CHECK(*model::chat::parse_format("chatml") == format::chatml);
  auto r = model::chat::apply(format::chatml, {{"user", "x"}, {"tool", "y"}});
  REQUIRE_FALSE(r.ok());
  CHECK(r.message() == "chat: message 1 has role 'tool', expected system, user or assistant");
  CHECK_FALSE(model::chat::apply(format::none, {}).ok());
}

namespace {
/// A forward function whose logits put all weight on script[pos] (the token
/// sampled after position pos), for any tokenizer.
model::forward_fn scripted(const std::vector<int>& script, int vocab, std::vector<float>& buf, int& calls) {
  return [&script, vocab, &buf, &calls](int, int pos) -> result<const float*> {
    ++calls;
    buf.assign(vocab, 0.0f);
    buf[script[std::min<size_t>(pos, script.size() - 1)]] = 10.0f;
    return buf.data();
  };
}

std::shared_ptr<const model::tokenizer> small_spm() {
  auto s = model::vocab_spec::defaults_for(model::tokenizer_kind::spm);
  s.name = "mem";
  s.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "b", "<|im_end|>"};
  s.types = {2, 3, 3, 1, 1, 3};
  auto t = model::tokenizer::from_vocab(s);
  REQUIRE(t.ok());
  return *t;
}
}  // namespace

TEST_CASE("stop rule: GGUF stops on EOS and end-of-turn, llama2.c on BOS, --ignore-eos runs every step",
          "[generate][stop]") {
  auto gg = small_spm();
  CHECK(gg->stop_ids() == std::vector<int>{2, 5});  // EOS, and <|im_end|> by name
  std::vector<float> buf;
  int calls = 0;
  model::generation_params gp;
  gp.steps = 8;
  gp.sampling = {0.0f, 0.9f, 1};
  // Positions 0,1,2 sample a, b, EOS.
  const std::vector<int> script = {3, 4, 2, 3, 4, 3, 4, 3};
  auto r = model::generate(scripted(script, 6, buf, calls), *gg, 6, gp, {});
  REQUIRE(r.ok());
  CHECK(r->ids == std::vector<int>{1, 3, 4, 2});
  CHECK(r->text == "ab");  // leading space dropped after BOS
  gp.ignore_eos = true;
  calls = 0;
  r = model::generate(scripted(script, 6, buf, calls), *gg, 6, gp, {});
  REQUIRE(r.ok());
  CHECK(calls == 8);
  CHECK(r->ids.size() == 9);
  // End of turn stops too.
  gp.ignore_eos = false;
  r = model::generate(scripted({5, 3}, 6, buf, calls), *gg, 6, gp, {});
  REQUIRE(r.ok());
  CHECK(r->ids == std::vector<int>{1, 5});
  // llama2.c: EOS (2) does not stop, a sampled BOS (1) does (run.c).
  auto bl = model::tokenizer::byte_level(300);
  r = model::generate(scripted({2, 1, 5}, 300, buf, calls), *bl, 300, gp, {});
  REQUIRE(r.ok());
  CHECK(r->ids == std::vector<int>{1, 2, 1});
  // Logits of every position reach on_logits, prompt positions included.
  std::vector<int> seen;
  gp.prompt = "ab";
  r = model::generate(scripted({3, 4, 3, 4, 3, 4, 3, 4}, 6, buf, calls), *gg, 6, gp, {},
                      [&](int pos, const float* l) {
                        seen.push_back(pos);
                        CHECK(l[3] + l[4] == 10.0f);
                      });
  REQUIRE(r.ok());
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("a model that adds no BOS needs a prompt", "[generate][stop]") {
  auto s = model::vocab_spec::defaults_for(model::tokenizer_kind::spm);
  s.name = "nobos";
  s.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a"};
  s.add_bos = false;
  auto t = model::tokenizer::from_vocab(s);
  REQUIRE(t.ok());
  model::generation_params gp;
  auto ids = model::prompt_ids(**t, gp);
  REQUIRE_FALSE(ids.ok());
  CHECK(ids.message() == "the prompt encodes to no tokens and tokenizer nobos adds no BOS: give a prompt (-i TEXT)");
  gp.prompt = "a";
  CHECK(*model::prompt_ids(**t, gp) == std::vector<int>{3});
}

TEST_CASE("stop rule: a GGUF prompt holding EOS or end-of-turn runs on (chat templates close turns)",
          "[generate][stop]") {
  // llama.cpp checks end of generation on sampled tokens only: a Llama 3 or
  // Zephyr chat prompt closes the system turn with <|eot_id|> or </s>.
  auto gg = small_spm();
  std::vector<float> buf;
  int calls = 0;
  model::generation_params gp;
  gp.steps = 6;
  gp.sampling = {0.0f, 0.9f, 1};
  gp.prompt = "a<|im_end|>a</s>a";  // each "a" after a special token gets the space prefix
  auto r = model::generate(scripted({3, 3, 3, 3, 3, 4, 2, 3}, 6, buf, calls), *gg, 6, gp, {});
  REQUIRE(r.ok());
  // BOS, a, <|im_end|>, a, </s>, a (the prompt), then b sampled at position 5 (steps 6).
  CHECK(r->ids == std::vector<int>{1, 3, 5, 3, 2, 3, 4});
  // A sampled end of turn still stops.
  gp.steps = 8;
  r = model::generate(scripted({3, 3, 3, 3, 3, 4, 5, 3}, 6, buf, calls), *gg, 6, gp, {});
  REQUIRE(r.ok());
  CHECK(r->ids == std::vector<int>{1, 3, 5, 3, 2, 3, 4, 5});
}
