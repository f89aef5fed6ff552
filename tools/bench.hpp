// tools/bench.hpp: `cellshard bench` rows and the cluster benchmark.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cellshard::tools {

/// One measured row: name, parameters, value with unit, and the baseline
/// measured in the same run with the ratio value / baseline (CLI.md "bench").
struct bench_row {
  std::string name;
  std::map<std::string, std::string> params;
  double value = 0;
  std::string unit;
  double baseline = -1;  // < 0: none
  std::string baseline_name;
  double ratio = 0;
};

struct cluster_bench_options {
  std::string model, tokenizer;
  std::vector<int> nodes = {1, 2, 4, 8};
  int steps = 128;        // stories260K
  int large_steps = 12;   // synthetic stories110m
  int reps = 3;
  bool skip_large = false;
  std::string kernels = "native";
  int caf_threads = 2;
  /// Tensor groups run once per algorithm (`--reduce`): rows carry "reduce",
  /// and the bytes rows of scatter have the direct run of the same point as
  /// baseline (issue #19).
  std::vector<std::string> reduces = {"direct", "scatter"};
  std::string large_config = "stories110m";  // synth preset of the large model
  /// --moe (issue #23): instead of the above, expert placements of a mixture
  /// of experts (the -m model; default ../shared/models/gguf/moe-small-f32.gguf):
  /// expert:E for each of `experts`, with and without replicas, against one
  /// node; then the stall of a crashed and a silenced expert node.
  bool moe = false;
  std::vector<int> experts = {1, 2, 4, 8};
  /// --overlap (issue #19, tools/bench_overlap.cpp): instead of the above,
  /// aggregate tokens/s of N concurrent sessions on a pipeline of S stages
  /// against 1 session (alternating rounds, same cluster), in this process
  /// and over local daemons, with each stage's busy share.
  bool overlap = false;
  std::vector<int> sessions = {1, 2, 4};      // first: the baseline (1)
  std::vector<int> stages = {2, 3};
  std::vector<std::string> where = {"inproc", "daemons"};
  std::string overlap_config = "stories15m";  // synth preset when no -m
  int overlap_steps = 48;                     // positions per session
};

int run_cluster_bench(const cluster_bench_options& o, std::vector<bench_row>& rows);
/// bench cluster --overlap (tools/bench_overlap.cpp).
int run_overlap_bench(const cluster_bench_options& o, std::vector<bench_row>& rows);

/// `bench load` (issue #17, tools/bench_load.cpp).
struct load_bench_options {
  std::vector<std::string> models;  // "": ../shared's stories260K.bin, llama2-small-f32.gguf, synth stories15m
  std::string tokenizer;            // for -m models ("": the model itself, a GGUF)
  int stages = 8, stage = 3;        // the slice: pipeline stage `stage` of `stages`
  bool skip_ship = false, skip_synth = false;
  int window = 2;           // chunks in flight when shipping (remote_options::ship_window)
  int baseline_window = 1;  // the load.ship_transfer row's baseline: one chunk per round trip
};
int run_load_bench(const load_bench_options& o, std::vector<bench_row>& rows);

struct recovery_bench_options {
  std::string model, tokenizer;
  int nodes = 3;                                  // + 1 spare
  std::vector<int> checkpoint_every = {4, 16, 64};
  std::vector<int> contexts = {37, 133, 301};     // positions at which the fault fires (greedy
                                                  // stories260K reaches 346 before BOS)
};

int run_recovery_bench(const recovery_bench_options& o, std::vector<bench_row>& rows);

