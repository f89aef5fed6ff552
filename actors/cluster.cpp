#include "actors/cluster.hpp"

#include "actors/node.hpp"
#include "actors/shard.hpp"
#include "kernels/backend.hpp"
#include "model/bundle.hpp"
#include "model/transformer.hpp"
#include "topologies/profile.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <sys/stat.h>
#include <future>
#include <map>
#include <mutex>

namespace cellshard::actors {

namespace {

/// The absolute path of an existing file, else "" (a built-in model has no file).
std::string absolute_file(const std::string& p) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) return "";
  struct stat st;
  if (::stat(buf, &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return buf;
}

/// Shards in this process: one logical node per placement node, each with its
/// own memory budget (node_state) charged by its shards.
class local_host : public shard_host {
public:
  local_host(int nodes, int spares, topologies::profile prof,
             std::shared_ptr<const model::model_file> file, int threads)
      : prof_(std::move(prof)), file_(std::move(file)) {
    specs_ = topologies::make_nodes(nodes, prof_, spares);
    for (const auto& n : specs_) {
      auto ns = std::make_shared<node_state>();
      ns->index = n.index;
      ns->profile = prof_.name;
      ns->budget_bytes = prof_.memory_bytes;
      ns->shaper = std::make_shared<link_shaper>(prof_.link);
      if (threads > 1) ns->kernel_pool = std::make_shared<kernels::pool>(threads);
      states_.push_back(ns);
    }
  }
  std::vector<topologies::node_spec> nodes() const override { return specs_; }
  result<void> configure(caf::actor_system_config&) override { return {}; }
  result<void> connect(caf::actor_system&, const model::model_file&, const model::tokenizer&) override {
    return {};
  }
  result<caf::actor> spawn(caf::actor_system& sys, const shard_request& req) override {
    auto w = model::shard_weights::make(file_, req.spec, req.weights, req.matmul);
    if (!w) return w.err();
    shard_init init;
    init.index = req.placed->index;
    init.stage = req.placed->stage;
    init.rank = req.placed->rank;
    init.group_size = req.placed->group_size;
    init.checkpoint_every = req.checkpoint_every;
    init.batch_size = req.batch_size;
    init.restarted = req.restarted;
    init.faults = req.faults;
    init.heartbeat = req.heartbeat;
    init.coordinator = req.coordinator;
    init.weights = *w;
    init.backend = kernels::choose_backend(req.kernels).be;  // run reports a substitute
    if (!init.backend) return make_error("kernels: unknown backend '" + req.kernels + "'");
    init.node = states_.at(req.placed->node);
    return spawn_shard(sys, std::move(init));
  }
  std::vector<uint64_t> node_memory() const override {
    std::vector<uint64_t> out;
    for (auto& n : states_) out.push_back(n->used_bytes.load());
    return out;
  }

private:
  topologies::profile prof_;
  std::shared_ptr<const model::model_file> file_;
  std::vector<topologies::node_spec> specs_;
  std::vector<std::shared_ptr<node_state>> states_;
};

}  // namespace

struct cluster::impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_options opts;
  std::shared_ptr<const model::model_file> file;
  std::shared_ptr<const model::tokenizer> tok;
  topologies::placement plan;
  std::shared_ptr<shard_host> host;
  std::shared_ptr<const runtime_config> rtc;  // what the runtime runs (read-only)
  // The runtime's actors (handles released under mu at shutdown) and the
  // board where its coordinator publishes the placement state.
  runtime run;
  std::shared_ptr<runtime_board> board;
  std::mutex mu;
  std::map<uint64_t, caf::actor> sessions;
  std::atomic<uint64_t> next_id{1};
  bool stopped = false;
  std::function<double(int)> transfer_estimate;  // ms on the critical path's links for n positions
  fault_snapshot last_faults;  // under mu: the coordinator's last answer

  /// The coordinator's latest snapshot (never null: empty before start).
  std::shared_ptr<const runtime_view> view() const {
    auto v = board ? board->get() : nullptr;
    return v ? v : std::make_shared<const runtime_view>();
  }

