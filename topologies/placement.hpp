// topologies/placement.hpp: the plan as data (STYLE.md item 4). A pure
// function turns (model config, node specs, strategy, options) into a
// placement: the shards with their layer ranges and head/FFN slices, the
// stages in order, the exchange steps of one position, each shard's program
// (the ops it executes for every step, in order: shard_step), the spares,
// and the memory each shard needs, checked against its node's budget before
// anything is loaded. actors/ executes a placement -- each shard actor runs
// its program -- and decides nothing about splitting or exchange order.
//
// Strategies (CLI.md `--topology`):
// - pipeline: S stages, each one shard holding a contiguous layer range with
//   all heads and FFN units. S = min(layers, nodes) unless given
//   ("pipeline:S"). Layer counts follow split_weighted() with weight = node
//   memory budget and capacity = the layers that fit in that budget: equal
//   nodes get equal counts (floor/ceil when layers % S != 0, the extra layers
//   going first to middle stages, then to stage 0, because stage 0 carries the
//   embedding and the last stage the classifier); nodes with less memory get
//   fewer layers.
// - tensor: one stage, a tensor-parallel (TP) group of T shards; each holds,
//   for every layer, a slice of the KV heads [kv0,kv1), the matching query
//   heads [kv0*kv_mul, kv1*kv_mul) (wq, wk, wv by rows, wo by columns) and a
//   slice of the FFN hidden units [f0,f1) (w1, w3 by rows, w2 by columns),
//   split with split_even() (4 KV heads over 3 -> 2,1,1; 172 units -> 58,57,57),
//   except when w2 keeps a GGUF file's block type that the even split would
//   cut and there are at least as many blocks as ranks: then the FFN units
//   are dealt in whole blocks of w2's type (768 q4_K units, 3 super-blocks of
//   256, over 2 -> 512,256), so no rank holds its w2 columns dequantized to
//   f32 (placement.cpp ffn_split). T = min(kv heads, nodes) unless given
//   ("tensor:T").
// - hybrid:PxT: P pipeline stages, each a TP group of T shards; layers split
//   as for pipeline, with weight = the smallest budget in the group and
//   capacity = the layers every rank of the group can hold.
// - expert (issue #23): "pipeline:P,expert:E" (or "expert:E" = pipeline:1,
//   expert:E), mixture-of-experts models only. P stages, each one stage shard
//   (a group of one: attention, router and shared expert of its layers, and the
//   embedding / classifier as for pipeline) plus E expert nodes that hold the
//   routed experts of the stage's layers and nothing else: P + P x E nodes.
//   Every expert of a stage is held by R = strategy::expert_replicas distinct
//   expert nodes of that stage (1 <= R <= E), the same experts for every layer
//   of the stage. Assignment (assign_experts): experts in index order, replica
//   j of expert e to expert node (e + j) mod E of the stage (round-robin)
//   when that node has room left for it (budget minus the experts given so
//   far) and does not hold it yet, else to the node with the most room left:
//   equal nodes get round-robin, smaller nodes fewer experts.
//   Layers split as for pipeline, with capacity = the layers both the stage
//   shard and its fullest expert node can hold.
// Nodes are taken in node-spec order (spare-flagged ones skipped): stage s,
// rank r -> the (s * T + r)-th available node; expert placement: stage s's
// shard, then its E expert nodes -> the next 1 + E available nodes.
// Limits: stages <= layers, T <= KV heads, P*T <= available nodes, T <= FFN units;
// expert: E <= experts, R <= E, P x (1 + E) <= available nodes.
//
// Where the embedding and the classifier live (every strategy): rank 0 of the
// first stage holds the token embedding table; every rank of the last stage
// holds the final RMSNorm and a slice of the classifier's rows (the
// vocabulary split_even over its T ranks, rank order), computes those logits
// from x (which every rank has after the last all-reduce) and sends them to
// the session, which joins the slices into the whole vector before sampling
// (issue #19: rank 0 no longer reads the whole classifier alone; each logit
// is the same row dot product as on one node, so the vector is bit-identical).
// With a shared classifier a rank reads its rows from the embedding table
// (counted once when the same shard holds the embedding). With T > 1
// the embedding holder broadcasts x to the rest of its group (one dim-vector
// per position) rather than every rank keeping a copy of the table: on a
// 256 MiB node the table (vocab x dim) is the scarce thing, the message is not.
// After a stage's last all-reduce every rank has x; rank 0 forwards it.
//
// Placement index (CLI.md `--fault node=N`): stage-major, then rank within the
// TP group (expert placement: the stage shard, then its expert nodes), spares
// last (shards.size() + position in `spares`).
//
// Expert placement, what runs where (per MoE layer l of stage s, per step):
// the stage shard runs `compute [l,l+1) attention` (x += its output, a group of
// one), then `dispatch layer l`: on its worker rmsnorm(x) -> xb, the router,
// softmax and top-k (model/moe.hpp route), and the shared expert's output;
// then for every chosen (position, expert) pair it sends xb to one live
// holder of that expert (holders[e], first live one from a start that rotates
// with the position, spreading load over replicas); only the expert nodes so
// named compute. `combine layer l` waits for every pair's expert output and
// adds, per position, w_0 y_0 + w_1 y_1 + ... in the router's chosen order
// (exactly model::moe_ffn's order on one node), then the shared expert's
// output, and x += that sum: ids are bit-identical to one node. An expert
// node's program is one op, `expert layers [a,b) holding {e...}`: for every
// request it computes each asked (row, expert) pair's SwiGLU and returns the
// outputs in the request's order. Expert nodes hold no per-session state (no
// KV cache): a request can be re-sent to a replica or a restarted node.
//
// Memory of a shard (bytes; all matrices in options.weights' format, RMSNorm
// vectors always f32, KV cache f32):
//   weights = layers x (wq + wk + wv + wo + w1 + w2 + w3 slices + 2 norms)
//             + embedding table (rank 0, first stage)
//             + final norm + classifier rows of its vocab slice (every rank
//               of the last stage; shared classifier counted once when the
//               same shard holds the embedding)
//   KV cache = sessions x 2 x layers x context x (kv heads in shard x head_size) x 4
//   buffers  = sessions x 4 x (3 dim + 2 dim message in/out + q + k + v
//             + att (heads in shard x context) + 2 FFN slice + its vocab slice)
//   (expert placement) stage shard: the above with no routed expert matrices
//   (router, shared expert and biases stay); expert node:
//   weights  = layers x held experts x (w1 + w3 + w2 of one whole expert)
//   KV cache = 0; buffers = sessions x 4 x (2 dim + 2 hidden) (one row in, out)
// For one shard holding everything in f32 this is config.total_params() x 4
// weights and config.kv_cache_bytes(context) KV cache. q8_0 matrices are
// counted as ggml blocks (34 bytes per 32 weights, each row of a slice padded
// to whole blocks, i.e. a slice re-quantized on its own); the embedding table
// is counted quantized too. Buffers assume one position per step (a prefill
// batch of n positions needs about n x the activation part more).
//
// Thread safety: pure functions over values. Errors: cellshard::result with
// messages that name the limit, the node and the numbers.
#pragma once

