// api/cluster.cpp: <cellshard/cluster.hpp> over actors::cluster. Maps the
// public, typed options onto the runtime's and the runtime's outcomes onto
// result<> with an error_code; nothing else is decided here.
#include <cellshard/cluster.hpp>

#include "actors/cluster.hpp"
#include "actors/remote.hpp"
#include "supervision/fault_plan.hpp"
#include "topologies/placement.hpp"

#include <atomic>
#include <future>
#include <mutex>

namespace cellshard {

const char* to_string(node_profile p) {
  switch (p) {
    case node_profile::host: return "host";
    case node_profile::ps3: return "ps3";
    case node_profile::ps3_slim: return "ps3-slim";
    case node_profile::rpi5: return "rpi5";
  }
  return "host";
}

const char* to_string(kernel_backend k) {
  switch (k) {
    case kernel_backend::reference: return "reference";
    case kernel_backend::blas: return "blas";
  }
  return "blas";
}

const char* to_string(weight_format w) { return w == weight_format::q8_0 ? "q8_0" : "f32"; }

std::string to_string(const topology& t) {
  switch (t.shape) {
    case topology::kind::pipeline:
      return t.stages > 0 ? "pipeline:" + std::to_string(t.stages) : "pipeline";
    case topology::kind::tensor: return "tensor";
    case topology::kind::hybrid: return "hybrid:" + std::to_string(t.stages) + "x" + std::to_string(t.ranks);
  }
  return "pipeline";
}

// ------------------------------------------------------------------ hosts ---

struct hosts::impl {
  // In process.
  int nodes = 1;
  int spares = 0;
  node_profile profile = node_profile::host;
  std::uint64_t memory = 0;
  link_shape link;
  // Daemons (remote is true): the cluster file's entries; each cluster gets
  // its own remote_host made from them.
  bool remote = false;
  std::vector<actors::remote_node> entries;
  actors::remote_options ropts;
};

hosts hosts::in_process(int nodes, node_profile profile, int spares) {
  return in_process(nodes, profile, spares, 0, {});
}

hosts hosts::in_process(int nodes, node_profile profile, int spares, std::uint64_t memory_bytes,
                        link_shape link) {
  auto im = std::make_shared<impl>();
  im->nodes = nodes;
  im->spares = spares;
  im->profile = profile;
  im->memory = memory_bytes;
  im->link = link;
  return hosts(std::move(im));
}

result<hosts> hosts::daemons(const std::string& cluster_file, const tls_settings& tls,
                             std::chrono::milliseconds connect_timeout) {
  actors::remote_options ro;
  ro.net.tls = actors::tls_files{tls.cert_file, tls.key_file, tls.ca_file};
  ro.connect_timeout = connect_timeout;
  if (ro.net.tls.requested()) {
    if (auto ok = actors::check_tls_flags(ro.net.tls); !ok)
      return make_error(error_code::invalid_argument, ok.message());
  }
  auto rh = actors::remote_host::from_file(cluster_file, ro);
  if (!rh) {
    auto code = rh.code();
    if (code == error_code::unspecified)
      code = rh.message().find("cannot") != std::string::npos ? error_code::io : error_code::bad_format;
    return make_error(code, rh.message());
  }
  auto im = std::make_shared<impl>();
  im->remote = true;
  im->entries = (*rh)->entries();
  im->ropts = ro;
  im->nodes = static_cast<int>(im->entries.size());
  return hosts(std::move(im));
}

int hosts::nodes() const { return impl_->remote ? impl_->nodes : impl_->nodes + impl_->spares; }

// ---------------------------------------------------------------- cluster ---

struct cluster::impl {
  std::unique_ptr<actors::cluster> rt;
};

namespace {

std::string link_text(const link_shape& l) {
  const std::string bw = l.bandwidth_bps ? std::to_string(l.bandwidth_bps) + "bit" : "unlimited";
  return bw + ":" + std::to_string(l.latency.count()) + "us";
}

supervision::fault_plan to_plan(const fault& f) {
  supervision::fault_plan p;
  p.kind = static_cast<supervision::fault_kind>(static_cast<int>(f.kind));
  p.node = static_cast<std::uint32_t>(f.node);
  p.step = f.step;
  const bool takes_ms = f.kind == fault_kind::silence || f.kind == fault_kind::partition ||
                        f.kind == fault_kind::slow || f.kind == fault_kind::delay;
  if (takes_ms && f.duration.count() > 0) p.duration_ms = static_cast<std::uint64_t>(f.duration.count());
  const bool takes_n = f.kind == fault_kind::drop || f.kind == fault_kind::delay ||
                       f.kind == fault_kind::corrupt || f.kind == fault_kind::slow;
  if (takes_n && f.count > 0) p.count = f.count;
  return p;
}

static_assert(static_cast<int>(fault_kind::partition) == static_cast<int>(supervision::fault_kind::partition) &&
                  static_cast<int>(supervision::fault_kind::count) == 7,
              "cellshard::fault_kind mirrors supervision::fault_kind");

recovery_event to_event(const actors::fault_record& r) {
  recovery_event e;
  e.kind = r.kind;
  e.index = r.index;
  e.node = r.node;
  e.moved_to_node = r.moved_to_node;
  e.detect_ms = r.detect_ms;
  e.recover_ms = r.recover_ms;
  return e;
}

model::generation_params to_params(const generation_request& r) {
  model::generation_params p;
  p.prompt = r.prompt;
  p.steps = r.steps;
  p.sampling.temperature = r.temperature;
  p.sampling.topp = r.top_p;
  p.sampling.seed = r.seed;
  return p;
}

generation to_generation(const actors::session_outcome& o) {
  generation g;
  g.ids = o.result.ids;
  g.prompt_tokens = o.result.prompt_tokens;
  g.text = o.result.text;
  g.ttft_ms = o.result.ttft_ms;
  g.step_ms = o.result.step_ms;
  g.duration_ms = o.result.duration_ms;
  g.tokens_per_s = o.result.tokens_per_s;
  g.retries = o.retries;
  for (const auto& r : o.recoveries) {
    request_recovery e;
    e.indices = r.indices;
    e.position = r.position;
    e.restored_to = r.restored_to;
    e.replayed_positions = r.replayed_positions;
    e.recover_ms = r.recover_ms;
    g.recoveries.push_back(e);
  }
  return g;
}

generation_result to_result(const actors::session_outcome& o) {
  if (o.ok && !o.cancelled) return to_generation(o);
  generation_error e;
  e.code = o.cancelled ? error_code::cancelled : error_code::unavailable;
  e.message = o.cancelled ? (o.error.empty() ? std::string("cancelled") : o.error) : o.error;
  e.partial = to_generation(o);
  return e;
}

// The runtime's token callback, wrapping the public one: a `false` from the
// caller cancels the request (once).
actors::token_callback wrap(actors::cluster* rt, token_callback cb) {
  if (!cb) return {};
  auto stopped = std::make_shared<std::atomic<bool>>(false);
  return [rt, cb = std::move(cb), stopped](std::uint64_t id, int token, const std::string& piece) {
    if (stopped->load()) return;
    if (!cb(token, piece)) {
      stopped->store(true);
      rt->cancel(id);
    }
  };
}

}  // namespace

result<std::unique_ptr<cluster>> cluster::start(const cluster_options& opts, const hosts& where) {
  const hosts::impl& h = *where.impl_;
  actors::cluster_options o;
  o.model = opts.model_path;
  o.tokenizer = opts.tokenizer_path;
  if (opts.model_path.empty()) return make_error(error_code::invalid_argument, "model_path: empty");
  o.topology = to_string(opts.layout);
  o.kernels = to_string(opts.kernels);
  o.weights = to_string(opts.weights);
  o.sessions = opts.sessions;
  o.caf_threads = opts.threads;
  o.step_timeout = opts.step_timeout;
  o.step_timeout_min = opts.step_timeout_min;
  o.checkpoint_every = opts.supervision.checkpoint_every;
  o.max_restarts = opts.supervision.max_restarts;
  o.restart_period = opts.supervision.restart_period;
  o.heartbeat = opts.supervision.heartbeat;
  for (const auto& f : opts.faults) {
    auto p = to_plan(f);
    if (auto ok = supervision::validate(p); !ok)
      return make_error(error_code::invalid_argument, "faults: " + ok.message());
    o.faults.push_back(p);
  }
  if (h.remote) {
    o.host = std::make_shared<actors::remote_host>(h.entries, h.ropts);
  } else {
    if (h.nodes < 1)
      return make_error(error_code::invalid_argument,
                        "hosts::in_process: need at least 1 node, got " + std::to_string(h.nodes));
    o.nodes = h.nodes;
    o.spares = h.spares;
    o.profile = to_string(h.profile);
    o.memory = h.memory;
    if (h.link.bandwidth_bps > 0 || h.link.latency.count() > 0) o.link = link_text(h.link);
  }
  auto rt = actors::cluster::start(o);
  if (!rt) {
    auto code = rt.code();
    if (code == error_code::unspecified) code = h.remote ? error_code::unavailable : error_code::invalid_argument;
    return make_error(code, rt.message());
  }
  auto im = std::make_unique<impl>();
  im->rt = std::move(*rt);
  return std::unique_ptr<cluster>(new cluster(std::move(im)));
}

cluster::cluster(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
cluster::~cluster() { shutdown(); }

generation_result cluster::generate(const generation_request& req, token_callback on_token) {
  auto done = std::make_shared<std::promise<actors::session_outcome>>();
  auto fut = done->get_future();
  auto* rt = impl_->rt.get();
  const auto id = rt->submit(to_params(req), wrap(rt, std::move(on_token)),
                             [done](std::uint64_t, const actors::session_outcome& o) { done->set_value(o); });
  if (fut.wait_for(req.deadline) == std::future_status::ready) return to_result(fut.get());
  rt->cancel(id);
  // The cancelled session reports what it produced; bounded wait for it.
  generation_error e;
  e.code = error_code::timeout;
  e.message = "generation did not finish within " + std::to_string(req.deadline.count()) + " ms; cancelled";
  if (fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready) e.partial = to_generation(fut.get());
  return e;
}

std::uint64_t cluster::submit(const generation_request& req, token_callback on_token, done_callback on_done) {
  auto* rt = impl_->rt.get();
  return rt->submit(to_params(req), wrap(rt, std::move(on_token)),
                    [cb = std::move(on_done)](std::uint64_t, const actors::session_outcome& o) {
                      if (cb) cb(to_result(o));
                    });
}

void cluster::cancel(std::uint64_t request) { impl_->rt->cancel(request); }

std::vector<recovery_event> cluster::faults() const {
  std::vector<recovery_event> out;
  for (const auto& r : impl_->rt->faults()) out.push_back(to_event(r));
  return out;
}

std::vector<int> cluster::current_nodes() const { return impl_->rt->current_nodes(); }
std::string cluster::describe_placement() const { return topologies::to_string(impl_->rt->placement()); }
int cluster::vocab_size() const { return impl_->rt->config().vocab_size; }
int cluster::context_length() const { return impl_->rt->config().seq_len; }
std::uint64_t cluster::model_digest() const { return impl_->rt->model_digest(); }
void cluster::shutdown() {
  if (impl_ && impl_->rt) impl_->rt->shutdown();
}

}  // namespace cellshard
