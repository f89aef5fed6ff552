// tools/cluster_flags.hpp: the command-line flags that choose where and how a
// model runs (kernels, weights, threads, in-process nodes or node daemons,
// the placement, supervision, deadlines and faults), declared once and shared
// by `run`, `serve` and `bench serve`, so each flag means the same everywhere
// (docs/CLI.md).
//
// Use: add_cluster_flags() while building the subcommand, then in its
// callback check_cluster_flags() (values and combinations, before anything
// is loaded), then apply_kernel_flags() and, once the model is loaded,
// matmul_of() and make_cluster_options(). Errors are cli_error: status 2 for
// a bad flag, naming the flag and what was expected.
#pragma once

#include "actors/cluster.hpp"
#include "kernels/backend.hpp"
#include "tools/common.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace cellshard::tools {

struct cluster_flags {
  // Kernels and weights (also used without the actor runtime by `run`).
  std::string kernels = "native", weights = "f32";  // as run's defaults
  int blas_threads = 1;
  int spe_workers = 0;  // 0 = the profile's (ps3: 6), else 1
  int threads = 0;      // kernel threads per node; 0 = the CPUs (shared among in-process nodes)
  // GGUF (issue #16): "" = the model's default (exact for F32, ggml otherwise);
  // ctx 0 = the model's context length.
  std::string matmul;
  int ctx = 0;
  // In-process nodes (issue #4).
  int nodes = 1, spares = 0, caf_threads = 2;
  std::string topology = "pipeline", profile = "host", memory;
  std::string reduce = "direct";  // --reduce: tensor groups' all-reduce (direct | scatter)
  std::string sync = "f32";       // --sync: partial sums on the wire (f32 | q8_0, topologies::sync_format)
  int expert_replicas = 1;  // --expert-replicas R (expert topologies, issue #23)
  bool print_placement = false;
  // Faults and recovery (issue #6).
  std::vector<std::string> fault_specs;
  std::string faults_file;
  int checkpoint_every = 16;
  // Floor and cap of a step's deadline (issue #20), ms.
  int step_timeout_min_ms = 2000, step_timeout_max_ms = 30000;
  int batch_size = 32;  // --batch-size: prompt positions per prefill chunk
  // Weak nodes (issue #8).
  std::string link;
  // Node daemons (issue #5): --cluster FILE.json, optionally over mutual TLS.
  std::string cluster, tls_cert, tls_key, tls_ca;
  int corrupt_chunks = 0;  // hidden test hook (issue #17): remote_options::corrupt_chunks

  /// Set by check_cluster_flags: a flag of the actor runtime was given.
  bool use_cluster = false;
};

/// The options added to a command, for check_cluster_flags.
struct cluster_flag_set {
  std::vector<CLI::Option*> runtime;  // the in-process node flags: any of them selects the actor runtime
  CLI::Option* cluster = nullptr;
  std::string tls_prefix;
};

/// Adds --kernels, --spe-workers, --weights, --matmul, --ctx, --blas-threads,
/// --threads, the "Nodes (in process)" group (--nodes ... --link, the step
/// deadlines) and the "Nodes (daemons)" group (--cluster and the
/// mutual-TLS flags, named `--<tls_prefix>tls-cert` etc.: `serve` uses the
/// plain names for its own HTTPS and passes "node-").
cluster_flag_set add_cluster_flags(CLI::App* cmd, cluster_flags& o, const std::string& tls_prefix = "");

/// Checks the combinations (--cluster excludes --nodes/--spares; the TLS flags
/// need --cluster and come all three or none) and sets o.use_cluster.
void check_cluster_flags(CLI::App* cmd, const cluster_flag_set& set, cluster_flags& o);

/// Checks --kernels and --weights, and sets the OpenBLAS threads and SPE
/// workers for the process; returns the backend.
const kernels::backend& apply_kernel_flags(const cluster_flags& o);

/// The matmul mode of --matmul, else `lm`'s default (exact for F32 weights,
/// ggml otherwise).
kernels::matmul_mode matmul_of(const cluster_flags& o, const loaded_model& lm);

/// The cluster options for model `lm`: backend, weights, matmul, context,
/// threads per node, step deadlines, nodes or the
/// daemons of --cluster (remote_host), faults of --fault/--faults, link.
/// `sessions` is the number of concurrent sessions the memory check plans for.
actors::cluster_options make_cluster_options(const cluster_flags& o, const loaded_model& lm, int sessions);

/// The exit status for a cluster that did not start (CLI.md): 2, a usage
/// error, when the error is error_code::invalid_argument (a --topology this
/// model or these nodes cannot take, a --fault for a placement index without
/// a shard), as inspect and plan report the same topology; 1 otherwise.
int exit_status_of(error_code code);

}  // namespace cellshard::tools