#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/result.hpp"
#include "topologies/profile.hpp"
#include "topologies/split.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cellshard::topologies {

// ---------------------------------------------------------------------------
// Inputs

enum class strategy_kind { pipeline, tensor, hybrid, expert };

/// A topology as `--topology` names it. 0 in `stages` or `tp` means "as many
/// as the model and the nodes allow" (pipeline: tp = 1; tensor: stages = 1).
struct strategy {
  strategy_kind kind = strategy_kind::pipeline;
  int stages = 0;  // P
  int tp = 0;      // T: shards per stage (1 for expert)
  int experts = 0;          // expert: E, expert nodes per stage
  int expert_replicas = 1;  // expert: R, expert nodes holding each expert (--expert-replicas)
};
/// Parses "pipeline", "pipeline:S", "tensor", "tensor:T", "hybrid:PxT",
/// "expert:E" (= pipeline:1,expert:E) and "pipeline[:P],expert:E".
/// expert_replicas stays 1 (the caller sets --expert-replicas).
result<strategy> parse_strategy(std::string_view text);
/// "pipeline", "pipeline:5", "tensor:4", "hybrid:2x2", "expert:4",
/// "pipeline:2,expert:4" (replicas are not part of the text).
std::string to_string(const strategy& s);

/// How weight matrices are stored: bytes_per_weight for every weight, rows
/// padded to whole blocks of `block` weights.
struct weight_format {
  std::string name = "f32";
  double bytes_per_weight = 4.0;
  int block = 1;
  /// Bytes of one stored row of `cols` weights.
  uint64_t row_bytes(uint64_t cols) const;
  /// Models whose matrices have different types (GGUF files): the storage of
  /// each kind of matrix, indexed by matrix_kind; empty = every matrix as above.
  enum matrix_kind { wq, wk, wv, wo, w1, w2, w3, embedding, classifier, kinds_count };
  struct kind_format {
    double bytes_per_weight = 4.0;
    int block = 1;
  };
  std::vector<kind_format> kinds;
  /// row_bytes for one kind of matrix (the kind's format when `kinds` is set).
  uint64_t row_bytes(matrix_kind k, uint64_t cols) const;
  static weight_format f32() { return {"f32", 4.0, 1, {}}; }
  /// ggml Q8_0: 32 int8 + one f16 scale = 34 bytes per 32 weights (kernels/backend.hpp q8_block).
  static weight_format q8_0() { return {"q8_0", 34.0 / 32.0, 32, {}}; }
  /// ggml Q4_0: 32 x 4 bits + one f16 scale = 18 bytes per 32 weights (kernels/backend.hpp q4_block).
  static weight_format q4_0() { return {"q4_0", 18.0 / 32.0, 32, {}}; }
};
/// "f32", "q8_0" or "q4_0" (as `--weights`).
result<weight_format> find_weight_format(std::string_view name);
/// The storage of `file`'s matrices for the placement's memory account: a
/// model whose matrices keep their file types (GGUF with F16, Q8_0, Q4_K...)
/// gets one kind_format per matrix kind from layer 0's, the embedding's and
/// the classifier's tensor types (ggml block bytes / block weights); any
/// other model gets `requested` unchanged (what --weights asks for).
weight_format weight_format_of(const model::model_file& file, weight_format requested);

