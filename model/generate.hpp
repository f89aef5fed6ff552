// model/generate.hpp: llama2.c run.c's generate() loop over any forward
// function: encode the prompt with BOS (GGUF: when the model adds one), feed
// prompt tokens (teacher-forced, no sampling, no RNG use), then sample; stop
// after `steps` positions or on the tokenizer's stop rule (tokenizer::is_stop:
// a sampled BOS for llama2.c files as run.c, the end-of-generation tokens for
// GGUF as llama.cpp) unless `ignore_eos`. Prints nothing itself: pieces go to
// the callback as the tokenizer decodes them.
#pragma once

#include "model/result.hpp"
#include "model/sampler.hpp"
#include "model/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cellshard::model {

struct generation_params {
  std::string prompt;     // "" = no prompt (BOS only)
  int steps = 256;        // forward passes; 0 or > seq_len means seq_len (run.c)
  sampler_params sampling;
  bool ignore_eos = false;  // no stop token: exactly `steps` positions run
  /// Prompt text that is already a chat prompt may carry BOS itself; false
  /// leaves BOS out even when the tokenizer adds one (see model/chat.hpp).
  bool add_bos = true;
};

/// Normalises params as run.c's main does: temperature < 0 -> 0, topp outside
/// [0,1] -> 0.9, steps 0 or > seq_len -> seq_len, seed 0 -> the clock.
generation_params normalise(generation_params p, int seq_len);

struct generation_result {
  std::vector<int> ids;        // BOS, prompt tokens, sampled tokens (a sampled BOS last)
  int prompt_tokens = 0;       // including BOS
  std::string text;            // everything the callback received, concatenated
  double ttft_ms = 0;          // time to first token: from start to the first sampled token
                               // (after the prompt's prefill), as TTFT is defined for LLM serving
  std::vector<double> step_ms; // TPOT samples: wall time of every sampled token after the first
  double duration_ms = 0;
  double tokens_per_s = 0;     // run.c's figure: (pos - 1) / time since first token
};

/// forward(token, pos) returns the logits [vocab] of position pos, or an error.
using forward_fn = std::function<result<const float*>(int token, int pos)>;
/// on_piece(token, bytes) is called for each generated token with run.c's output.
using piece_fn = std::function<void(int token, const std::string& piece)>;
/// on_logits(pos, logits) sees the logits [vocab] after feeding position pos,
/// for every position, prompt positions included.
using logits_fn = std::function<void(int pos, const float* logits)>;

/// The prompt's token ids as generation feeds them: tok.encode with BOS when
/// params.add_bos (and the tokenizer adds one). Error when that is empty (a
/// model without BOS and an empty prompt): there is no first token to feed.
result<std::vector<int>> prompt_ids(const tokenizer& tok, const generation_params& params);

/// prefill(tokens, n, pos0) feeds positions [pos0, pos0 + n) at once (e.g.
/// engine::prefill, in chunks) and returns the logits [vocab] of the last.
using prefill_fn = std::function<result<const float*>(const int* tokens, int n, int pos0)>;

/// With `prefill` set and no `on_logits`, the prompt's positions after the
/// first are fed by one prefill call (position 0 still goes through forward,
/// so tokens_per_s keeps run.c's definition: its clock starts after the first
/// forward pass). The ids are the same as without it when prefill is
/// bit-identical to forward (engine::prefill is).
result<generation_result> generate(const forward_fn& forward, const tokenizer& tok,
                                   int vocab_size, const generation_params& params,
                                   const piece_fn& on_piece, const logits_fn& on_logits = {},
                                   const prefill_fn& prefill = {});

/// "1,2,3\n": the fixtures' .ids format.
std::string format_ids(const std::vector<int>& ids);
result<std::vector<int>> parse_ids(const std::string& text, const std::string& name);

}  // namespace cellshard::model
