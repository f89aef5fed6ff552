// topologies/plan_calibrate.hpp: fitting the planner's free constants to a
// measured sweep (`cellshard plan --calibrate sweep.csv`, issue #10).
//
// Input: the CSV `cellshard sweep` writes (CLI.md): a header line naming the
// columns model,topology,nodes,stages,tp,link,batch,ttft_ms,tpot_ms_p50,
// tpot_ms_p99,tokens_per_s,comm_share,bytes_per_token (in any order; extra
// columns ignored; lines starting with '#' skipped), and when present
// decode_tokens_per_s and decode_comm_share (what the validation compares).
//
// Model (planner.hpp cost_terms; docs/planner.md "Calibration"): every row
// is planned as the runtime that measured it steps: one sequence per station
// step (plan_assumptions::one_sequence_per_step), so a row of batch B takes
// max(chain, B x the busiest station's CPU) per token. In either regime the
// time is linear in eleven constants:
//   chain = wire_s + throttle_s + compute_s / eff + messages x c_msg
//           + expert_messages x c_xmsg + syncs x c_sync
//           + sync_messages x c_rmsg + bytes x c_byte
//           + transfer_s x transfer_excess
//   busy  = B x (compute_s / (e x quota) + handled x c_cpu
//                + sync_handled x c_rcpu + syncs x c_rround + bytes x c_byte)
// where e = eff at batch 1 and e = eff_b (batch_compute_efficiency) when
// B > 1 sequences interleave on the station, and c_rcpu is the CPU of a
// message inside an all-reduce round (c_cpu: hop, session and expert
// messages) and c_rround (sync_cpu_s) the CPU per round a busy rank takes
// part in.
// where the terms come from the layout of the row (its model, nodes,
// topology, batch, link) on the given hardware. The fit assigns each row its
// regime, minimises the sum of squared relative errors ((pred - meas) /
// meas)^2 subject to every constant >= 0 (non-negative least squares by
// trying every subset of free constants), re-assigns and repeats; from three
// starting assignments, keeping the lowest error of the max() model. On
// hardware with a CPU quota (hardware_spec::cpu_quota: the lab) throttle_s
// depends on eff, which is then searched (log grid, golden section) with the
// others fitted at each candidate. Constants whose feature is zero in
// every row keep the base value (on in-process rows, link "none", the per-byte
// and transfer terms are zero), except c_xmsg (expert dispatch/combine
// messages, seconds each), which without rows of the runtime's expert
// placement takes the fitted c_msg, c_rcpu, which without busy TP rows takes
// c_cpu, and eff_b, which without busy batch > 1 rows is eff (0 in
// plan_assumptions). Each fitted constant lists its source rows.
// Rows of topology "expert" (sweep: one stage shard + N - 1 expert nodes) or
// "expert:E" are planned as pipeline:1,expert:N-1 / pipeline:1,expert:E.
// The fitted constants carry no one_sequence_per_step flag: a plan made with
// them keeps the planner's batched stations.
//
// Pure functions; thread-safe. Errors name the file, line and column.
#pragma once

#include "model/result.hpp"
#include "topologies/planner.hpp"

#include <functional>
#include <string>
#include <vector>

