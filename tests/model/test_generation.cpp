// The generation state machine (model/generation.hpp) against an independent
// transcription of run.c's loop, on a fake forward pass whose logits depend
// on (token, position): the same ids for every way of grouping positions into
// steps, run.c's tokens/s on an injected clock, resume, stop tokens.
#include "model/generation.hpp"
#include "model/generate.hpp"
#include "tests/support.hpp"

#include <cmath>

using namespace cellshard;

namespace {

constexpr int kVocab = 300;

/// Logits of position `pos` fed `token`: smooth in the id, so sampling with a
/// temperature has real choices; a BOS (1) is likely enough to come up.
std::vector<float> fake_logits(int token, int pos) {
  std::vector<float> l(kVocab);
  for (int j = 0; j < kVocab; ++j) l[j] = 3.0f * std::sin(0.37f * j + 1.3f * token + 0.11f * pos);
  l[1] += 1.5f;  // BOS: a stop now and then
  return l;
}

/// run.c's generate() loop written out (llama2.c run.c, main loop).
std::vector<int> runc_loop(const std::vector<int>& prompt, int steps, model::sampler_params sp) {
  model::sampler smp(kVocab, sp);
  std::vector<int> ids{prompt[0]};
  int token = prompt[0];
  for (int pos = 0; pos < steps; ++pos) {
    auto l = fake_logits(token, pos);
    int next = pos < static_cast<int>(prompt.size()) - 1 ? prompt[pos + 1] : smp.sample(l.data());
    ids.push_back(next);
    if (next == 1) break;
    token = next;
  }
  return ids;
}

struct driven {
  std::vector<int> ids;
  std::vector<model::generation_step> steps;
  std::vector<model::emitted_token> emitted;
};

driven drive(const model::tokenizer& tok, const model::generation_params& p, model::generation_options opt) {
  driven d;
  opt.on_token = [&d](const model::emitted_token& e) { d.emitted.push_back(e); };
  auto g = model::generation::start(tok, kVocab, p, std::move(opt));
  REQUIRE(g);
  int guard = 0;
  while (!g->done() && ++guard < 10000) {
    d.steps.push_back(g->step());
    const auto& s = g->step();
    auto l = fake_logits(s.tokens.back(), s.pos0 + static_cast<int>(s.tokens.size()) - 1);
    g->complete(l.data());
  }
  g->end();
  d.ids = g->output().ids;
  return d;
}

}  // namespace