/// How a reduce sums its group's partials. Both sum every element as
/// p_0 + p_1 + ... + p_{T-1}, left to right in `peers`' order, and add the
/// sum to x: the same float operations, so the two give bit-identical x on
/// every rank, run after run (and the fixtures' ids). They differ in what
/// travels (issue #19). Per reduce, per position, with d = dim floats and
/// T ranks, a rank sends:
enum class reduce_algorithm {
  /// Every rank sends its whole partial to every other rank, and every rank
  /// sums all of them: (T-1) x d floats in T-1 messages (T(T-1) x d floats
  /// over the group: grows with T^2).
  direct_rank_order,
  /// Reduce-scatter, then all-gather. Rank j owns chunk j of the vector
  /// (split_even(dim, T), reduce_chunks): every rank sends chunk j of its
  /// partial to rank j; rank j sums chunk j of the T partials in rank order,
  /// adds it to its chunk of x and sends the finished chunk to every other
  /// rank, which copies it into its x. A rank sends (d - c_j) + (T-1) x c_j
  /// floats in 2(T-1) messages: 2(T-1)/T x d when T divides d (two message
  /// latencies per reduce instead of one).
  scatter_gather,
  count
};
/// "direct" or "scatter" (as `--reduce`).
result<reduce_algorithm> parse_reduce_algorithm(std::string_view text);
/// What a reduce's partial sums are when they travel (`--sync`, issue #19).
enum class sync_format {
  /// The floats as computed: every fixture exact.
  f32,
  /// Every partial sum (and scatter_gather's reduced chunk) is rounded onto
  /// the q8_0 grid (kernels::round_to_q8: blocks of 32 consecutive floats,
  /// each scaled by a binary16 max|x|/127, ggml's block_q8_0) by its sender,
  /// which keeps the rounded values for itself too; it crosses a process as
  /// 34-byte blocks per 32 floats (4/34 of the bytes of f32, plus padding).
  /// Every rank sums the same rounded values in rank order, so all ranks
  /// hold the same x and a run repeats bit for bit, but the ids are a
  /// tolerance mode: they agree with f32's at the rate docs/distributed.md
  /// gives. scatter_gather's all-gather then carries the reduced sum of the
  /// chunk (added to x by every rank, the owner too) instead of the finished
  /// chunk of x, so that x itself is never rounded.
  q8_0,
  count
};
/// "f32" or "q8_0" (as `--sync`).
result<sync_format> parse_sync_format(std::string_view text);
std::string to_string(sync_format f);
/// Bytes one message of `floats` partial-sum floats carries in format `f`
/// (payload only): 4 x floats, or 34 x ceil(floats / 32).
uint64_t sync_payload_bytes(sync_format f, uint64_t floats);
/// The chunks of a vector of `dim` floats that the ranks of a group of `t`
/// own in scatter_gather: split_even(dim, t), chunk r to rank r.
std::vector<range> reduce_chunks(int dim, int t);
/// Floats that the rank at position `rank` of a group of `t` sends per
/// position in one reduce of a `dim`-vector by `a` (see reduce_algorithm).
uint64_t reduce_floats_sent(reduce_algorithm a, int dim, int t, int rank);

