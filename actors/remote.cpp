#include "actors/remote.hpp"

#include "actors/guard.hpp"
#include <algorithm>

#include "actors/messages.hpp"
#include "actors/weight_server.hpp"
#include "topologies/profile.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace cellshard::actors {

namespace {

std::string base_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void append(std::string& all, const std::string& one) {
  if (!one.empty()) all += (all.empty() ? "" : "; ") + one;
}

using watch_atom = caf::atom_constant<caf::atom("cs_watch")>;
using down_flags = std::vector<std::atomic<bool>>;

/// The front end's stand-in on the daemons: they stop its shards when it goes
/// down. It also monitors the daemons (watch_atom) and flags a node whose
/// daemon went down (its connection was lost: killed, or silent past the
/// middleman's connection timeout).
caf::behavior owner_behavior(caf::event_based_actor* self, std::shared_ptr<down_flags> down) {
  auto nodes = std::make_shared<std::map<caf::actor_addr, int>>();
  self->set_down_handler([=](caf::down_msg& dm) {
    auto it = nodes->find(dm.source);
    if (it == nodes->end()) return;
    if (it->second >= 0 && it->second < static_cast<int>(down->size())) (*down)[it->second] = true;
    nodes->erase(it);
  });
  return {
      [](stats_atom) {},
      [=](watch_atom, caf::actor d, int32_t node) {
        if (!d) return;
        (*nodes)[d.address()] = node;
        self->monitor(d);
      },
  };
}

}  // namespace

remote_host::remote_host(std::vector<remote_node> nodes, remote_options opts)
    : entries_(std::move(nodes)), opts_(std::move(opts)) {
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    topologies::node_spec s;
    s.index = static_cast<int>(i);
    auto p = topologies::find_profile(e.profile.empty() ? opts_.default_profile : e.profile);
    s.prof = p ? *p : topologies::host_profile();
    if (e.memory) s.prof.memory_bytes = e.memory;
    else if (opts_.default_memory) s.prof.memory_bytes = opts_.default_memory;
    s.spare = e.spare;
    specs_.push_back(std::move(s));
  }
}

result<std::shared_ptr<remote_host>> remote_host::from_file(const std::string& path, remote_options opts) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("--cluster: cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  auto nodes = parse_cluster_json(ss.str(), path);
  if (!nodes) return nodes.err();
  auto prof = topologies::find_profile(opts.default_profile);
  if (!prof) return make_error("--profile: " + prof.message());
  auto tls = validate_tls(opts.net.tls);
  if (!tls) return tls.err();
  return std::make_shared<remote_host>(std::move(*nodes), std::move(opts));
}

remote_host::~remote_host() {
  // shutdown() was not called (a cluster whose start failed destroys its actor
  // system first): releasing the handle now would run the actor's cleanup on a
  // dead system, so it is left to the end of the process.
  if (owner_) new caf::actor(std::move(owner_));  // NOLINT: deliberate leak
  if (weight_server_) new caf::actor(std::move(weight_server_));  // NOLINT: likewise
}

std::vector<topologies::node_spec> remote_host::nodes() const {
  std::vector<topologies::node_spec> out;
  for (const auto& n : specs_)
    if (n.index < 0 || static_cast<size_t>(n.index) >= dropped_.size() || !dropped_[static_cast<size_t>(n.index)])
      out.push_back(n);
  return out;
}

result<void> remote_host::configure(caf::actor_system_config& cfg) {
  return configure_network(cfg, opts_.net);
}

std::string remote_host::describe(int node) const {
  if (node < 0 || node >= static_cast<int>(entries_.size())) return "node " + std::to_string(node);
  return "node " + std::to_string(node) + " (" + entries_[node].address() + ")";
}

caf::actor remote_host::daemon(int node) const {
  if (node < 0 || node >= static_cast<int>(daemons_.size())) return {};
  return caf::actor_cast<caf::actor>(daemons_[node]);
}