namespace cellshard::topologies {

struct sweep_row {
  int line = 0;  // 1-based line in the file
  std::string model;
  std::string topology;  // "pipeline", "tensor", "hybrid:2x2", "expert" (the runtime's), ...
  int nodes = 0;
  int stages = 0;  // 0 = not given
  int tp = 0;
  std::string link;  // "" or "unlimited" = as the hardware's link; else BANDWIDTH:LATENCY
  int batch = 1;
  double ttft_ms = 0;
  double tpot_ms_p50 = 0;
  double tpot_ms_p99 = 0;
  double tokens_per_s = 0;
  double comm_share = 0;
  double bytes_per_token = 0;
  /// The decode-only figures (sweep's decode_tokens_per_s and
  /// decode_comm_share: no first token, no prompt, the batch's common decode
  /// window); -1 when the CSV lacks them. The validation compares the
  /// predictions with these when present, else with tokens_per_s and comm_share.
  double decode_tokens_per_s = -1;
  double decode_comm_share = -1;
  /// The decode's mean time between a sequence's tokens, in ms (column
  /// decode_tpot_ms when the CSV has it); -1 when not given.
  double decode_tpot_ms = -1;
};

/// The time per output token the fit and the validation use, in ms: the
/// decode's mean time between a sequence's tokens (the steady state the
/// planner predicts; TPOT as serving benchmarks define it, (last token -
/// first token) / (tokens - 1) per request): the row's decode_tpot_ms when
/// given, else batch x 1000 / decode_tokens_per_s (the batch's sessions
/// share the decode window, so each makes decode_tokens_per_s / batch tokens
/// per second), else tpot_ms_p50 (older CSVs). Since 2026-12-07: before, the
/// p50 of the first session's step times, which a CPU quota's 10 ms periods
/// round to whole periods (the lab at 12% of a core: 30.0, 40.0, 60.0 ms).
double measured_tpot_ms(const sweep_row& row);

/// Parses the sweep CSV. Required columns: model, topology, nodes,
/// tpot_ms_p50; the others default (batch 1). Errors: "sweep.csv line 4:
/// column 'nodes': 'x' is not a number".
result<std::vector<sweep_row>> parse_sweep_csv(const std::string& text, const std::string& name);

struct calibration_point {
  int line = 0;          // the row's line in the CSV
  std::string model;
  std::string topology;  // as planned (resolved)
  int nodes = 0;
  int batch = 1;
  std::string link;      // the row's link column
  double measured_tpot_ms = 0;   // measured_tpot_ms(row): the decode's mean
  double predicted_tpot_ms = 0;
  double error = 0;  // (predicted - measured) / measured
  /// The row's tpot_ms_p50 (the first session's median step) and the
  /// prediction's error against it, shown beside the mean's.
  double measured_tpot_p50_ms = 0;
  double p50_error = 0;
  /// tokens/s: measured (the row's decode_tokens_per_s, else its
  /// tokens_per_s; 0 when the CSV lacks both) and predicted.
  double measured_tokens_per_s = 0;
  double predicted_tokens_per_s = 0;
  double tokens_per_s_error = 0;  // (predicted - measured) / measured; 0 without a measurement
  /// Communication share: measured (the row's decode_comm_share, else its
  /// comm_share) and predicted (predicted_comm_share).
  double measured_comm_share = 0;
  double predicted_comm_share = 0;
};

/// A fitted constant and the rows it was fitted from.
struct fitted_constant {
  std::string name;        // plan_assumptions member: "compute_efficiency", "message_cpu_s", ...
  double value = 0;
  bool fitted = false;     // false: no row has its feature; the base value stays
  std::vector<int> lines;  // the CSV lines of its source rows
  int chain_rows = 0;      // of which planned as the serial chain (latency)
  int busy_rows = 0;       // of which planned as B x a busy station (throughput)
};

struct calibration {
  plan_assumptions fitted;  // base with the eleven constants replaced
  std::vector<fitted_constant> constants;  // the eleven: efficiency, c_msg, c_sync, c_rmsg, c_byte,
                                           // transfer excess, c_cpu, c_xmsg, c_rcpu, eff_b, c_rround
  std::vector<calibration_point> points;
  double max_abs_error = 0;
  double rms_error = 0;
  std::vector<std::string> free;  // the constants the data could fit
  int skipped = 0;                // rows left out (none since batch rows are fitted; kept for the JSON)
};

/// The model of a row: a preset name, or a file name such as
/// "stories260K.bin" (lower-cased, folder and extension dropped).
using model_resolver = std::function<result<model_spec>(const std::string& row_model)>;
/// The communication share the planner predicts for a row planned as the
/// runtime runs it (what `cellshard run` measures: 1 - a session's compute
/// time / its time per token): the chain's compute (throttled by a CPU
/// quota) against the time per token, in either regime (when busy stations
/// set the pace, the wait for the other sessions' steps is not compute).
double predicted_comm_share(const plan_result& p);

/// The default resolver: find_model_preset on the row's model name, else
/// `fallback` (the --model of the command) when given.
model_resolver preset_resolver(const model_spec* fallback);

/// Fits `base.assume`'s compute_efficiency, message_overhead_s,
/// sync_overhead_s and byte_overhead_s to the rows. `base` gives the hardware
/// (where the sweep ran), context and the other assumptions; each row gives
/// model, nodes, topology, batch and link. Errors: no usable rows, a row whose
/// topology or model the planner rejects (named by line).
result<calibration> calibrate(const std::vector<sweep_row>& rows, const plan_request& base,
                              const model_resolver& resolve);

/// Which rows a validation holds out of the fit (issue #25), chosen from the
/// rows alone, so the split is the same on every run:
///   every:K[:J]  the rows whose position among the rows (in file
///                order, from 0) is J modulo K (J defaults to K - 1);
///   nodes:N      the rows with N or more nodes (extrapolation in scale);
///   last:N       the last N rows in file order (runs appended later: fresh
///                points the fit never saw).
struct holdout_rule {
  enum kind_t { every, nodes_at_least, last } kind = every;
  int n = 2;       // K, or N
  int offset = 1;  // J (every)
};
/// Parses "every:4", "every:4:0", "nodes:8", "last:12". Errors say what was expected.
result<holdout_rule> parse_holdout(const std::string& text);
/// "every:4:3" / "nodes:8" / "last:12".
std::string to_string(const holdout_rule& h);

/// A fit on the training rows and its predictions for the held-out ones.
struct validation {
  holdout_rule rule;
  calibration fit;                       // fitted on the rows not held out
  std::vector<calibration_point> held_out;
  double max_abs_error = 0;              // held-out tpot, the largest |error|
  double max_abs_tokens_per_s_error = 0; // held-out tokens/s
  double max_abs_comm_share_error = 0;   // held-out comm share, absolute
  int skipped = 0;                       // rows left out of both (none today)
};
/// Fits on the rows `rule` does not hold out and predicts the others with
/// the fitted constants. Errors: as calibrate, and a split that leaves no
/// training or no held-out row.
result<validation> validate(const std::vector<sweep_row>& rows, const plan_request& base,
                            const model_resolver& resolve, const holdout_rule& rule);

/// The spread of the fit (issue #25: an uncertainty band on every headline
/// number): the constants refitted once without each row in turn
/// (leave-one-out; one set per row, in row order). A plan made with each set
/// bounds how much the answer depends on any single measurement. Errors: as
/// calibrate; fewer than 3 rows.
result<std::vector<plan_assumptions>> leave_one_out(const std::vector<sweep_row>& rows, const plan_request& base,
                                                    const model_resolver& resolve);

/// The plan request of one row on `base` (exposed for tests and the tool).
result<plan_request> request_for_row(const sweep_row& row, const plan_request& base, const model_resolver& resolve);

}  // namespace cellshard::topologies