  /// The coordinator's fault records and cleared suspicions (last known
  /// after shutdown). Any thread.
  fault_snapshot fault_state();
  std::vector<skipped_node> skipped;             // nodes left out (shard_host::drop_unfit)
};

namespace {

/// The links a step crosses one after another, with the bytes each carries
/// per position (plus fixed bytes): the embedding holder's broadcast to its
/// tensor group, two all-reduces per layer inside a group (every rank sends
/// to every other rank at once, one hop deep), the activation to the next
/// stage, and the logits to the front end. A group's hops use its slowest
/// node's link. Returns ms for a step of n positions (issue #20: deadlines
/// that fit the work).
std::function<double(int)> transfer_estimate(const topologies::placement& plan, const model::config& cfg,
                                             const std::vector<topologies::node_spec>& nodes) {
  struct hop {
    double per_position = 0, fixed = 0;
    topologies::link_spec link;
  };
  auto link_of = [&](int node) {
    for (const auto& n : nodes)
      if (n.index == node) return n.prof.link;
    return topologies::link_spec{};
  };
  std::vector<hop> hops;
  const double row = static_cast<double>(cfg.dim) * sizeof(float);
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& group = plan.stages[s].shards;
    topologies::link_spec slow = link_of(plan.shards[group.front()].node);
    for (int idx : group) {
      const auto l = link_of(plan.shards[idx].node);
      if (l.bandwidth_bps > 0 && (slow.bandwidth_bps == 0 || l.bandwidth_bps < slow.bandwidth_bps))
        slow.bandwidth_bps = l.bandwidth_bps;
      slow.latency_us = std::max(slow.latency_us, l.latency_us);
    }
    if (group.size() > 1) {
      if (s == 0) hops.push_back({row, 0, slow});
      const auto& layers = plan.shards[group.front()].layers;
      for (int l = layers.begin; l < layers.end; ++l) {
        hops.push_back({row, 0, slow});
        hops.push_back({row, 0, slow});
      }
    }
    const auto head = link_of(plan.shards[group.front()].node);
    if (s + 1 < plan.stages.size()) {
      hops.push_back({row, 0, head});
    } else {
      // The last stage's checkpoint delta (its KV rows of the step) goes to
      // the front end just before the logits, on the same link.
      const auto& sh = plan.shards[group.front()];
      const double kv_row = 2.0 * (sh.layers.end - sh.layers.begin) * (sh.kv_heads.end - sh.kv_heads.begin) *
                            cfg.head_size() * sizeof(float);
      hops.push_back({kv_row, static_cast<double>(cfg.vocab_size) * sizeof(float), head});
    }
  }
  return [hops](int n) {
    double ms = 0;
    for (const auto& h : hops) ms += 1e3 * h.link.transfer_s(static_cast<uint64_t>(h.per_position * n + h.fixed));
    return ms;
  };
}

}  // namespace