result<void> remote_host::connect(caf::actor_system& sys, const model::model_file& file,
                                  const model::tokenizer& tok) {
  auto net = check_network(sys, opts_.net);
  if (!net) return net;
  sys_ = &sys;
  // The weight server: daemons that lack a slice fetch it from here.
  weights_ = std::make_shared<weight_store>(file, base_name(file.path()));
  if (opts_.corrupt_chunks > 0) weights_->corrupt_next_chunks(opts_.corrupt_chunks);
  weight_server_ = spawn_weight_server(sys, weights_);
  const size_t n = entries_.size();
  const bool tls = opts_.net.tls.requested();
  caf::scoped_actor self{sys};

  // 1. Connections, all at once: the wait is one deadline, not n. A handshake
  // that CAF dropped at a heartbeat tick (see actors/tls.hpp) is retried
  // while the deadline allows; a frozen node fails every attempt.
  // Strong handles only while connecting: afterwards this host keeps weak
  // ones (see remote.hpp), so that it may outlive the actor system.
  std::vector<caf::actor> d(n);
  {
    using clk = std::chrono::steady_clock;
    auto mm = connector(sys, tls);
    const auto until = clk::now() + opts_.connect_timeout;
    std::vector<std::string> errs(n);
    std::vector<int> attempts(n, 0);
    std::vector<size_t> todo;
    for (size_t i = 0; i < n; ++i) todo.push_back(i);
    while (!todo.empty()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now());
      if (left.count() < 1) left = std::chrono::milliseconds(1);
      // Through the guard dialer (actors/guard.hpp): CAF talks to a loopback
      // relay that first exchanges cellshard's preamble with the daemon.
      std::vector<uint16_t> local(n, 0);
      for (size_t i : todo) {
        auto p = guarded_port(entries_[i].host, entries_[i].port);
        if (p) local[i] = *p;
        else errs[i] = p.message();
      }
      auto send = [&](size_t i) {
        return self->request(mm, left, caf::connect_atom::value, std::string("127.0.0.1"), local[i]);
      };
      std::vector<decltype(send(0))> pending;
      for (size_t i : todo) pending.push_back(send(i));
      std::vector<size_t> again;
      for (size_t k = 0; k < todo.size(); ++k) {
        const size_t i = todo[k];
        pending[k].receive(
            [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
              if (ptr) d[i] = caf::actor_cast<caf::actor>(ptr);
              else errs[i] = "no cellshard node daemon published there";
            },
            [&](caf::error& e) {
              const bool stalled = e.category() == caf::atom("system") &&
                                   static_cast<caf::sec>(e.code()) == caf::sec::connection_timeout;
              const std::string guard = dial_error(entries_[i].host, entries_[i].port);
              if (stalled && guard.empty() && ++attempts[i] < 5 && clk::now() < until) again.push_back(i);
              else
                errs[i] = std::string("cannot connect") + (tls ? " (TLS)" : "") + ", deadline " +
                          std::to_string(opts_.connect_timeout.count()) + " ms: " +
                          (guard.empty() ? describe_connect_error(sys, e) : guard);
            });
      }
      todo = std::move(again);
    }
    std::string errors;
    for (size_t i = 0; i < n; ++i)
      if (!errs[i].empty()) append(errors, describe(static_cast<int>(i)) + ": " + errs[i]);
    if (!errors.empty()) return make_error(errors);
  }

  // 2. Join with the cluster fingerprint.
  down_ = std::make_shared<down_flags>(n);
  for (auto& f : *down_) f = false;
  caf::actor owner = sys.spawn<caf::hidden>(owner_behavior, down_);
  auto stop_owner = [&] { self->send_exit(owner, caf::exit_reason::user_shutdown); };
  cluster_fingerprint fp;
  fp.model_name = base_name(file.path());
  fp.model_digest = file.file_bytes();  // protocol 6: the manifests are the check
  fp.tokenizer_name = base_name(tok.name());
  fp.tokenizer_digest = tok.digest();
  {
    std::vector<node_joined> replies(n);
    std::vector<std::string> errs(n);
    backends_.assign(n, {});
    big_endian_.assign(n, false);
    auto send = [&](size_t i) {
      return self->request(d[i], opts_.request_timeout, node_join{fp, static_cast<int32_t>(i), owner});
    };
    std::vector<decltype(send(0))> pending;
    for (size_t i = 0; i < n; ++i) pending.push_back(send(i));
    for (size_t i = 0; i < n; ++i)
      pending[i].receive([&](node_joined& r) { replies[i] = std::move(r); },
                         [&](caf::error& e) {
                           errs[i] = "no answer to the join within " +
                                     std::to_string(opts_.request_timeout.count()) + " ms: " +
                                     describe_connect_error(sys, e);
                         });
    std::string errors;
    for (size_t i = 0; i < n; ++i) {
      const std::string who = describe(static_cast<int>(i));
      const auto& r = replies[i];
      if (!errs[i].empty()) {
        append(errors, who + ": " + errs[i]);
      } else if (!r.error.empty()) {
        append(errors, who + " refused to join: " + r.error);
      } else {
        std::string diff;
        if (r.fp.protocol != fp.protocol)
          append(diff, "protocol version " + std::to_string(r.fp.protocol) + " (front end: " +
                           std::to_string(fp.protocol) + ")");
        if (r.fp.model_digest != fp.model_digest)
          append(diff, "model differs: its " + r.fp.model_name + " in " + r.models_dir + " has digest " +
                           model::format_digest(r.fp.model_digest) + ", the front end's " + fp.model_name + " has " +
                           model::format_digest(fp.model_digest));
        if (r.fp.tokenizer_digest != fp.tokenizer_digest)
          append(diff, "tokenizer differs: its " + r.fp.tokenizer_name + " in " + r.models_dir +
                           " has digest " + model::format_digest(r.fp.tokenizer_digest) + ", the front end's " +
                           fp.tokenizer_name + " has " + model::format_digest(fp.tokenizer_digest));
        if (!diff.empty()) append(errors, who + " refused: cluster fingerprint mismatch: " + diff);
        // The link the daemon shapes is the target its measurement is held to.
        specs_[i].prof.link = topologies::link_spec{r.link_bandwidth_bps, r.link_latency_us};
        backends_[i] = r.backends;
        big_endian_[i] = r.big_endian;
      }
    }
    if (!errors.empty()) {
      stop_owner();
      self->send_exit(weight_server_, caf::exit_reason::user_shutdown);
      return make_error(errors);
    }
  }

  // 3. Direct links between the daemons (node i dials every j > i).
  if (opts_.direct_links && n > 1) {
    auto send = [&](size_t i) {
      node_peers p;
      for (size_t j = i + 1; j < n; ++j) {
        p.nodes.push_back(static_cast<int32_t>(j));
        p.hosts.push_back(entries_[j].host);
        p.ports.push_back(entries_[j].port);
      }
      // The daemon's own peer deadline comes first; ours covers a silent daemon.
      return self->request(d[i], opts_.connect_timeout * 2, std::move(p));
    };
    std::vector<decltype(send(0))> pending;
    for (size_t i = 0; i + 1 < n; ++i) pending.push_back(send(i));
    std::string errors;
    for (size_t i = 0; i + 1 < n; ++i) {
      const std::string who = describe(static_cast<int>(i));
      pending[i].receive(
          [&](node_peers_done& d) {
            if (!d.error.empty()) append(errors, who + " cannot reach " + d.error);
          },
          [&](caf::error& e) {
            append(errors, who + ": no answer while linking to the other nodes: " +
                               describe_connect_error(sys, e));
          });
    }
    if (!errors.empty()) {
      stop_owner();
      return make_error(errors);
    }
  }
  daemons_.clear();
  for (size_t i = 0; i < n; ++i) {
    daemons_.push_back(d[i].address());
    self->send(owner, watch_atom::value, d[i], static_cast<int32_t>(i));
  }
  owner_ = std::move(owner);
  return {};
}

