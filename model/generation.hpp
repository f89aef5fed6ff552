// model/generation.hpp: the generation state machine -- llama2.c run.c's
// generate() loop with the forward pass taken out, so that one definition of
// "what comes next" serves a synchronous loop on one node (model::generate)
// and the session actor of a cluster (actors/session.cpp), which computes a
// step asynchronously over many nodes, may re-send it, and recovers.
//
// The machine asks for steps: positions [pos0, pos0 + n) with their input
// tokens; the caller computes them (any way: one engine, prefill in chunks, a
// pipeline of daemons) and hands back the logits [vocab] of the step's last
// position. The machine then emits the tokens that follow those positions
// (the prompt's own, teacher-forced, then sampled ones) and decides the next
// step. Semantics, as run.c's main loop (../shared/fixtures/README.md):
//   - the prompt is tok.encode(prompt) with BOS when params.add_bos (model::prompt_ids);
//   - position 0 is computed alone (run.c starts its clock after the first
//     forward pass, so tokens_per_s needs that pass to be position 0 alone);
//     then the rest of the prompt, up to `max_prompt_positions` per step;
//     then one position per step, each sampled from the previous logits;
//   - a position p < n_prompt - 1 is followed by prompt[p + 1] (no sampling,
//     no RNG use); from p = n_prompt - 1 on, the sampler picks the next token;
//   - generation ends after params.steps positions, or after a stop token
//     (tokenizer::is_stop) unless params.ignore_eos: for llama2.c tokenizers
//     prompt tokens included, as run.c breaks on a BOS wherever it comes; for
//     GGUF tokenizers sampled tokens only, as llama.cpp (chat prompts close
//     their turns with EOS or end-of-turn tokens);
//   - when every position is a prompt position (n_prompt > steps) nothing
//     needs computing unless the caller wants every position's logits.
// Time comes from an injectable clock, so timings are testable.
//
// Thread safety: none; one machine is driven by one thread (or one actor).
// The tokenizer must outlive the machine.
#pragma once

#include "model/generate.hpp"
#include "model/result.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::model {

/// Positions [pos0, pos0 + tokens.size()) to compute; tokens[i] is the input
/// token of position pos0 + i. Only the last position's logits are needed.
struct generation_step {
  int pos0 = 0;
  std::vector<int> tokens;
};

/// One token the machine appended to the ids: `token` follows position `pos`
/// (it is ids[pos + 1]).
struct emitted_token {
  int pos = 0;
  int token = 0;
  std::string piece;   // the tokenizer's decoding (run.c's output); empty when `stop`
  bool sampled = false;  // false: the prompt's own next token (or a resumed one)
  bool quiet = false;  // a resumed token: already reported by the run that is resumed
  bool stop = false;   // a stop token: generation ends with it (not printed)
  uint64_t rng = 0;    // the sampler's RNG state after this token (journals)
};

struct generation_options {
  /// Prompt positions after position 0 per step: 0 = all of them in one
  /// step (engine::prefill or a cluster's shards chunk it further), 1 = one
  /// per step.
  int max_prompt_positions = 0;
  /// The caller wants the logits of every position (run --logits-out): one
  /// position per step, and prompt positions are computed even when -n ends
  /// inside the prompt.
  bool every_logits = false;
  /// Resume: the ids a killed run produced (BOS first), teacher-forced like
  /// a prompt and emitted `quiet`, and the RNG state after the last of them.
  std::vector<int> resume_ids;
  uint64_t resume_rng = 0;
  /// Called for each emitted token, in order (also from start()).
  std::function<void(const emitted_token&)> on_token;
  /// The clock (tests inject one); default steady_clock::now.
  std::function<std::chrono::steady_clock::time_point()> now;
};

class generation {
public:
  using clock = std::chrono::steady_clock;

  /// Starts a generation: encodes the prompt (error when it encodes to no
  /// tokens and the tokenizer adds no BOS), or takes options.resume_ids.
  /// `params` must be normalised (model::normalise); vocab_size > 0.
  static result<generation> start(const tokenizer& tok, int vocab_size, const generation_params& params,
                                  generation_options options = {});

  /// True when no step is left (steps reached, a stop token, or nothing to
  /// compute). Then step() must not be called.
  bool done() const { return done_; }
  /// The step to compute next; the same until complete() accepts its logits
  /// (a caller may send it again after a loss).
  const generation_step& step() const { return step_; }
  /// The logits [vocab_size] of step().tokens' last position. The sampler
  /// works in place (softmax), so the values are changed. Emits the tokens
  /// that follow the step's positions and prepares the next step.
  void complete(float* logits);
  /// Ends the run (also early, on an error): stamps duration_ms and
  /// tokens_per_s (run.c's: positions after the first over the time from the
  /// end of the first forward pass to now). Idempotent.
  void end();

  /// Next position to run (the step's pos0 while not done).
  int pos() const { return pos_; }
  /// The teacher-forced ids: the prompt with BOS, or the resumed ids.
  const std::vector<int>& prompt() const { return prompt_; }
  /// ids (BOS, prompt tokens, sampled tokens), text, TTFT, TPOT samples; the
  /// timings of the whole run after end().
  const generation_result& output() const { return out_; }
  generation_result& output() { return out_; }
  uint64_t rng_state() const { return smp_->rng_state(); }

private:
  generation() = default;
  void emit(int pos, int next, bool sampled);
  void prepare_step();
  clock::time_point now() const { return now_ ? now_() : clock::now(); }

  const tokenizer* tok_ = nullptr;
  generation_params params_;
  generation_options opt_;
  std::function<clock::time_point()> now_;
  std::unique_ptr<sampler> smp_;
  std::vector<int> prompt_;
  generation_result out_;
  generation_step step_;
  int pos_ = 0;
  int token_ = 0;  // the input token of position pos_
  int quiet_until_ = 0;  // ids below this index are resumed
  bool done_ = false, ended_ = false, have_sampled_ = false, first_done_ = false;
  clock::time_point t0_{}, last_{}, first_{};
};

}  // namespace cellshard::model
