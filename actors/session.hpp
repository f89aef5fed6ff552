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
#include "model/journal.hpp"
#include "model/tokenizer.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::actors {

/// One recovery as the session lived it.
struct recovery_record {
  std::vector<int> indices;         // restarted placement indices
  int position = 0;                 // first position of the step in flight
  int restored_to = 0;              // checkpoint position c (positions [0,c) restored)
  int replayed_positions = 0;       // positions recomputed (c .. position)
  bool from_upstream_log = false;   // replayed from the upstream stage's log (else tokens)
  std::string checkpoint_note;      // why an older checkpoint was used, if one was
  double recover_ms = 0;            // from the restart notice to the next token delivered
};

struct session_outcome {
  model::generation_result result;  // tokens so far (all of them on success)
  bool ok = true;
  bool cancelled = false;
  std::string error;                // what failed and where, when !ok
  double compute_ms = 0;            // critical-path kernel time over all steps
  /// Of which the first step's (position 0 alone: run.c's tokens/s clock
  /// starts when it ends), so compute_ms - first_step_compute_ms is the
  /// kernel time of the decode window (sweep's decode_comm_share).
  double first_step_compute_ms = 0;
  std::vector<recovery_record> recoveries;
  int retries = 0;                  // steps re-sent after their deadline passed and a failed probe
  int extensions = 0;               // deadlines extended because a probe found the step in progress
  /// For each re-send after a deadline (a subset of `retries`): the deadline
  /// that had passed, in ms, as deadline_of computed it (not a measured time).
  std::vector<int64_t> resend_deadlines_ms;
};

struct session_spec {
  uint64_t id = 0;
  model::generation_params params;  // already normalised
  std::shared_ptr<const model::tokenizer> tok;
  int vocab_size = 0;
  caf::actor entry;                 // embedding holder (stage 0, rank 0)
  std::vector<caf::actor> shards;   // every shard by placement index
  std::vector<int> stage_of;        // stage of each placement index
  std::vector<std::vector<int>> stages;  // placement indices of each stage, rank order (then its expert nodes)
  /// Per placement index: an expert node (issue #23), which holds no
  /// per-session state: its restart needs no restore and no replay (the
  /// stage shard re-sends the requests it had in flight there).
  std::vector<char> expert_node;
  caf::actor coordinator;           // restart notifications (may be invalid)
  /// Ceiling of every step's deadline (`--step-timeout-max`), and of the
  /// total wait for one step while probes say it is still being worked on.
  std::chrono::milliseconds step_timeout{30000};
  /// Floor of every step's deadline (`--step-timeout-min`). Between floor and
  /// ceiling the deadline is 3 x the expected time of the step: measured
  /// compute per position x positions + expected_transfer_ms(positions); a
  /// decode step also at least 10 x the moving average of step times.
  std::chrono::milliseconds step_timeout_min{2000};
  /// Time on the critical path's links for a step of n positions, in ms
  /// (bytes over the shaped bandwidth plus latencies; cluster.cpp). Unset: 0.
  std::function<double(int positions)> expected_transfer_ms;
  /// When a deadline passes the session probes every shard (step_query):
  /// a shard that works on the step, or a payload still in transit, extends
  /// the deadline; a re-send happens only when the probe fails (a shard does
  /// not answer within probe_timeout, or nobody has the step: it was lost).
  std::chrono::milliseconds probe_timeout{1000};
  /// A step that probes find in progress is waited for at most this many
  /// times step_timeout in all (a bound, not a deadline: 10 min by default).
  int max_wait_factor = 20;
  int max_retries = 4;              // consecutive re-sends of a step after failed probes (or whose
                                    // payload arrived corrupt): enough for a drop of a few messages
  /// Journal (issue #7): when set, every token is appended to this file as
  /// it comes (one JSON line, flushed) with the sampler's RNG state after it,
  /// after a first line holding the sampling parameters and the prompt.
  std::string journal;
  // Written into the journal's header, so that a resume on another model or
  // tokenizer is refused (tools/run.cpp): file names and XXH64 digests.
  std::string model_name, tokenizer_name;
  std::string model_path, tokenizer_path;  // absolute; empty for a built-in model
  uint64_t model_digest = 0, tokenizer_digest = 0;
  int ctx = 0;  // cluster_options::ctx (0: the file's context length)
  /// Resume: the ids a killed front end already produced (BOS first) and the
  /// RNG state after the last of them. They are prefilled like a prompt (not
  /// reported again) and generation continues from there.
  std::vector<int> resume_ids;
  uint64_t resume_rng = 0;
  /// The verified journal being resumed (model/journal.hpp): its lines are
  /// continued in `journal` with the running digest carried on.
  std::shared_ptr<const model::journal> resumed_journal;
  /// Test hook: flip a byte in every checkpoint archive of this placement
  /// index (-1: none), to show that a corrupt checkpoint is detected.
  int corrupt_checkpoints_of = -1;
  std::function<void(int token, const std::string& piece)> on_token;
  /// When set, prompt positions are prefilled one per step and this sees the
  /// logits [vocab_size] after every position (run --logits-out).
  std::function<void(int pos, const float* logits)> on_logits;
  std::function<void(const session_outcome&)> on_done;
};

caf::actor spawn_session(caf::actor_system& sys, session_spec spec);

}  // namespace cellshard::actors
