// <cellshard/cluster.hpp>: cellshard's public API. Runs a Llama-family model
// (llama2.c .bin files) split over several nodes, in this process or in node
// daemons (`cellshard node`) reached over TCP/TLS, and keeps producing exactly
// the tokens one process would while nodes crash, freeze or slow down.
// Target cellshard::cellshard. No CAF header is reachable from here.
//
//   auto c = cellshard::cluster::start(opts, cellshard::hosts::in_process(4));
//   if (!c) { /* c.code(), c.message() */ }
//   cellshard::generation_request req;
//   req.prompt = "Once upon a time";
//   auto g = (*c)->generate(req, [](int, std::string_view piece) {
//     std::fputs(std::string(piece).c_str(), stdout);
//     return true;                              // false: cancel
//   });
//   if (!g) { /* g.err().partial holds the tokens produced before the error */ }
//
// Threads and callbacks:
// - every member function of cluster may be called from any thread,
//   concurrently, except that generate() and shutdown() must not be called
//   from inside a callback (they wait for the threads that run callbacks);
// - callbacks (token_callback, done_callback) run on the runtime's worker
//   threads, one call at a time per request, in token order; they must not
//   block (a slow callback delays every request sharing those threads);
// - cancelling: a token_callback returning false, or cancel(id) from any
//   thread (callbacks included). The request then ends with
//   error_code::cancelled and its partial output; every shard frees the
//   request's KV cache.
// Errors are values: start() and generate() return result<...> with an
// error_code and a message naming the file, field, node or limit; nothing
// waits without a deadline. Nothing here throws, except std::bad_alloc and a
// result's value()/err() on the wrong alternative.
// Ownership: a cluster owns its runtime (threads, sockets, shards); its
// destructor shuts it down. hosts and options are values.
#pragma once

#include <cellshard/result.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cellshard {

// ---------------------------------------------------------------- options ---

/// A kind of node: its memory budget and link (topologies/profile.cpp holds
/// the figures with their sources).
enum class node_profile : std::uint8_t {
  host,      ///< this machine: its physical memory, unshaped links
  ps3,       ///< PlayStation 3: 256 MiB, 1 Gbit/s links with 100 us per hop
  ps3_slim,  ///< PS3 slim: as ps3
  rpi5,      ///< Raspberry Pi 5 (8 GB): 8 GiB, 1 Gbit/s, 100 us
};
/// "host", "ps3", "ps3-slim", "rpi5" (the CLI's names).
const char* to_string(node_profile p);

/// The kernels that compute every matrix-vector product.
enum class kernel_backend : std::uint8_t {
  reference,  ///< portable C++, sums in llama2.c's order
  blas,       ///< OpenBLAS sgemv (default)
};
const char* to_string(kernel_backend k);

/// How weights are held in memory.
enum class weight_format : std::uint8_t {
  f32,   ///< as in the file
  q8_0,  ///< 8-bit blocks of 32 with one fp32 scale (quantized at load, or a .q8 file)
};
const char* to_string(weight_format w);

/// How the model is split over the nodes.
struct topology {
  enum class kind : std::uint8_t {
    pipeline,  ///< consecutive layers per node
    tensor,    ///< every layer's heads and FFN rows split across nodes
    hybrid,    ///< `stages` pipeline stages of `ranks` tensor ranks each
  };
  kind shape = kind::pipeline;
  int stages = 0;  ///< pipeline/hybrid: stages (0: one per node)
  int ranks = 0;   ///< hybrid: ranks per stage

  static topology pipeline(int stages = 0) { return {kind::pipeline, stages, 0}; }
  static topology tensor() { return {kind::tensor, 0, 0}; }
  static topology hybrid(int stages, int ranks) { return {kind::hybrid, stages, ranks}; }
};
/// "pipeline", "pipeline:3", "tensor", "hybrid:2x2" (the CLI's --topology).
std::string to_string(const topology& t);

