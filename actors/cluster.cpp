#include "actors/cluster.hpp"

#include "actors/node.hpp"
#include "actors/shard.hpp"
#include "kernels/backend.hpp"
#include "model/bundle.hpp"
#include "model/transformer.hpp"
#include "topologies/profile.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <future>
#include <map>
#include <mutex>

namespace cellshard::actors {

struct cluster::impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_options opts;
  std::shared_ptr<const model::model_file> file;
  std::shared_ptr<const model::tokenizer> tok;
  topologies::placement plan;
  const kernels::backend* backend = nullptr;
  std::vector<std::shared_ptr<node_state>> nodes;  // by node index
  std::vector<caf::actor> shards;                   // by placement index
  caf::actor entry;
  std::mutex mu;
  std::map<uint64_t, caf::actor> sessions;
  std::atomic<uint64_t> next_id{1};
  bool stopped = false;
};

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
    auto b = model::load_bundle(opts.model, opts.tokenizer);
    if (!b) return b.err();
    im->file = b->file;
    im->tok = b->tok;
  }
  const model::config& mc = im->file->cfg();
  im->backend = kernels::find_backend(opts.kernels);
  if (!im->backend) return make_error("kernels: unknown backend '" + opts.kernels + "'");
  auto fmt = model::parse_weight_format(opts.weights);
  if (!fmt) return fmt.err();

  // Placement, with the memory-fit check, before anything is loaded.
  if (opts.nodes < 1) return make_error("nodes: need at least 1 node, got " + std::to_string(opts.nodes));
  auto prof = topologies::find_profile(opts.profile);
  if (!prof) return prof.err();
  topologies::profile p = *prof;
  if (opts.memory) p.memory_bytes = opts.memory;
  auto strat = topologies::parse_strategy(opts.topology);
  if (!strat) return strat.err();
  topologies::placement_options po;
  po.sessions = std::max(1, opts.sessions);
  auto wf = topologies::find_weight_format(opts.weights);
  if (!wf) return wf.err();
  po.weights = *wf;
  auto plan = topologies::place(mc, topologies::make_nodes(opts.nodes, p, opts.spares), *strat, po);
  if (!plan) return plan.err();
  im->plan = std::move(*plan);

  // Weight slices (shared with the model file: views for f32, copies for q8_0).
  std::vector<std::shared_ptr<const model::shard_weights>> slices;
  for (const auto& s : im->plan.shards) {
    model::slice_spec spec;
    spec.layer_begin = s.layers.begin;
    spec.layer_end = s.layers.end;
    spec.kv_head_begin = s.kv_heads.begin;
    spec.kv_head_end = s.kv_heads.end;
    spec.ffn_begin = s.ffn.begin;
    spec.ffn_end = s.ffn.end;
    spec.embedding = s.has_embedding;
    spec.classifier = s.has_classifier;
    auto w = model::shard_weights::make(im->file, spec, *fmt);
    if (!w) return make_error("placement index " + std::to_string(s.index) + " on node " +
                              std::to_string(s.node) + ": " + w.message());
    slices.push_back(*w);
  }

  kernels::set_blas_threads(opts.blas_threads);
  register_messages(im->cfg);
  im->cfg.set("scheduler.max-threads", static_cast<size_t>(std::max(1, opts.caf_threads)));
  im->cfg.set("logger.console", caf::atom("none"));
  im->sys = std::make_unique<caf::actor_system>(im->cfg);

  const int total_nodes = opts.nodes + opts.spares;
  for (int n = 0; n < total_nodes; ++n) {
    auto ns = std::make_shared<node_state>();
    ns->index = n;
    ns->profile = p.name;
    ns->budget_bytes = p.memory_bytes;
    im->nodes.push_back(ns);
  }
  for (size_t i = 0; i < im->plan.shards.size(); ++i) {
    const auto& s = im->plan.shards[i];
    shard_init init;
    init.index = s.index;
    init.rank = s.rank;
    init.group_size = s.group_size;
    init.weights = slices[i];
    init.backend = im->backend;
    init.node = im->nodes[s.node];
    im->shards.push_back(spawn_shard(*im->sys, std::move(init)));
  }
  for (size_t st = 0; st < im->plan.stages.size(); ++st) {
    wiring w;
    for (int idx : im->plan.stages[st].shards) {
      w.group.push_back(im->shards[idx]);
      w.group_nodes.push_back(im->plan.shards[idx].node);
    }
    if (st + 1 < im->plan.stages.size())
      for (int idx : im->plan.stages[st + 1].shards) {
        w.next.push_back(im->shards[idx]);
        w.next_nodes.push_back(im->plan.shards[idx].node);
      }
    for (int idx : im->plan.stages[st].shards)
      caf::anon_send(im->shards[idx], wire_atom::value, w);
  }
  im->entry = im->shards[im->plan.stages.front().shards.front()];
  return std::unique_ptr<cluster>(new cluster(std::move(im)));
}

uint64_t cluster::submit(model::generation_params params, token_callback on_token,
                         done_callback on_done) {
  auto& im = *impl_;
  const uint64_t id = im.next_id++;
  session_spec spec;
  spec.id = id;
  spec.params = model::normalise(std::move(params), im.file->cfg().seq_len);
  spec.tok = im.tok;
  spec.vocab_size = im.file->cfg().vocab_size;
  spec.entry = im.entry;
  spec.shards = im.shards;
  spec.step_timeout = im.opts.step_timeout;
  if (on_token) spec.on_token = [id, on_token](int t, const std::string& p) { on_token(id, t, p); };
  impl* self = impl_.get();
  spec.on_done = [id, on_done, self](const session_outcome& o) {
    {
      std::lock_guard<std::mutex> lock(self->mu);
      self->sessions.erase(id);
    }
    if (on_done) on_done(id, o);
  };
  std::lock_guard<std::mutex> lock(im.mu);
  if (im.stopped) {
    session_outcome o;
    o.ok = false;
    o.error = "cluster is shut down";
    if (on_done) on_done(id, o);
    return id;
  }
  im.sessions[id] = spawn_session(*im.sys, std::move(spec));
  return id;
}

void cluster::cancel(uint64_t request) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->sessions.find(request);
  if (it != impl_->sessions.end()) caf::anon_send(it->second, cancel_atom::value);
}

result<session_outcome> cluster::generate(model::generation_params params, token_callback on_token,
                                          std::chrono::milliseconds deadline) {
  auto done = std::make_shared<std::promise<session_outcome>>();
  auto fut = done->get_future();
  const uint64_t id = submit(std::move(params), std::move(on_token),
                             [done](uint64_t, const session_outcome& o) { done->set_value(o); });
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
  for (auto& s : impl_->shards) {
    std::string err;
    self->request(s, deadline, stats_atom::value)
        .receive([&](shard_stats& st) { out.push_back(st); },
                 [&](caf::error& e) { err = impl_->sys->render(e); });
    if (!err.empty()) return make_error("statistics of a shard: " + err);
  }
  return out;
}

std::vector<uint64_t> cluster::node_memory() const {
  std::vector<uint64_t> out;
  for (auto& n : impl_->nodes) out.push_back(n->used_bytes.load());
  return out;
}

const topologies::placement& cluster::placement() const { return impl_->plan; }
const model::config& cluster::config() const { return impl_->file->cfg(); }
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
  for (auto& s : impl_->shards) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  impl_->shards.clear();
  impl_->entry = nullptr;
  impl_->sys.reset();  // waits for every actor to finish
}

}  // namespace cellshard::actors
