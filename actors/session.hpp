// actors/session.hpp: the session actor runs one generation: it owns the
// sampler (and its RNG state) and the token log, sends the prompt through the
// pipeline as one batch (prefill), then one position per step (decode), and
// reports each token as it comes. Semantics are llama2.c run.c's generate()
// (model/generate.hpp): the same ids for the same model, prompt and seed.
//
// Every step has a deadline; when it passes, or a shard reports an error, the
// session ends with an error naming the cause and returns the tokens so far.
// Callbacks run on a CAF worker thread: they must not block.
#pragma once

#include "model/generate.hpp"
#include "model/tokenizer.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::actors {

struct session_outcome {
  model::generation_result result;  // tokens so far (all of them on success)
  bool ok = true;
  bool cancelled = false;
  std::string error;                // what failed and where, when !ok
  double compute_ms = 0;            // critical-path kernel time over all steps
};

struct session_spec {
  uint64_t id = 0;
  model::generation_params params;  // already normalised
  std::shared_ptr<const model::tokenizer> tok;
  int vocab_size = 0;
  caf::actor entry;                 // embedding holder (stage 0, rank 0)
  std::vector<caf::actor> shards;   // every shard, to free the session's state
  std::chrono::milliseconds step_timeout{30000};
  std::function<void(int token, const std::string& piece)> on_token;
  std::function<void(const session_outcome&)> on_done;
};

caf::actor spawn_session(caf::actor_system& sys, session_spec spec);

}  // namespace cellshard::actors