/// `bench recovery --processes`: node daemon processes on loopback (`nodes`
/// working + `spares`), a fault-free paced baseline, then `repeat` times a
/// SIGKILL of the daemon hosting placement index 1 and a SIGSTOP of the one
/// hosting index 2 at the `at`-th token; detection (signal -> the runtime's
/// decision), recovery (decision -> next token), positions replayed, and the
/// ids checked against the baseline's. Writes rows JSON, the timeline CSVs
/// and recovery_timeline.png (gnuplot) into `out`.
struct recovery_process_bench_options {
  std::string model, tokenizer;
  std::string topology = "pipeline";
  int nodes = 3;        // working daemons
  int spares = 2;       // spare daemons
  int repeat = 3;       // kills and freezes each
  int steps = 160;      // positions per run (greedy)
  int at = 40;          // act when this many tokens were delivered
  int pace_ms = 20;     // slow fault on placement index 0 (0: unpaced)
  int checkpoint_every = 16;
  int deadline_s = 60;  // per run
  std::string out = "bench-recovery";
  bool plot = true;
};

int run_recovery_process_bench(const recovery_process_bench_options& o, std::vector<bench_row>& rows);

/// `bench failures` (issue #25): goodput of node daemons on loopback without
/// and with one working daemon signalled (SIGKILL, or SIGSTOP: silent) every
/// `every_s`, spares taking over, against topologies::simulate of the same
/// layout (tools/bench_failures.cpp says what is compared).
struct failures_bench_options {
  std::string model, tokenizer;  // "": a synthetic 8-layer model written to `out`, tok512
  std::string topology = "pipeline";
  int nodes = 8;           // working daemons
  int spares = -1;         // -1: one per failure in the window, plus one
  double duration_s = 60;  // each phase
  double every_s = 10;     // between two signals
  std::string signal = "kill";  // kill | stop
  int batch = 2;           // concurrent sessions (closed loop)
  int steps = 64;          // positions per request
  int checkpoint_every = 16;
  int rounds = 3;          // (fault-free, with failures) pairs; killed daemons restarted between rounds
  int deadline_s = 60;     // for the sessions still running at the end of a phase
  std::string out = "bench-failures";
  double cpu_percent = 0;  // > 0: each daemon capped at this % of one core (a cgroup; needs root)
};

int run_failures_bench(const failures_bench_options& o, std::vector<bench_row>& rows);

/// `bench peers` (issue #18): builds llama2.c's run.c (`gcc -Ofast
/// -march=native run.c -lm`, and with -fopenmp as runomp) into a temporary
/// folder and runs it and `cellshard run --kernels native` in alternation
/// (`repeat` rounds) on the same f32 model (default: `synth --config
/// stories110m -s 1` written there) with llama2.c's tokenizer.bin, greedy,
/// `steps` positions, reading each one's "achieved tok/s" from stderr. Rows:
/// cellshard 1 thread / run.c, cellshard 2 threads / runomp with
/// OMP_NUM_THREADS=2, q8_0 and q4_0 (quantized at load) / cellshard f32, each
/// at 1 thread, in exact precision and with --matmul ggml (a contender whose
/// run fails, e.g. an option this build lacks, is left out with its
/// message): the median of the per-round ratios. Runs subprocesses
/// through the shell, each under `timeout deadline_s`.
struct peers_bench_options {
  std::string model, tokenizer;
  std::string peers;  // folder holding run.c ("": ../shared/peers/llama2.c)
  int steps = 128;
  int repeat = 3;
  int deadline_s = 600;
  bool keep = false;  // keep the temporary folder
  /// Rows to measure (only their contenders run): f32_1t, f32_2t, q8_0_1t,
  /// q4_0_1t, q8_0_ggml_1t, q4_0_ggml_1t. Empty: all.
  std::vector<std::string> pairs;
};

int run_peers_bench(const peers_bench_options& o, std::vector<bench_row>& rows);