/// A node's outgoing links, as the link shaper models them: each message
/// occupies the link for 8 * bytes / bandwidth, then arrives `latency` later.
struct link_shape {
  std::uint64_t bandwidth_bps = 0;     ///< bits per second; 0 = unlimited
  std::chrono::microseconds latency{0};  ///< one way
};

/// A fault to inject (docs/CLI.md, --fault): `kind` fires once at position
/// `step` on placement index `node` (slow: on every step from `step` on).
enum class fault_kind : std::uint8_t { crash, silence, slow, drop, delay, corrupt, partition };
struct fault {
  fault_kind kind = fault_kind::crash;
  int node = 0;              ///< placement index
  std::uint64_t step = 0;    ///< token position at which it fires
  /// silence/partition: how long (0 = for ever); slow: added per step
  /// (required); delay: how long each message is held (required).
  std::chrono::milliseconds duration{0};
  /// drop/delay/corrupt: messages affected (0 = 1); slow: steps affected
  /// (0 = all from `step` on).
  std::uint32_t count = 0;
};

/// Mutual TLS between front end and daemons: all three files or none
/// (plain TCP). PEM files; the key must be unencrypted.
struct tls_settings {
  std::string cert_file;  ///< this side's certificate (chain)
  std::string key_file;   ///< its private key
  std::string ca_file;    ///< the CA that signs every node's certificate
};

/// Supervision of the shards: checkpoints, restarts and the failure detector.
struct supervision_options {
  int checkpoint_every = 16;                        ///< positions between KV checkpoint deltas
  std::uint32_t max_restarts = 3;                   ///< at most this many restarts ...
  std::chrono::milliseconds restart_period{10000};  ///< ... within this period
  std::chrono::milliseconds heartbeat{100};         ///< heartbeat interval of every node
};

struct cluster_options {
  std::string model_path;      ///< llama2.c checkpoint (.bin) or cellshard q8_0 file (.q8)
  std::string tokenizer_path;  ///< "" = tokenizer.bin beside the model
  topology layout;
  kernel_backend kernels = kernel_backend::blas;
  weight_format weights = weight_format::f32;
  int sessions = 1;      ///< concurrent requests the memory check plans for
  int threads = 2;       ///< runtime worker threads
  /// Deadline of one step: the ceiling (and the first prefill deadline's
  /// ceiling), and the floor of a decode step's adaptive deadline.
  std::chrono::milliseconds step_timeout{30000};
  std::chrono::milliseconds step_timeout_min{2000};
  supervision_options supervision;
  std::vector<fault> faults;
};

// ------------------------------------------------------------------ hosts ---

/// Where the shards run. A value (copies share the same description).
class hosts {
public:
  /// `nodes` logical nodes in this process (+ `spares` held in reserve), each
  /// with `profile`'s memory budget and link.
  static hosts in_process(int nodes, node_profile profile = node_profile::host, int spares = 0);
  /// As above with a memory budget per node (bytes; 0 = the profile's) and
  /// links (bandwidth 0 and latency 0 = the profile's).
  static hosts in_process(int nodes, node_profile profile, int spares, std::uint64_t memory_bytes,
                          link_shape link);

  /// Node daemons listed in a cluster file (docs/CLI.md, --cluster):
  ///   {"nodes": [{"host": "127.0.0.1", "port": 4242, "profile": "ps3",
  ///               "spare": false, "memory": "256MiB"}, ...]}
  /// Reads the file and checks the TLS files now; connects in cluster::start.
  /// Errors: io (file), bad_format (content), invalid_argument (TLS files).
  static result<hosts> daemons(const std::string& cluster_file, const tls_settings& tls = {},
                               std::chrono::milliseconds connect_timeout = std::chrono::seconds(5));

  /// Nodes offered to the placement, spares included.
  int nodes() const;