result<shard_spawn> remote_host::make_spawn(const shard_request& req) const {
  if (!req.placed) return make_error("spawn without a placed shard");
  const auto& p = *req.placed;
  const int node = p.node;
  if (!daemon(node) || !owner_ || !reachable(node)) return make_error(describe(node) + ": not connected (its daemon is gone)");
  shard_spawn s;
  if (req.faults)
    for (const auto& f : req.faults->pending(static_cast<uint32_t>(p.index))) s.faults.push_back(supervision::to_string(f));
  s.owner = owner_;
  s.index = p.index;
  s.stage = p.stage;
  s.rank = p.rank;
  s.group_size = p.group_size;
  s.node = node;
  s.layer_begin = req.spec.layer_begin;
  s.layer_end = req.spec.layer_end;
  s.kv_head_begin = req.spec.kv_head_begin;
  s.kv_head_end = req.spec.kv_head_end;
  s.ffn_begin = req.spec.ffn_begin;
  s.ffn_end = req.spec.ffn_end;
  s.embedding = req.spec.embedding;
  s.classifier = req.spec.classifier;
  s.vocab_begin = req.spec.vocab_begin;
  s.vocab_end = req.spec.vocab_end;
  s.routed = req.spec.routed;
  s.experts.assign(req.spec.experts.begin(), req.spec.experts.end());
  s.weights = model::to_string(req.weights);
  s.matmul = req.matmul == kernels::matmul_mode::count ? "" : kernels::to_string(req.matmul);
  s.ctx = req.ctx;
  s.kernels = req.kernels;
  s.kv_bytes = p.memory.kv_cache;
  s.buffer_bytes = p.memory.buffers;
  s.checkpoint_every = req.checkpoint_every;
  s.batch_size = req.batch_size;
  s.restarted = req.restarted;
  s.heartbeat = req.heartbeat;
  s.coordinator = req.coordinator;
  if (weights_) {
    auto m = weights_->manifest_for(req.spec);
    if (!m) return make_error(describe(node) + ": placement index " + std::to_string(p.index) + ": " + m.message());
    s.manifest = m->encode();
    s.weight_server = weight_server_;
  }
  return s;
}