/// `bench peers --cluster` (issue #19): cellshard over node daemons against
/// distributed-llama over its workers, both on loopback, same weights.
///  - distributed-llama is built from `dllama` (its Makefile and src/ copied
///    into OUT/dllama-build, `make dllama`; reused when OUT already holds it);
///  - the model is `model` or `synth --config CONFIG -s 1` written to
///    OUT/models/model.bin, converted with `converter` (l2c_to_dllama.py) to
///    OUT/model.m and OUT/model.t (byte copies of the same f32 weights);
///  - for each N in `nodes`: N-1 `dllama worker` processes (one thread,
///    --net-turbo 0) and N `cellshard node --threads 1` daemons are started
///    and kept for the `repeat` rounds; a round runs `dllama inference` (root
///    plus workers: N processes, f32 weights, f32 sync, greedy, empty prompt,
///    `steps` positions), `cellshard run --cluster --topology tensor` and,
///    for N >= 2, `--topology pipeline` (same daemons, greedy, empty prompt,
///    `steps` positions), the order reversed every other round.
/// Rows: cellshard tok/s / distributed-llama tok/s, the median of the
/// per-round ratios, per N and topology, with both sides' split of a token's
/// time into compute and the rest. The two tokens/s do not count the same
/// thing: distributed-llama's "Prediction tokens/s" is positions / the
/// executor's time (its ops plus its syncs, summed over forwards: sampling,
/// decoding and printing excluded); cellshard's "achieved tok/s" is positions
/// after the first / front-end wall time from the end of the first forward to
/// the end of the last (sampling, the logits' hop to the front end and every
/// wait included). cellshard runs N daemons plus a front end (N + 1
/// processes); distributed-llama's root is one of its N. Every child is
/// SIGKILLed and reaped before the next N. Subprocesses run under
/// `timeout deadline_s`.
struct peers_cluster_bench_options {
  std::string model, tokenizer;
  std::string config = "stories110m";  // synth preset when no model
  std::string dllama;                  // distributed-llama sources ("": ../shared/peers/distributed-llama)
  std::string converter;               // l2c_to_dllama.py ("": ../shared/peers/tools/l2c_to_dllama.py)
  std::string out;                     // "" = a temporary folder, removed unless keep
  std::vector<int> nodes = {1, 2, 4};
  int steps = 128;
  int repeat = 3;
  int deadline_s = 600;
  bool pipeline = true;
  bool keep = false;
  std::string reduce;                  // passed to cellshard run --reduce when not empty
  /// cellshard's tensor partial sums on the wire: "f32" or "q8_0" (run
  /// --sync; rows get "_q8_0"). distributed-llama runs --buffer-float-type
  /// f32 either way: its q80 sync needs Q40 weights (no Q80 x F32 matmul on
  /// its CPU), and l2c_to_dllama.py writes F32 weights.
  std::string sync = "f32";
  /// Idle-worker policies of cellshard's daemons and front end
  /// (CELLSHARD_CAF_IDLE: poll or wake, actors/tls.hpp); one daemon set and
  /// one contender per topology each. Default: wake, the runtime's default.
  std::vector<std::string> idle = {"wake"};
  /// Where the daemons' tensor partial sums go (CELLSHARD_DATA_PLANE: socket,
  /// the data plane of actors/data_plane.hpp, or caf); one daemon set and one
  /// contender per topology for every (idle, data) pair.
  std::vector<std::string> data = {"socket"};
};

int run_peers_cluster_bench(const peers_cluster_bench_options& o, std::vector<bench_row>& rows);

/// Prints rows as a table and returns them as JSON text.
std::string print_rows(const std::vector<bench_row>& rows);

/// `bench prefill` (issue #18): the single-node engine on `model` (default:
/// `synth --config CONFIG -s 1` in memory) feeds `positions` prompt
/// positions one at a time (forward) and as engine::prefill in chunks of
/// `batch_size`, alternating, `repeat` rounds, per weight format; rows: prompt
/// tokens/s batched (value) against one at a time (baseline), the median of
/// per-round ratios, and whether the last logits were identical (status 1 if
/// not).
struct prefill_bench_options {
  std::string model;
  std::string config = "stories15m";
  std::vector<std::string> weights = {"f32", "q8_0", "q4_0"};
  std::string kernels = "native";
  int positions = 256;
  int batch_size = 32;
  int threads = 1;
  int repeat = 3;
  bool cpu_time = false;  // time with the thread's CPU clock (threads == 1): a shared machine
};

int run_prefill_bench(const prefill_bench_options& o, std::vector<bench_row>& rows);

}  // namespace cellshard::tools
