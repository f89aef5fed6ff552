// model/generate.hpp: llama2.c run.c's generate() loop over any forward
// function: encode the prompt with BOS, feed prompt tokens (teacher-forced,
// no sampling, no RNG use), then sample; stop after `steps` positions or when
// BOS is sampled. Prints nothing itself: pieces go to the callback as run.c's
// safe_printf would print them.
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

result<generation_result> generate(const forward_fn& forward, const tokenizer& tok,
                                   int vocab_size, const generation_params& params,
                                   const piece_fn& on_piece);

/// "1,2,3\n": the fixtures' .ids format.
std::string format_ids(const std::vector<int>& ids);
result<std::vector<int>> parse_ids(const std::string& text, const std::string& name);

}  // namespace cellshard::model