cluster::cluster(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

cluster::~cluster() { shutdown(); }

result<std::unique_ptr<cluster>> cluster::start(const cluster_options& opts) {
  auto im = std::make_unique<impl>();
  im->opts = opts;
  // Model and tokenizer.
  if (opts.file) {
    im->file = opts.file;
    im->tok = opts.tok;
    if (!im->tok) {
      auto t = model::tokenizer::open(opts.tokenizer);
      if (!t) return t.err();
      im->tok = *t;
    }
    auto ok = model::check_pair(*im->file, *im->tok);
    if (!ok) return ok.err();
  } else {
    model::load_options lo;
    lo.ctx = opts.ctx;
    auto b = model::load_bundle(opts.model, opts.tokenizer, lo);
    if (!b) return b.err();
    im->file = b->file;
    im->tok = b->tok;
  }
  const model::config& mc = im->file->cfg();
  if (!kernels::choose_backend(opts.kernels).be)
    return make_error("kernels: unknown backend '" + opts.kernels + "'");
  // A q8_0 file runs as q8_0 whatever --weights says (model/quant.hpp).
  const std::string weights = im->file->quantized() ? "q8_0" : opts.weights;
  auto fmt = model::parse_weight_format(weights);
  if (!fmt) return fmt.err();

  // Where the shards live.
  im->host = opts.host;
  if (!im->host) {
    if (opts.nodes < 1)
      return make_error("nodes: need at least 1 node, got " + std::to_string(opts.nodes));
    auto prof = topologies::find_profile(opts.profile);
    if (!prof) return prof.err();
    topologies::profile p = *prof;
    if (opts.memory) p.memory_bytes = opts.memory;
    if (!opts.link.empty()) {
      auto l = topologies::parse_link(opts.link);
      if (!l) return make_error("link: " + l.message());
      p.link = *l;
    }
    im->host = std::make_shared<local_host>(opts.nodes, opts.spares, p, im->file, opts.threads);
  }

  // Placement, with the memory-fit check, before anything is loaded.
  auto strat = topologies::parse_strategy(opts.topology);
  if (!strat) return strat.err();
  strat->expert_replicas = opts.expert_replicas;
  topologies::placement_options po;
  po.sessions = std::max(1, opts.sessions);
  auto wf = topologies::find_weight_format(weights);
  if (!wf) return wf.err();
  po.weights = *wf;
  // A GGUF model keeps each matrix in its file type: account its real bytes.
  po.weights = topologies::weight_format_of(*im->file, *wf);
  auto reduce = topologies::parse_reduce_algorithm(opts.reduce);
  if (!reduce) return reduce.err();
  po.reduce = *reduce;
  auto sync = topologies::parse_sync_format(opts.sync);
  if (!sync) return sync.err();
  po.sync = *sync;
  auto plan = topologies::place(mc, im->host->nodes(), *strat, po);
  if (!plan) return plan.err();
  im->plan = std::move(*plan);
  // A fault for a placement index the placement does not have would never
  // fire: say so instead of reporting a clean run.
  auto check_faults = [&]() -> result<void> {
    for (const auto& f : opts.faults)
      if (f.node >= im->plan.shards.size())
        return make_error(error_code::invalid_argument,
                          "fault '" + supervision::to_string(f) + "': placement index " + std::to_string(f.node) +
                          " holds no shard (this placement has indices 0.." +
                          std::to_string(im->plan.shards.size() - 1) + "; spares hold none until a shard moves "
                          "there, and a fault follows its placement index, not the node; see --print-placement)");
    return {};
  };
  if (auto ok = check_faults(); !ok) return ok.err();

  kernels::set_blas_threads(opts.blas_threads);
  register_messages(im->cfg);
  im->cfg.set("scheduler.max-threads", static_cast<size_t>(std::max(1, opts.caf_threads)));
  // Not tuned here: setting work-stealing.relaxed-sleep-duration (to cut the
  // up-to-10 ms sleeps of idle workers that inflate sub-ms shaped latencies)
  // corrupted the heap of CAF 0.17.6 once the middleman was loaded.
  auto conf = im->host->configure(im->cfg);
  if (!conf) return conf.err();
  im->sys = std::make_unique<caf::actor_system>(im->cfg);
  auto conn = im->host->connect(*im->sys, *im->file, *im->tok);
  if (!conn) return conn.err();
  // Issue #17: a node that cannot hold what the placement gives it says so
  // and is left out; the model is placed again over the others (each round
  // leaves out at least one node, so this ends).
  for (size_t round = 0; round <= im->host->nodes().size(); ++round) {
    auto skipped = im->host->drop_unfit(*im->sys, im->plan);
    if (skipped.empty()) break;
    im->skipped.insert(im->skipped.end(), skipped.begin(), skipped.end());
    auto again = topologies::place(mc, im->host->nodes(), *strat, po);
    if (!again) {
      std::string why;
      for (const auto& k : im->skipped) why += "; " + k.who + " not used: " + k.why;
      return make_error(again.message() + why);
    }
    im->plan = std::move(*again);
    if (auto ok = check_faults(); !ok) return ok.err();
  }

  // The supervision tree spawns the shards (through the host) and wires them.
  auto rt = std::make_shared<runtime_config>();
  rt->plan = im->plan;
  rt->host = im->host;
  rt->weights = *fmt;
  if (!opts.matmul.empty()) {
    auto mm = model::parse_matmul_mode(opts.matmul);
    if (!mm) return mm.err();
    rt->matmul = *mm;
  }
  rt->ctx = opts.ctx;
  rt->kernels = opts.kernels;
  rt->opts.checkpoint_every = opts.checkpoint_every;
  rt->opts.batch_size = opts.batch_size;
  rt->opts.max_restarts = opts.max_restarts;
  rt->opts.restart_period = opts.restart_period;
  rt->opts.detector = opts.detector;
  rt->opts.heartbeat = opts.heartbeat;
  if (!opts.faults.empty() || opts.fault_injection)
    rt->opts.faults = std::make_shared<supervision::fault_injector>(opts.faults);
  // Starting shards (remote spawns, weight loading) is not a step: at least 30 s.
  auto run = start_runtime(*im->sys, rt, std::max(opts.step_timeout, std::chrono::milliseconds(30000)));
  if (!run) return run.err();
  im->run = std::move(*run);
  im->board = im->run.board;
  im->transfer_estimate = transfer_estimate(im->plan, im->file->cfg(), im->host->nodes());
  im->rtc = std::move(rt);
  return std::unique_ptr<cluster>(new cluster(std::move(im)));
}

uint64_t cluster::submit(model::generation_params params, token_callback on_token,
                         done_callback on_done, const request_options& extra) {
  auto& im = *impl_;
  const uint64_t id = im.next_id++;
  session_spec spec;
  spec.id = id;
  spec.params = model::normalise(std::move(params), im.file->cfg().seq_len);
  spec.tok = im.tok;
  spec.vocab_size = im.file->cfg().vocab_size;
  // A request the cluster cannot take ends at once, on this thread, and
  // with no lock held: on_done may call back into the cluster (a client
  // that resubmits from on_done would otherwise wait on itself for ever).
  auto refuse = [&](std::string why) {
    session_outcome o;
    o.ok = false;
    o.error = std::move(why);
    if (on_done) on_done(id, o);
    return id;
  };
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lock(im.mu);
    stopped = im.stopped;
    spec.coordinator = im.run.coordinator;
  }
  if (stopped) return refuse("cluster is shut down");
  const auto view = im.view();
  if (!view->failure.empty()) return refuse(view->failure);
  spec.shards = view->actor_of;
  spec.entry = view->actor_of[im.plan.stages.front().shards.front()];
  for (const auto& sh : im.plan.shards) spec.stage_of.push_back(sh.stage);
  for (const auto& stg : im.plan.stages) spec.stages.push_back(stg.shards);
  for (const auto& sh : im.plan.shards) spec.expert_node.push_back(sh.expert_node ? 1 : 0);
  spec.step_timeout = im.opts.step_timeout;
  spec.step_timeout_min = im.opts.step_timeout_min;
  spec.expected_transfer_ms = im.transfer_estimate;
  spec.corrupt_checkpoints_of = im.opts.corrupt_checkpoints_of;
  spec.journal = extra.journal;
  spec.model_name = im.file->path().substr(im.file->path().rfind('/') + 1);
  spec.model_digest = im.file->digest();
  spec.tokenizer_name = im.tok->name().substr(im.tok->name().rfind('/') + 1);
  spec.tokenizer_digest = im.tok->digest();
  spec.resume_ids = extra.resume_ids;
  spec.resume_rng = extra.resume_rng;
  spec.resumed_journal = extra.resumed_journal;
  spec.model_path = absolute_file(im.file->path());
  spec.tokenizer_path = absolute_file(im.tok->name());
  spec.ctx = im.opts.ctx;
  spec.on_logits = extra.on_logits;
  if (on_token) spec.on_token = [id, on_token](int t, const std::string& p) { on_token(id, t, p); };
  impl* self = impl_.get();
  spec.on_done = [id, on_done, self](const session_outcome& o) {
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->sessions.erase(id);
    }
    if (on_done) on_done(id, o);
  };
  {
    std::lock_guard<std::mutex> lock(im.mu);
    stopped = im.stopped;
    if (!stopped) im.sessions[id] = spawn_session(*im.sys, std::move(spec));
  }
  return stopped ? refuse("cluster is shut down") : id;
}

