#include "model/generation.hpp"

#include <algorithm>

namespace cellshard::model {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

result<generation> generation::start(const tokenizer& tok, int vocab_size, const generation_params& params,
                                     generation_options options) {
  if (vocab_size <= 0) return make_error("generation: vocab_size is " + std::to_string(vocab_size) + ", expected > 0");
  generation g;
  g.tok_ = &tok;
  g.params_ = params;
  g.now_ = std::move(options.now);
  g.opt_ = std::move(options);
  g.smp_ = std::make_unique<sampler>(vocab_size, params.sampling);
  if (!g.opt_.resume_ids.empty()) {
    // Everything the killed run produced is teacher-forced like a prompt.
    g.prompt_ = g.opt_.resume_ids;
    g.smp_->set_rng_state(g.opt_.resume_rng);
    g.quiet_until_ = static_cast<int>(g.prompt_.size());
  } else {
    auto ids = prompt_ids(tok, params);
    if (!ids) return ids.err();
    g.prompt_ = std::move(*ids);
  }
  g.out_.prompt_tokens = static_cast<int>(g.prompt_.size());
  g.t0_ = g.last_ = g.now();
  g.token_ = g.prompt_[0];
  g.out_.ids.push_back(g.token_);
  const int steps = std::max(1, params.steps);
  const int n_prompt = static_cast<int>(g.prompt_.size());
  if (!g.opt_.every_logits && n_prompt > steps) {
    // Every position is a prompt position: their next tokens are known and
    // no logits are looked at, so nothing needs computing.
    for (int p = 0; p < steps && !g.done_; ++p) {
      g.pos_ = p + 1;
      g.emit(p, g.prompt_[static_cast<size_t>(p) + 1], false);
    }
    g.done_ = true;
    return g;
  }
  g.prepare_step();
  return g;
}

void generation::prepare_step() {
  const int n_prompt = static_cast<int>(prompt_.size());
  const int steps = std::max(1, params_.steps);
  step_.pos0 = pos_;
  step_.tokens.clear();
  if (pos_ == 0 || pos_ >= n_prompt) {
    step_.tokens.push_back(token_);
    return;
  }
  int end = std::min(n_prompt, steps);
  if (opt_.every_logits) end = pos_ + 1;
  else if (opt_.max_prompt_positions > 0) end = std::min(end, pos_ + opt_.max_prompt_positions);
  step_.tokens.assign(prompt_.begin() + pos_, prompt_.begin() + end);
}

void generation::emit(int pos, int next, bool sampled) {
  out_.ids.push_back(next);
  emitted_token e;
  e.pos = pos;
  e.token = next;
  e.sampled = sampled;
  e.quiet = static_cast<int>(out_.ids.size()) <= quiet_until_;
  e.rng = smp_->rng_state();
  const auto t = now();
  // TTFT ends at the first sampled token; TPOT samples are the sampled
  // tokens after it (prompt positions are prefill, part of TTFT).
  if (sampled && have_sampled_) out_.step_ms.push_back(ms_between(last_, t));
  last_ = t;
  if (sampled && !have_sampled_) {
    have_sampled_ = true;
    out_.ttft_ms = ms_between(t0_, t);
  }
  // run.c ends on BOS whatever produced it, a forced prompt token too; llama.cpp
  // looks for end of generation in sampled tokens only (a chat prompt closes
  // its turns with EOS or end-of-turn tokens).
  const bool may_stop = sampled || tok_->kind() == tokenizer_kind::llama2c;
  if (!params_.ignore_eos && may_stop && tok_->is_stop(next)) {
    e.stop = true;
    done_ = true;
    if (opt_.on_token) opt_.on_token(e);
    return;
  }
  e.piece = tok_->decode(token_, next);
  out_.text += e.piece;
  token_ = next;
  if (opt_.on_token) opt_.on_token(e);
}

void generation::complete(float* logits) {
  if (done_) return;
  if (!first_done_) {  // run.c's clock starts at the end of the first forward pass
    first_done_ = true;
    first_ = now();
  }
  const int n_prompt = static_cast<int>(prompt_.size());
  const int n = static_cast<int>(step_.tokens.size());
  for (int i = 0; i < n && !done_; ++i) {
    const int p = step_.pos0 + i;
    pos_ = p + 1;
    if (p < n_prompt - 1) emit(p, prompt_[static_cast<size_t>(p) + 1], false);
    else emit(p, smp_->sample(logits), true);  // p is the step's last position (prepare_step)
  }
  if (done_) return;
  if (pos_ >= std::max(1, params_.steps)) {
    done_ = true;
    return;
  }
  prepare_step();
}

void generation::end() {
  if (ended_) return;
  ended_ = true;
  done_ = true;
  const auto t = now();
  out_.duration_ms = ms_between(t0_, t);
  out_.tokens_per_s = 0;
  if (first_done_ && pos_ > 1) {
    const double s = std::chrono::duration<double>(t - first_).count();
    out_.tokens_per_s = s > 0 ? (pos_ - 1) / s : 0;
  }
}

}  // namespace cellshard::model