  struct impl;

private:
  friend class cluster;
  explicit hosts(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

// ------------------------------------------------------------- generation ---

struct generation_request {
  std::string prompt;          ///< "" = start from BOS alone
  int steps = 256;             ///< positions to run; 0 or > the context = the whole context
  float temperature = 1.0f;    ///< 0 = greedy
  float top_p = 0.9f;          ///< nucleus sampling; outside [0, 1] = 0.9
  std::uint64_t seed = 0;      ///< 0 = from the clock
  std::chrono::milliseconds deadline{std::chrono::minutes(10)};  ///< generate() only
};

/// One fault seen during a request, and how it was repaired.
struct recovery_event {
  std::string kind;             ///< a fault_kind name, or node-down / node-silent / ...
  int index = -1;               ///< placement index of the shard
  int node = -1;                ///< node it ran on
  int moved_to_node = -1;       ///< node it runs on after recovery
  double detect_ms = -1;        ///< fault -> decision (-1: unknown)
  double recover_ms = -1;       ///< decision -> next token (-1: not recovered)
};

/// One recovery a request went through: shards restarted (or moved) and the
/// positions recomputed from a checkpoint.
struct request_recovery {
  std::vector<int> indices;     ///< placement indices restarted
  int position = 0;             ///< first position of the step in flight
  int restored_to = 0;          ///< checkpoint position: [0, restored_to) restored
  int replayed_positions = 0;   ///< positions recomputed
  double recover_ms = 0;        ///< restart notice -> next token
};

struct generation {
  std::vector<int> ids;         ///< BOS, prompt tokens, then sampled tokens
  int prompt_tokens = 0;        ///< leading ids that are BOS and prompt
  std::string text;             ///< the pieces of every id after BOS (prompt, then sampled), concatenated
  double ttft_ms = 0;           ///< start -> first sampled token
  std::vector<double> step_ms;  ///< time of each sampled token after the first
  double duration_ms = 0;
  double tokens_per_s = 0;
  int retries = 0;              ///< steps re-sent after their deadline passed
  std::vector<request_recovery> recoveries;
};

/// A failed or cancelled generation: code and message, and every token
/// produced before it stopped.
struct generation_error : error {
  generation partial;
};
using generation_result = result<generation, generation_error>;

/// Called once per position after BOS, in order: first each prompt token
/// (prompt_tokens - 1 calls), then each sampled token, with its id and text
/// piece (as `cellshard run` prints them); return false to cancel the
/// request. Runs on a runtime thread (see the top of this file).
using token_callback = std::function<bool(int token, std::string_view piece)>;
/// Called once when a submitted request ends, on a runtime thread.
using done_callback = std::function<void(generation_result)>;

// ---------------------------------------------------------------- cluster ---

class cluster {
public:
  /// Loads the model and tokenizer, places the model on `where` (checking
  /// every node's memory before anything is loaded), starts the shards.
  /// Errors: io, bad_format (files), invalid_argument / unsupported (options,
  /// placement), unavailable (daemons unreachable), timeout.
  static result<std::unique_ptr<cluster>> start(const cluster_options& opts, const hosts& where);
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// Runs one request to its end, or to req.deadline (error timeout).
  /// Faults are recovered underneath; the error unavailable means recovery
  /// was impossible. Every error carries the partial output.
  generation_result generate(const generation_request& req, token_callback on_token = {});

  /// Starts a request and returns its id at once; on_done is called exactly
  /// once (also after cancel() and shutdown()).
  std::uint64_t submit(const generation_request& req, token_callback on_token, done_callback on_done);
  /// Cancels a submitted request (no effect once it ended).
  void cancel(std::uint64_t request);

  /// Every fault seen so far, injected or not, in the order they happened.
  std::vector<recovery_event> faults() const;
  /// The node each placement index runs on now (changes when a shard moves).
  std::vector<int> current_nodes() const;
  /// "pipeline:4 on 4 nodes: node 0 layers [0, 2) ..." (as `cellshard run`).
  std::string describe_placement() const;
  int vocab_size() const;
  int context_length() const;
  /// XXH64 of the model file.
  std::uint64_t model_digest() const;

  /// Stops every shard and the runtime; later submits end at once with
  /// error unavailable. Idempotent; the destructor calls it.
  void shutdown();

  struct impl;

private:
  explicit cluster(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace cellshard