void cluster::cancel(uint64_t request) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->sessions.find(request);
  if (it != impl_->sessions.end()) caf::anon_send(it->second, cancel_atom::value);
}

result<session_outcome> cluster::generate(model::generation_params params, token_callback on_token,
                                          std::chrono::milliseconds deadline, const request_options& extra) {
  auto done = std::make_shared<std::promise<session_outcome>>();
  auto fut = done->get_future();
  const uint64_t id = submit(std::move(params), std::move(on_token),
                             [done](uint64_t, const session_outcome& o) { done->set_value(o); }, extra);
  if (fut.wait_for(deadline) != std::future_status::ready) {
    cancel(id);
    return make_error("generation did not finish within " + std::to_string(deadline.count()) +
                      " ms; cancelled");
  }
  return fut.get();
}

result<std::vector<shard_stats>> cluster::stats(std::chrono::milliseconds deadline) {
  std::vector<shard_stats> out;
  caf::scoped_actor self{*impl_->sys};
  const std::vector<caf::actor> shards = impl_->view()->actor_of;
  for (auto& s : shards) {
    std::string err;
    self->request(s, deadline, stats_atom::value)
        .receive([&](shard_stats& st) { out.push_back(st); },
                 [&](caf::error& e) { err = impl_->sys->render(e); });
    if (!err.empty()) return make_error("statistics of a shard: " + err);
  }
  return out;
}