struct placement_options {
  int context = 0;   // KV-cache positions per session; 0 = config.seq_len
  int sessions = 1;  // concurrent sessions (batch), each with its own KV cache and buffers
  weight_format weights = weight_format::f32();
  /// How every tensor group's reduces run (each reduce op's `algorithm`, and
  /// the all-reduce exchange steps' bytes).
  reduce_algorithm reduce = reduce_algorithm::direct_rank_order;
  /// What every reduce's partial sums are on the wire (each reduce op's
  /// `sync`, and the all-reduce exchange steps' bytes).
  sync_format sync = sync_format::f32;
  /// When false, place() returns a placement even if shards exceed their
  /// budgets (for --print-placement and the planner); check with fits() /
  /// check_memory().
  bool check_memory = true;
};

/// One node offered to the placement.
struct node_spec {
  int index = 0;     // the node's own number (in-process node, or position in --cluster)
  profile prof;      // prof.memory_bytes is the budget (already overridden by --memory)
  bool spare = false;  // held as a spare; never given a shard by place()
};
/// n working nodes 0..n-1 and `spares` spare nodes n..n+spares-1, all of `prof`.
std::vector<node_spec> make_nodes(int n, const profile& prof, int spares = 0);

// ---------------------------------------------------------------------------
// Output

/// Bytes a shard needs on its node.
struct memory_need {
  uint64_t weights = 0;
  uint64_t kv_cache = 0;
  uint64_t buffers = 0;
  uint64_t total() const { return weights + kv_cache + buffers; }
};

// ---------------------------------------------------------------------------
// A shard's program (issue #15): what one shard does with one step -- a batch
// of positions -- as data, in order. The placement writes it (shard_program);
// actors/shard.cpp executes it, op by op; nothing about splitting or exchange
// order is decided in actors/.

/// The operations of a program.
enum class shard_op {
  embed,     // token ids -> x (the embedding holder), sent to `peers` (its TP group in rank order, itself included)
  compute,   // its slice of `layers`, the `part` of each; see shard_step::partial
  reduce,    // x += the sum of `peers`' partials of (layer, part), by `algorithm` in `peers`' order
  forward,   // x to `peers` (every shard of the next stage), kept in the replay log
  classify,  // the logits of rows `vocab` for the step's last position, to the session
  dispatch,  // MoE layer `layers`: rmsnorm, router, top-k, shared expert; xb of each chosen (position, expert) to a holder
  combine,   // MoE layer `layers`: x += the chosen experts' outputs, weighted, in chosen order, + the shared expert's
  expert,    // expert node: serve expert requests for `layers` and the held `experts`
  count
};
static_assert(static_cast<int>(shard_op::count) == 8, "update to_string(shard_op)");

/// Which half of a transformer layer a compute or reduce covers.
enum class layer_part { both, attention, ffn };


struct shard_step {
  shard_op op = shard_op::compute;
  /// compute: the layers, each through `part` (both: attention, then FFN);
  /// reduce: [l, l+1), the layer whose `part` it completes.
  range layers;
  layer_part part = layer_part::both;
  /// compute: false -- x += the layer half's output after each half, the
  /// whole range in one go (a shard alone in its group); true -- the output
  /// is this shard's partial sum of one layer half (a TP slice), which the
  /// reduce that follows adds up.
  bool partial = false;
  reduce_algorithm algorithm = reduce_algorithm::direct_rank_order;
  sync_format sync = sync_format::f32;  // reduce: the partial sums' format (sync_format)
  /// Placement indices: embed and forward send to them, in this order; a
  /// reduce sums their partials in this order (the group in rank order).
  std::vector<int> peers;
  range vocab;  // classify: classifier rows [v0, v1)
  /// dispatch/combine: holders[e] = the placement indices of the expert
  /// nodes holding expert e (R of them, preference order); `peers` is the
  /// stage's expert nodes. expert: `experts` = the routed experts it holds
  /// (ascending), `peers` = its stage shard.
  std::vector<std::vector<int>> holders;
  std::vector<int> experts;
};

