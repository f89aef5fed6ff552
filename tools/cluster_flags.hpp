// tools/cluster_flags.hpp: the command-line flags that choose where and how a
// model runs on the actor runtime (in-process nodes or node daemons, the
// placement, supervision and faults, kernels and weights), shared by `serve`
// and `bench serve`. Each flag means what run's flag of the same name means
// (docs/CLI.md); `run` still declares its own copy of these flags (with its
// input validation and its own extra ones: --threads, --step-timeout-*), so a
// change to one of them is to be made in both places until run uses this.
//
// Use: add_cluster_flags() while building the subcommand, then in its
// callback check_cluster_flags() (combinations), then make_cluster_options()
// once the model is loaded. Errors are cli_error: status 2 for a bad flag,
// naming the flag and what was expected.
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
  // In-process nodes (issue #4).
  int nodes = 1, spares = 0, caf_threads = 2;
  std::string topology = "pipeline", profile = "host", memory;
  bool print_placement = false;
  // Faults and recovery (issue #6).
  std::vector<std::string> fault_specs;
  std::string faults_file;
  int checkpoint_every = 16;
  // Weak nodes (issue #8).
  std::string link;
  // Node daemons (issue #5): --cluster FILE.json, optionally over mutual TLS.
  std::string cluster, tls_cert, tls_key, tls_ca;

  /// Set by check_cluster_flags: a flag of the actor runtime was given.
  bool use_cluster = false;
};

/// The options added to a command, for check_cluster_flags.
struct cluster_flag_set {
  std::vector<CLI::Option*> runtime;  // the in-process node flags: any of them selects the actor runtime
  CLI::Option* cluster = nullptr;
  std::string tls_prefix;
};

/// Adds --kernels, --weights, --blas-threads, the "Nodes (in process)" group
/// (--nodes ... --link) and the "Nodes (daemons)" group (--cluster and the
/// mutual-TLS flags, named `--<tls_prefix>tls-cert` etc.: `serve` uses the
/// plain names for its own HTTPS and passes "node-").
cluster_flag_set add_cluster_flags(CLI::App* cmd, cluster_flags& o, const std::string& tls_prefix = "");

/// Checks the combinations (--cluster excludes --nodes/--spares; the TLS flags
/// need --cluster and come all three or none) and sets o.use_cluster.
void check_cluster_flags(CLI::App* cmd, const cluster_flag_set& set, cluster_flags& o);

/// Checks --kernels and --weights, and sets the OpenBLAS threads and SPE
/// workers for the process; returns the backend.
const kernels::backend& apply_kernel_flags(const cluster_flags& o);

/// The cluster options for model `lm`: backend, weights, nodes or the
/// daemons of --cluster (remote_host), faults of --fault/--faults, link.
/// `sessions` is the number of concurrent sessions the memory check plans for.
actors::cluster_options make_cluster_options(const cluster_flags& o, const loaded_model& lm, int sessions);

}  // namespace cellshard::tools