std::vector<std::optional<shard_stats>> cluster::shard_statistics(std::chrono::milliseconds each) {
  const std::vector<caf::actor> shards = impl_->view()->actor_of;
  std::vector<std::optional<shard_stats>> out(shards.size());
  caf::scoped_actor self{*impl_->sys};
  for (size_t i = 0; i < shards.size(); ++i) {
    if (!shards[i]) continue;
    self->request(shards[i], each, stats_atom::value)
        .receive([&](shard_stats& st) { out[i] = std::move(st); }, [](caf::error&) {});
  }
  return out;
}

std::vector<uint64_t> cluster::node_memory() const { return impl_->host->node_memory(); }
std::vector<weight_load> cluster::weight_loads() const { return impl_->host->weight_loads(); }
const std::vector<skipped_node>& cluster::skipped_nodes() const { return impl_->skipped; }

const topologies::placement& cluster::placement() const { return impl_->plan; }

fault_snapshot cluster::impl::fault_state() {
  // The coordinator owns the records. Its answer also follows every report
  // already sent to it (in process a mailbox keeps causal order: a
  // session's report precedes its on_done). After shutdown, or if it does
  // not answer, the last snapshot taken stands.
  caf::actor coord;
  {
    std::lock_guard<std::mutex> lock(mu);
    coord = run.coordinator;
  }
  if (coord && sys) {
    caf::scoped_actor self{*sys};
    self->request(coord, std::chrono::seconds(5), fault_atom::value)
        .receive(
            [&](fault_snapshot& s) {
              std::lock_guard<std::mutex> lock(mu);
              last_faults = std::move(s);
            },
            [](caf::error&) {});
  }
  std::lock_guard<std::mutex> lock(mu);
  return last_faults;
}

std::vector<fault_record> cluster::faults() const { return impl_->fault_state().faults; }

std::vector<suspicion_info> cluster::suspicions() const { return impl_->fault_state().suspicions; }