namespace {

using spawn_tick_atom = caf::atom_constant<caf::atom("cs_sptick")>;

/// One remote spawn in flight (issue #15): the protocol of shard_spawn as
/// an event-based actor, so that nothing waits in a supervisor's factory or
/// on a thread of its own. It monitors the daemon (a daemon that stops, or
/// whose connection drops, ends the spawn at once with its down_msg), ships
/// the slice when the daemon answers "need" (a window of chunks, the next
/// per slice_ack, then the spawn again; actors/weight_server.hpp), and
/// checks every 100 ms whether to give up: `abandon` (the node is suspected
/// silent) or no answer within `timeout` -- counted from the last chunk
/// served while a slice is being shipped.
struct spawn_job {
  caf::actor target;
  shard_spawn msg;
  std::shared_ptr<weight_store> weights;  // null: no shipping
  int ship_window = 2;
  std::chrono::milliseconds timeout{0};
  std::function<bool()> abandon;
  std::string who;  // describe(node)
  /// Called once, on the spawner's thread: the daemon's reply (shard set on
  /// success) or an error; `gone`: the daemon went down meanwhile.
  std::function<void(result<shard_spawned>, bool gone)> finish;
};

struct spawner_state {
  spawn_job job;
  std::optional<slice_shipment> shipping;
  int rounds = 0;  // shipping rounds (a chunk failing its digest is shipped in the next)
  std::chrono::steady_clock::time_point until;
  bool finished = false;
  static inline const char* name = "cellshard.spawner";
};

constexpr int max_ship_rounds = 4;

caf::behavior spawner(caf::stateful_actor<spawner_state>* self, spawn_job job) {
  using clk = std::chrono::steady_clock;
  auto& st = self->state;
  st.job = std::move(job);
  st.until = clk::now() + st.job.timeout;
  auto finish = [self](result<shard_spawned> r, bool gone) {
    auto& st = self->state;
    if (st.finished) return;
    st.finished = true;
    self->demonitor(st.job.target);
    auto f = std::move(st.job.finish);
    if (f) f(std::move(r), gone);
    self->quit();
  };
  auto send_chunks = [self] {
    auto& st = self->state;
    if (!st.shipping) return;
    for (auto& c : st.shipping->next()) self->send(st.job.target, c.first, std::move(c.second));
    if (st.shipping->done()) {
      st.shipping.reset();
      self->send(st.job.target, st.job.msg);
    }
  };
  // A daemon still fetching its slice (a chunk served within the last
  // timeout) is not given up on: the deadline runs from the last chunk.
  auto shipping_recently = [self] {
    auto& st = self->state;
    if (!st.job.weights) return false;
    const int64_t last = st.job.weights->last_activity_ns();
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count();
    return last != 0 && now - last < std::chrono::duration_cast<std::chrono::nanoseconds>(st.job.timeout).count();
  };
  self->set_down_handler([self, finish](caf::down_msg& dm) {
    if (dm.source != self->state.job.target.address()) return;
    finish(make_error(self->state.job.who + ": its daemon went down while spawning (" +
                      self->system().render(dm.reason) + ")"),
           true);
  });
  self->monitor(st.job.target);
  self->send(st.job.target, st.job.msg);
  self->delayed_send(self, std::chrono::milliseconds(100), spawn_tick_atom::value);
  return {
      [self, finish, send_chunks](shard_spawned& r) {
        auto& st = self->state;
        if (r.error.empty() && !r.shard && r.source == "need" && st.job.weights && st.rounds < max_ship_rounds) {
          ++st.rounds;
          auto m = model::manifest::decode(st.job.msg.manifest);
          if (!m) return;  // cannot happen: the manifest was made here
          st.shipping.emplace(st.job.weights, m->digest(), m->bytes(), st.job.ship_window);
          send_chunks();
          return;  // the daemon answers the spawn sent after the chunks
        }
        if (r.source == "need" && r.error.empty())
          r.error = "the slice still lacks chunks after " + std::to_string(max_ship_rounds) + " shipping rounds";
        if (!r.error.empty() || !r.shard) {
          finish(make_error(st.job.who + ": " + (r.error.empty() ? "no shard" : r.error)), false);
          return;
        }
        finish(std::move(r), false);
      },
      [self, send_chunks](slice_ack& a) {
        auto& st = self->state;
        if (st.shipping && st.shipping->ack(a)) send_chunks();
      },
      [self, finish, shipping_recently](spawn_tick_atom) {
        auto& st = self->state;
        if (st.job.abandon && st.job.abandon()) {
          finish(make_error(st.job.who + ": given up while spawning (the node is suspected silent)"), false);
        } else if (clk::now() >= st.until && !shipping_recently()) {
          finish(make_error(st.job.who + ": no answer to the spawn request within " +
                            std::to_string(st.job.timeout.count()) + " ms"),
                 false);
        } else {
          self->delayed_send(self, std::chrono::milliseconds(100), spawn_tick_atom::value);
        }
      },
  };
}

}  // namespace