/// One shard: what one node computes.
struct shard {
  int index = 0;        // placement index (position in placement::shards)
  int node = 0;         // node_spec::index of the node that hosts it
  std::string profile;  // that node's profile name
  uint64_t budget_bytes = 0;  // that node's memory budget
  int stage = 0;        // pipeline stage
  int rank = 0;         // rank within the stage's TP group (0 when T = 1)
  int group_size = 1;   // T of the stage
  range layers;         // [l0, l1)
  bool has_embedding = false;   // token embedding table (rank 0 of stage 0)
  bool has_classifier = false;  // final RMSNorm + a classifier slice (every rank of the last stage)
  range vocab;          // classifier rows [v0, v1) (split_even of the vocabulary over the last stage's ranks)
  range kv_heads;       // [kv0, kv1)
  range heads;          // query heads [kv0 * kv_mul, kv1 * kv_mul)
  range ffn;            // FFN hidden units [f0, f1)
  /// Expert placement: an expert node holds only the routed experts
  /// `experts` (ascending; whole experts, every layer of `layers`); a stage
  /// shard holds no routed expert (`routed` false).
  bool expert_node = false;
  bool routed = true;
  std::vector<int> experts;
  memory_need memory;
  /// Its program for every step (shard_program): set by place().
  std::vector<shard_step> program;
  bool fits() const { return memory.total() <= budget_bytes; }
};

struct stage {
  int index = 0;
  range layers;
  /// Placement indices in placement order: the TP group in rank order, then
  /// (expert placement) the stage's expert nodes.
  std::vector<int> shards;
  /// Expert placement: the expert nodes (placement indices) and, per routed
  /// expert e, the expert nodes holding it (preference order). Empty otherwise.
  std::vector<int> expert_nodes;
  std::vector<std::vector<int>> holders;
};

/// The kinds of exchange in one position's forward pass.
enum class exchange_kind {
  token_to_embedding,    // session -> embedding holder: the token id (4 bytes)
  broadcast_embedding,   // embedding holder -> the other ranks of stage 0: x (dim floats)
  all_reduce_attention,  // layer l, within a TP group: sum of the partial wo outputs
  all_reduce_ffn,        // layer l, within a TP group: sum of the partial w2 outputs
  send_activations,      // rank 0 of stage s -> every shard of stage s+1: x (dim floats)
  logits_to_session,     // last stage's ranks -> session: each its vocab slice of the logits
  expert_dispatch,       // layer l, stage shard -> holders of the chosen experts: xb (dim floats per chosen expert)
  expert_combine,        // layer l, those expert nodes -> stage shard: each chosen expert's output (dim floats)
  count
};
static_assert(static_cast<int>(exchange_kind::count) == 8, "update to_string(exchange_kind)");

/// One exchange, as data. `from`/`to` hold placement indices; an empty list
/// is the session. For the all-reduces from == to == the group in rank order,
/// and every rank ends with sum = p_0 + p_1 + ... + p_{T-1}, added left to
/// right in that fixed order (bit-identical on every rank and every run),
/// which it then adds to its residual x; `algorithm` says what travels.
struct exchange_step {
  exchange_kind kind = exchange_kind::send_activations;
  int stage = 0;        // stage where it happens (the sending stage for send_activations)
  int layer = -1;       // the layer of an all-reduce; -1 otherwise
  std::vector<int> from;
  std::vector<int> to;
  /// Payload of one message: for an all-reduce the largest one a rank sends
  /// (direct: its whole partial; scatter_gather: the largest chunk).
  uint64_t bytes_per_position = 0;
  /// All-reduces: the bytes the busiest rank sends per position in this
  /// exchange (reduce_floats_sent x 4); other kinds: bytes_per_position.
  uint64_t bytes_per_rank = 0;
  reduce_algorithm algorithm = reduce_algorithm::direct_rank_order;  // all-reduces only
};

/// A node that holds no shard: a spare (placement index shards.size() + i).
struct spare_node {
  int index = 0;  // placement index
  int node = 0;   // node_spec::index
  std::string profile;
  uint64_t budget_bytes = 0;
};

struct placement {
  strategy strat;               // resolved: stages and tp filled in
  model::config config;
  placement_options options;    // resolved: context filled in
  std::vector<shard> shards;    // placement order (stage-major, then rank)
  std::vector<stage> stages;    // in pipeline order
  std::vector<exchange_step> steps;  // one position's exchanges, in execution order
  std::vector<spare_node> spares;    // in node-spec order