result<std::vector<cluster::link_measurement>> cluster::measure_links(std::chrono::milliseconds deadline) {
  std::vector<link_measurement> out;
  const auto view = impl_->view();  // one snapshot: actors and nodes agree
  const std::vector<caf::actor>& actors = view->actor_of;
  const std::vector<int>& nodes = view->node_of;
  // The links of the placement: rank 0 of a stage to every shard of the next,
  // and every pair inside a tensor-parallel group.
  std::vector<std::pair<int, int>> pairs;  // placement indices
  const auto& stages = impl_->plan.stages;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (int a : stages[s].shards)
      for (int b : stages[s].shards)  // expert nodes talk to their stage shard only
        if (a != b && !(impl_->plan.shards[a].expert_node && impl_->plan.shards[b].expert_node))
          pairs.emplace_back(a, b);
    if (s + 1 < stages.size())
      for (int b : stages[s + 1].shards) pairs.emplace_back(stages[s].shards.front(), b);
  }
  const auto nodes_spec = impl_->host->nodes();
  auto link_of = [&](int node) {
    for (const auto& n : nodes_spec)
      if (n.index == node) return n.prof.link;
    return topologies::link_spec{};
  };
  caf::scoped_actor self{*impl_->sys};
  for (auto [a, b] : pairs) {
    const auto spec = link_of(nodes[a]);
    if (spec.bandwidth_bps == 0 && spec.latency_us == 0) continue;
    const int bytes = 16384;
    const double seconds = 0.04;
    int n = spec.bandwidth_bps > 0 ? static_cast<int>(spec.bandwidth_bps * seconds / 8 / bytes) : 8;
    n = std::max(8, std::min(512, n));
    self->send(actors[a], probe_atom::value, actors[b], static_cast<int32_t>(nodes[b]),
               static_cast<int32_t>(n), static_cast<int32_t>(bytes), caf::actor{self});
    std::string err;
    self->receive([&](probe_result& r) {
                    out.push_back({r.from, r.to, static_cast<double>(spec.bandwidth_bps), spec.latency_us,
                                   r.bandwidth_bps, r.latency_us});
                  },
                  caf::after(deadline) >> [&] { err = "timeout"; });
    if (!err.empty())
      return make_error("measuring link " + std::to_string(nodes[a]) + " -> " + std::to_string(nodes[b]) +
                        ": no answer within " + std::to_string(deadline.count()) + " ms");
  }
  return out;
}

result<void> cluster::inject(const supervision::fault_plan& p) {
  if (!impl_->rtc->opts.faults)
    return make_error("fault injection: the cluster was started without fault_injection");
  if (p.node >= impl_->plan.shards.size())
    return make_error("fault injection: placement index " + std::to_string(p.node) + " holds no shard (indices 0.." +
                      std::to_string(impl_->plan.shards.size() - 1) + ")");
  if (impl_->opts.host)
    return make_error("fault injection: the shards run in node daemons, which received their fault plans when "
                      "they were spawned; signal the daemon process instead");
  auto ok = supervision::validate(p);
  if (!ok) return ok.err();
  impl_->rtc->opts.faults->add(p);
  return {};
}

std::string cluster::failure() const { return impl_->view()->failure; }

std::vector<int> cluster::current_nodes() const { return impl_->view()->node_of; }
const model::config& cluster::config() const { return impl_->file->cfg(); }
uint64_t cluster::model_digest() const { return impl_->file->digest(); }

const model::tokenizer& cluster::tokenizer() const { return *impl_->tok; }

void cluster::shutdown() {
  if (!impl_) return;
  std::map<uint64_t, caf::actor> sessions;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
    sessions = impl_->sessions;
  }
  for (auto& kv : sessions) caf::anon_send(kv.second, cancel_atom::value);
  sessions.clear();
  impl_->fault_state();  // kept for faults() and suspicions() after shutdown
  // Afterwards the board holds node_of and the failure, no handle.
  runtime run;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    run = impl_->run;
  }
  stop_runtime(*impl_->sys, run);
  impl_->host->shutdown(*impl_->sys);
  // Release every handle before the actor system goes: a handle (above all
  // a remote proxy's) released after ~actor_system touches freed memory.
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->sessions.clear();
    impl_->run = runtime{};
  }
  impl_->sys.reset();  // waits for every actor to finish
}

}  // namespace cellshard::actors