void remote_host::spawn_async(caf::actor_system& sys, const shard_request& req, spawn_done done) {
  auto s = make_spawn(req);
  if (!s) {
    done(make_error(s.message()));
    return;
  }
  const int node = req.placed->node;
  const int index = req.placed->index;
  spawn_job job;
  job.target = daemon(node);
  job.msg = std::move(*s);
  job.weights = weights_;
  job.ship_window = opts_.ship_window;
  job.timeout = opts_.request_timeout;
  job.abandon = req.abandon;
  job.who = describe(node);
  auto loads = loads_;
  auto down = down_;
  job.finish = [loads, down, node, index, done = std::move(done)](result<shard_spawned> r, bool gone) {
    if (gone && down && node < static_cast<int>(down->size())) (*down)[node] = true;
    if (!r) {
      done(make_error(r.message()));
      return;
    }
    weight_load w;
    w.index = index;
    w.node = node;
    w.source = r->source;
    w.shipped_bytes = r->shipped_bytes;
    w.bytes_read = r->bytes_read;
    w.reload_ms = r->reload_ns / 1e6;
    w.ship_ms = r->ship_ns / 1e6;
    {
      std::lock_guard<std::mutex> lock(loads->mu);
      loads->all.push_back(std::move(w));
    }
    done(r->shard);
  };
  sys.spawn<caf::hidden>(spawner, std::move(job));
}