TEST_CASE("generation: the ids of run.c's loop however positions are grouped into steps", "[generation]") {
  auto tok = model::tokenizer::byte_level(kVocab);
  for (const char* prompt : {"", "a", "once upon a time"}) {
    for (float temp : {0.0f, 0.9f}) {
      for (int steps : {1, 3, 17, 64}) {
        model::generation_params p;
        p.prompt = prompt;
        p.steps = steps;
        p.sampling = {temp, 0.9f, 4242};
        const auto want_prompt = tok->encode(prompt, true, false);
        const auto want = runc_loop(want_prompt, steps, p.sampling);
        for (int per_step : {0, 1, 3}) {
          for (bool every : {false, true}) {
            CAPTURE(prompt, temp, steps, per_step, every);
            model::generation_options opt;
            opt.max_prompt_positions = per_step;
            opt.every_logits = every;
            auto d = drive(*tok, p, opt);
            CHECK(d.ids == want);
            // Position 0 alone first (run.c's clock starts after it), then
            // consecutive steps; a step of several positions only in the prompt.
            const int n_prompt = static_cast<int>(want_prompt.size());
            if (!d.steps.empty()) {
              CHECK(d.steps[0].pos0 == 0);
              CHECK(d.steps[0].tokens.size() == 1u);
            }
            int next = 0;
            for (const auto& s : d.steps) {
              CHECK(s.pos0 == next);
              next += static_cast<int>(s.tokens.size());
              if (s.tokens.size() > 1) CHECK(next <= n_prompt);
              if (every || per_step == 1) CHECK(s.tokens.size() == 1u);
              if (per_step == 3) CHECK(s.tokens.size() <= 3u);
              for (size_t i = 0; i < s.tokens.size(); ++i) CHECK(s.tokens[i] == d.ids[s.pos0 + i]);
            }
            // Nothing is computed when every position is a prompt position,
            // unless every position's logits are wanted.
            if (n_prompt > steps && !every) CHECK(d.steps.empty());
            // Emitted in order, one per id after BOS; sampled ones after the prompt.
            REQUIRE(d.emitted.size() + 1 == d.ids.size());
            for (size_t i = 0; i < d.emitted.size(); ++i) {
              CHECK(d.emitted[i].pos == static_cast<int>(i));
              CHECK(d.emitted[i].token == d.ids[i + 1]);
              CHECK(d.emitted[i].sampled == (static_cast<int>(i) >= n_prompt - 1));
              CHECK(d.emitted[i].stop == (d.ids[i + 1] == 1));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("generation: model::generate is the machine over forward and prefill", "[generation]") {
  auto tok = model::tokenizer::byte_level(kVocab);
  model::generation_params p;
  p.prompt = "the cat sat";
  p.steps = 40;
  p.sampling = {0.8f, 0.9f, 99};
  const auto want = runc_loop(tok->encode(p.prompt, true, false), p.steps, p.sampling);
  std::vector<float> buf;
  int forwards = 0, prefills = 0, prefilled_positions = 0;
  auto forward = [&](int token, int pos) -> result<const float*> {
    ++forwards;
    buf = fake_logits(token, pos);
    return static_cast<const float*>(buf.data());
  };
  auto prefill = [&](const int* t, int n, int pos0) -> result<const float*> {
    ++prefills;
    prefilled_positions += n;
    buf = fake_logits(t[n - 1], pos0 + n - 1);
    return static_cast<const float*>(buf.data());
  };
  std::string text;
  auto r = model::generate(forward, *tok, kVocab, p, [&](int, const std::string& s) { text += s; }, {}, prefill);
  REQUIRE(r);
  CHECK(r->ids == want);
  CHECK(r->text == text);
  const int n_prompt = static_cast<int>(tok->encode(p.prompt, true, false).size());
  CHECK(prefills == 1);
  CHECK(prefilled_positions == n_prompt - 1);
  CHECK(forwards == static_cast<int>(want.size()) - 1 - (n_prompt - 1));
  // An error of the forward pass ends the loop with it.
  auto failing = [&](int, int pos) -> result<const float*> {
    if (pos == 5) return make_error("node 3 is gone");
    buf = fake_logits(0, pos);
    return static_cast<const float*>(buf.data());
  };
  auto e = model::generate(failing, *tok, kVocab, p, {});
  REQUIRE_FALSE(e);
  CHECK(e.message() == "node 3 is gone");
}

TEST_CASE("generation: run.c's tokens/s and TTFT on an injected clock", "[generation]") {
  auto tok = model::tokenizer::byte_level(kVocab);
  model::generation_params p;
  p.prompt = "abcd";
  p.steps = 12;
  p.sampling = {0.0f, 0.9f, 1};
  p.ignore_eos = true;
  using clock = std::chrono::steady_clock;
  clock::time_point t{};
  model::generation_options opt;
  opt.now = [&t] { return t; };
  auto g = model::generation::start(*tok, kVocab, p, opt);
  REQUIRE(g);
  int n = 0;
  while (!g->done()) {
    t += std::chrono::milliseconds(10);  // every step takes 10 ms
    const auto& s = g->step();
    auto l = fake_logits(s.tokens.back(), s.pos0 + static_cast<int>(s.tokens.size()) - 1);
    g->complete(l.data());
    ++n;
  }
  g->end();
  // llama2.c's encoder puts a " " before the text: BOS, " ", a, b, c, d.
  const int n_prompt = static_cast<int>(tok->encode(p.prompt, true, false).size());
  REQUIRE(n_prompt == 6);
  // Steps: [0], [1..5] (the rest of the prompt; samples ids[6]), then one per
  // position 6..11.
  CHECK(n == 8);
  const auto& r = g->output();
  CHECK(r.ids.size() == 13u);
  CHECK(r.duration_ms == Approx(80.0));
  // The first sampled token comes with the second step, at 20 ms.
  CHECK(r.ttft_ms == Approx(20.0));
  CHECK(r.step_ms.size() == 6u);
  for (double s : r.step_ms) CHECK(s == Approx(10.0));
  // run.c: (positions - 1) over the time since the end of the first forward
  // pass: 11 positions in 70 ms.
  CHECK(r.tokens_per_s == Approx(11 / 0.070));
}

TEST_CASE("generation: a resumed run continues with the same ids, the resumed ones quiet", "[generation]") {
  auto tok = model::tokenizer::byte_level(kVocab);
  model::generation_params p;
  p.prompt = "xy";
  p.steps = 30;
  p.sampling = {1.0f, 0.95f, 7};
  p.ignore_eos = true;
  auto whole = drive(*tok, p, {});
  REQUIRE(whole.ids.size() == 31u);
  // A run killed after ids[0..10]: the RNG state after ids[10] is in its journal.
  const int kept = 11;
  model::generation_options opt;
  opt.resume_ids.assign(whole.ids.begin(), whole.ids.begin() + kept);
  opt.resume_rng = whole.emitted[kept - 2].rng;
  auto resumed = drive(*tok, p, opt);
  CHECK(resumed.ids == whole.ids);
  for (const auto& e : resumed.emitted) CHECK(e.quiet == (e.pos + 1 < kept));
}

TEST_CASE("generation: a stop token ends it, in the prompt as run.c does, unless ignore_eos", "[generation]") {
  auto tok = model::tokenizer::byte_level(kVocab);
  model::generation_params p;
  p.steps = 20;
  p.sampling = {0.0f, 0.9f, 1};
  model::generation_options opt;
  opt.resume_ids = {1, 70, 1, 80, 90};  // a BOS inside the teacher-forced ids
  auto d = drive(*tok, p, opt);
  CHECK(d.ids == std::vector<int>{1, 70, 1});
  CHECK(d.emitted.back().stop);
  CHECK(d.emitted.back().piece.empty());
  p.ignore_eos = true;
  auto all = drive(*tok, p, opt);
  CHECK(all.ids.size() == 21u);
  CHECK(all.ids[3] == 80);
  CHECK(model::generation::start(*tok, 0, p).message().find("vocab_size") != std::string::npos);
}