  /// Placement indices in use: shards, then spares.
  int size() const { return static_cast<int>(shards.size() + spares.size()); }
  /// node_spec::index of placement index i; error when out of range.
  result<int> node_of(int placement_index) const;
  /// True when every shard fits its node's budget.
  bool fits() const;
};

/// Places the model. Nodes marked spare, and nodes beyond what the strategy
/// uses (in node-spec order), become spares. Errors: an invalid config or
/// options, a strategy beyond the model's limits or the nodes available, and
/// (with options.check_memory) shards that do not fit their node's budget.
result<placement> place(const model::config& cfg, const std::vector<node_spec>& nodes, const strategy& strat,
                        const placement_options& options = {});

/// The program of shard `index` of `p` (p.stages and p.shards filled):
///   embed (rank 0 of the first stage: x to the whole group, itself first);
///   a group of one: compute{its layers, both halves, not partial};
///   a group of T > 1: for each layer l, compute{[l,l+1), attention, partial},
///     reduce{[l,l+1), attention, over the group in rank order, by
///     options.reduce},
///     then the same for the FFN;
///   a stage shard of an expert placement: for each layer l,
///     compute{[l,l+1), attention, not partial}, dispatch{[l,l+1), to the
///     stage's expert nodes, holders}, combine{the same};
///   forward (rank 0 of a stage with a next stage: to the next stage's shard
///   -- its rank-0 shards, never expert nodes), or classify (every rank of the
///   last stage: its vocabulary rows);
///   an expert node: expert{its layers, its experts, peers = its stage shard}.
/// Errors: an index that names no shard.
result<std::vector<shard_step>> shard_program(const placement& p, int index);

/// Checks a program against its shard (what actors/shard.cpp relies on): every
/// compute covers layers of the shard in order, each layer's attention before
/// its FFN, every layer exactly once; a partial compute is one layer half,
/// followed by the reduce of that half over peers that include the shard; an
/// embed only on the embedding holder and only first; classify only on a
/// classifier holder with its own vocabulary rows; no op after forward or
/// classify other than classify; a whole attention-only compute of one layer
/// is followed by the dispatch and combine of that layer (a routed-expert-free
/// stage shard), each naming a holder list per expert; an expert node's
/// program is exactly one expert op over its layers and its experts. Errors
/// name the op's position and what was expected.
result<void> check_program(const shard& s, const std::vector<shard_step>& program);

/// Memory of one shard (see the formula at the top of this file). `context`
/// is taken from options (0 = cfg.seq_len). vocab_rows: the classifier rows
/// the shard holds (0: no final norm and classifier).
/// routed_experts: the routed experts held per layer (-1: all of them; 0: a
/// stage shard of an expert placement).
memory_need shard_memory(const model::config& cfg, const placement_options& options, int n_layers,
                         int n_heads, int n_kv_heads, int ffn_units, bool has_embedding, int vocab_rows,
                         int routed_experts = -1);

/// Memory of an expert node holding `held_experts` whole routed experts of
/// each of `n_layers` layers (see the top of this file).
memory_need expert_node_memory(const model::config& cfg, const placement_options& options, int n_layers,
                               int held_experts);

/// Expert assignment of one stage (see the top of this file): holders[e] =
/// positions in `budgets` (the stage's expert nodes) of the R nodes holding
/// expert e, preference order. `per_expert` = bytes of one expert over the
/// stage's layers, `fixed` = each node's bytes besides its experts.
std::vector<std::vector<int>> assign_experts(int n_experts, int replicas, const std::vector<uint64_t>& budgets,
                                             uint64_t per_expert, uint64_t fixed);

/// Success when every shard fits; otherwise one line per shard that does not:
/// "node 2 (ps3, 256 MiB): shard needs 412.3 MiB (weights 380.1 MiB + KV cache
/// 32.0 MiB + buffers 0.2 MiB); placement index 1: stage 1, layers [3,5)".
result<void> check_memory(const placement& p);

std::string to_string(shard_op op);
std::string to_string(layer_part part);
std::string to_string(reduce_algorithm a);
/// "reduce layer 3 attention over [0,1] (direct, rank order)".
std::string to_string(const shard_step& s);
std::string to_string(exchange_kind k);
/// "all-reduce after attention, layer 3, over [0,1,2]".
std::string to_string(const exchange_step& s);
/// The `--print-placement` table: placement index, node, profile, role,
/// layers, heads, KV heads, FFN units, embedding/classifier, memory need /
/// budget; spares last; then the exchange steps per position.
std::string to_string(const placement& p);

}  // namespace cellshard::topologies