result<caf::actor> remote_host::spawn(caf::actor_system& sys, const shard_request& req) {
  // The spawner always ends: by its own deadline (extended only while the
  // slice's chunks are being served), the daemon's down_msg, or its reply.
  // Its callback dropped unanswered (the actor system stopped) breaks the
  // promise. The wait's own bound covers a spawner that never ran at all.
  auto p = std::make_shared<std::promise<result<caf::actor>>>();
  auto f = p->get_future();
  spawn_async(sys, req, [p](result<caf::actor> r) { p->set_value(std::move(r)); });
  using clk = std::chrono::steady_clock;
  auto last = clk::now();
  int64_t seen = weights_ ? weights_->last_activity_ns() : 0;
  while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    const int64_t act = weights_ ? weights_->last_activity_ns() : 0;
    if (act != seen) {
      seen = act;
      last = clk::now();
    }
    if (clk::now() - last > 2 * opts_.request_timeout + std::chrono::seconds(1))
      return make_error(describe(req.placed ? req.placed->node : -1) + ": the spawn did not end within " +
                        std::to_string(2 * opts_.request_timeout.count() + 1000) + " ms");
  }
  try {
    return f.get();
  } catch (const std::future_error&) {
    return make_error(describe(req.placed ? req.placed->node : -1) + ": the spawn was stopped with the actor system");
  }
}

namespace {

/// The slice of the model a placed shard holds.
model::slice_spec slice_of(const topologies::shard& sh) {
  model::slice_spec s;
  s.layer_begin = sh.layers.begin;
  s.layer_end = sh.layers.end;
  s.kv_head_begin = sh.kv_heads.begin;
  s.kv_head_end = sh.kv_heads.end;
  s.ffn_begin = sh.ffn.begin;
  s.ffn_end = sh.ffn.end;
  s.embedding = sh.has_embedding;
  s.classifier = sh.has_classifier;
  s.vocab_begin = sh.vocab.begin;
  s.vocab_end = sh.vocab.end;
  s.routed = sh.routed;
  s.experts = sh.experts;
  return s;
}

}  // namespace

std::vector<skipped_node> remote_host::drop_unfit(caf::actor_system& sys, const topologies::placement& plan) {
  std::vector<skipped_node> out;
  if (!weights_ || plan.shards.empty()) return out;
  // Every slice of the plan: manifest key, bytes, memory need.
  slice_room_ask all;
  all.model_name = weights_->name();
  all.file_bytes = weights_->file_bytes();
  for (const auto& sh : plan.shards) {
    auto m = weights_->manifest_for(slice_of(sh));
    if (!m) return out;  // the spawn reports it, naming the node
    all.keys.push_back(m->digest());
    all.bytes.push_back(m->bytes());
    all.need.push_back(sh.memory.total());
  }
  // What each node is asked: a shard holder its shards' slices, a spare all of them.
  std::map<int, std::vector<size_t>> asked;
  for (size_t i = 0; i < plan.shards.size(); ++i) asked[plan.shards[i].node].push_back(i);
  std::set<int> spares;
  for (const auto& sp : plan.spares) {
    spares.insert(sp.node);
    for (size_t i = 0; i < plan.shards.size(); ++i) asked[sp.node].push_back(i);
  }
  caf::scoped_actor self{sys};
  std::vector<int> which;
  std::vector<std::vector<size_t>> slices;
  auto send = [&](int node, const std::vector<size_t>& idx) {
    slice_room_ask a;
    a.model_name = all.model_name;
    a.file_bytes = all.file_bytes;
    for (size_t i : idx) {
      a.keys.push_back(all.keys[i]);
      a.bytes.push_back(all.bytes[i]);
      a.need.push_back(all.need[i]);
    }
    return self->request(daemon(node), opts_.request_timeout, std::move(a));
  };
  std::vector<decltype(send(0, {}))> pending;
  for (const auto& kv : asked) {
    if (!daemon(kv.first)) continue;
    which.push_back(kv.first);
    slices.push_back(kv.second);
    pending.push_back(send(kv.first, kv.second));
  }
  dropped_.resize(entries_.size(), false);
  for (size_t k = 0; k < pending.size(); ++k) {
    const int node = which[k];
    std::string why;
    pending[k].receive(
        [&](slice_room& r) {
          const auto& idx = slices[k];
          if (r.verdicts.size() != idx.size()) return;  // not an answer to this question: keep the node
          if (spares.count(node)) {
            // A spare stays when it can hold at least one shard of the plan.
            bool any = false;
            for (const auto& v : r.verdicts) any = any || v.empty();
            if (!any) why = "as a spare it cannot hold any shard of the placement: " + r.verdicts.front();
            return;
          }
          for (size_t j = 0; j < idx.size() && why.empty(); ++j)
            if (!r.verdicts[j].empty())
              why = "placement index " + std::to_string(plan.shards[idx[j]].index) + ": " + r.verdicts[j];
        },
        [&](caf::error&) {});  // no answer: kept; its spawn will say what is wrong
    if (why.empty()) continue;
    dropped_[static_cast<size_t>(node)] = true;
    out.push_back(skipped_node{node, describe(node), why});
  }
  std::sort(out.begin(), out.end(), [](const skipped_node& a, const skipped_node& b) { return a.node < b.node; });
  return out;
}

std::vector<std::string> remote_host::join_notes(const std::string& kernels) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < backends_.size(); ++i) {
    const auto& b = backends_[i];
    if (b.empty() || std::find(b.begin(), b.end(), kernels) != b.end()) continue;
    // The daemon's substitute, by the rule of kernels::choose_backend().
    const bool native = std::find(b.begin(), b.end(), "native") != b.end();
    std::string have;
    for (const auto& n : b) have += (have.empty() ? "" : ", ") + n;
    out.push_back(describe(static_cast<int>(i)) + " (" + (big_endian_[i] ? "big" : "little") +
                  "-endian) has no '" + kernels + "' backend (its build has " + have +
                  "): its shards run on '" + (native ? "native" : "reference") +
                  "', which conforms to the reference");
  }
  return out;
}

std::vector<uint64_t> remote_host::node_memory() const {
  std::vector<uint64_t> out(entries_.size(), 0);
  if (!sys_) return out;
  caf::scoped_actor self{*sys_};
  auto send = [&](size_t i) {
    return self->request(daemon(static_cast<int>(i)), std::chrono::seconds(2), stats_atom::value);
  };
  std::vector<decltype(send(0))> pending;
  std::vector<size_t> which;
  for (size_t i = 0; i < daemons_.size(); ++i)
    if (daemon(static_cast<int>(i))) {
      pending.push_back(send(i));
      which.push_back(i);
    }
  for (size_t k = 0; k < pending.size(); ++k)
    pending[k].receive([&](node_report& r) { out[which[k]] = r.used_bytes; }, [](caf::error&) {});
  return out;
}

result<caf::actor> remote_host::start_heartbeat(caf::actor_system& sys, int node, caf::actor monitor,
                                                std::chrono::milliseconds interval) {
  caf::actor target = daemon(node);
  if (!target || !owner_) return make_error(describe(node) + ": not connected");
  caf::scoped_actor self{sys};
  result<caf::actor> out = make_error(describe(node) + ": no reply");
  heartbeat_start h;
  h.owner = owner_;
  h.monitor = std::move(monitor);
  h.peer = static_cast<uint64_t>(node);
  h.interval_ms = interval.count();
  self->request(target, opts_.request_timeout, std::move(h))
      .receive(
          [&](heartbeat_started& r) {
            if (!r.error.empty() || !r.sender)
              out = make_error(describe(node) + ": heartbeats: " + (r.error.empty() ? "no sender" : r.error));
            else
              out = r.sender;
          },
          [&](caf::error& e) {
            out = make_error(describe(node) + ": no answer to heartbeat_start within " +
                             std::to_string(opts_.request_timeout.count()) + " ms: " +
                             describe_connect_error(sys, e));
          });
  return out;
}

bool remote_host::reachable(int node) const {
  if (!down_ || node < 0 || node >= static_cast<int>(down_->size())) return true;
  return !(*down_)[node];
}

std::vector<weight_load> remote_host::weight_loads() const {
  std::lock_guard<std::mutex> lock(loads_->mu);
  return loads_->all;
}

void remote_host::shutdown(caf::actor_system&) {
  if (owner_) caf::anon_send_exit(owner_, caf::exit_reason::user_shutdown);
  if (weight_server_) caf::anon_send_exit(weight_server_, caf::exit_reason::user_shutdown);
  weight_server_ = nullptr;
  owner_ = nullptr;
  daemons_.clear();
  sys_ = nullptr;
}

}  // namespace cellshard::actors
