#include "actors/daemon.hpp"

#include "actors/data_plane.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/shard.hpp"
#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/manifest.hpp"
#include "model/large_buffer.hpp"
#include "model/slice_cache.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/heartbeat.hpp"
#include "topologies/profile.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

namespace cellshard::actors {

namespace {

/// A file of the --models folder, reloaded when its size or mtime changes.
template <class T>
struct cached_file {
  std::shared_ptr<const T> value;
  off_t size = 0;
  int64_t mtime_ns = 0;
};

using clk = std::chrono::steady_clock;

/// A slice being shipped by the front end: chunks (slice_fetch header +
/// slice_chunk body, in one message) arrive before the front end asks for
/// the spawn again; a chunk whose size or XXH3 digest is wrong is dropped
/// (not marked), so the next round ships it again.
struct pending_slice {
  model::manifest m;
  std::vector<uint8_t> bytes;
  std::vector<bool> have;  // per chunk of chunk_bytes
  uint64_t received = 0;   // bytes of good chunks
  int last_decile = 0;
  clk::time_point started;  // the first spawn's arrival (reload time includes shipping)
  clk::time_point asked;    // the "need" answer
  clk::time_point done;     // the last chunk stored
  bool complete() const { return received == bytes.size(); }
};

struct client_record {
  cluster_fingerprint fp;
  std::set<caf::actor_addr> shards;
  std::vector<caf::actor> heartbeats;  // senders started for this front end
};

struct daemon_state {
  daemon_options opts;
  std::shared_ptr<node_state> node;
  std::map<std::string, cached_file<model::tokenizer>> toks;
  /// Slices loaded for shards running here, by (manifest key, --ctx): a
  /// second shard of the same slice (a restart in place) shares the weights.
  std::map<std::pair<uint64_t, int>, std::weak_ptr<const model::model_file>> loaded;
  std::optional<model::slice_cache> cache;  // --cache
  uint64_t shipped_bytes = 0;
  uint64_t cache_hits = 0;
  std::map<uint64_t, pending_slice> pending;  // slices being shipped, by manifest key
  std::map<caf::actor_addr, client_record> clients;  // by owner
  struct shard_record {
    caf::actor handle;
    caf::actor_addr owner;  // the front end it was spawned for
    int32_t index = 0;      // its placement index (for the log)
  };
  std::map<caf::actor_addr, shard_record> shards;  // by the shard's address
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  static inline const char* name = "cellshard.daemon";
};

using daemon_actor = caf::stateful_actor<daemon_state>;

void log(daemon_actor* self, const std::string& line) {
  if (self->state.opts.log) self->state.opts.log(line);
}

/// Resolves a plain file name inside the models folder (no folders, no "..").
result<std::string> models_path(const daemon_state& st, const std::string& name, const char* what) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return make_error(std::string("bad ") + what + " file name '" + name + "' (a plain file name is expected)");
  return st.opts.models_dir + "/" + name;
}

template <class T, class Open>
result<std::shared_ptr<const T>> open_cached(daemon_state& st, std::map<std::string, cached_file<T>>& cache,
                                             const std::string& name, const char* what, Open open) {
  auto path = models_path(st, name, what);
  if (!path) return path.err();
  struct stat sb;
  if (::stat(path->c_str(), &sb) != 0)
    return make_error(std::string(what) + " file " + name + " not found in " + st.opts.models_dir);
  const int64_t mt = static_cast<int64_t>(sb.st_mtim.tv_sec) * 1000000000 + sb.st_mtim.tv_nsec;
  auto it = cache.find(name);
  if (it != cache.end() && it->second.size == sb.st_size && it->second.mtime_ns == mt)
    return it->second.value;
  auto v = open(*path);
  if (!v) return v.err();
  cache[name] = cached_file<T>{*v, sb.st_size, mt};
  return *v;
}

result<std::shared_ptr<const model::tokenizer>> tokenizer_for(daemon_state& st, const std::string& name) {
  return open_cached<model::tokenizer>(st, st.toks, name, "tokenizer",
                                       [](const std::string& p) { return model::tokenizer::open(p); });
}

void stop_client(daemon_actor* self, const caf::actor_addr& owner, const std::string& why) {
  auto& st = self->state;
  auto it = st.clients.find(owner);
  if (it == st.clients.end()) return;
  size_t n = 0;
  for (auto& s : it->second.shards) {
    auto h = st.shards.find(s);
    if (h == st.shards.end()) continue;
    self->send_exit(h->second.handle, caf::exit_reason::user_shutdown);
    st.shards.erase(h);
    ++n;
  }
  for (auto& h : it->second.heartbeats) self->send_exit(h, caf::exit_reason::user_shutdown);
  st.clients.erase(it);
  log(self, "front end gone (" + why + "): stopped " + std::to_string(n) + " shard(s)");
  if (st.node) {  // since the daemon started (tests/net/test_cluster.cpp reads this line)
    const auto& nd = *st.node;
    std::string line = "activations received from other processes: " + std::to_string(nd.activations_frames.load()) +
                       " as data-plane frames, " + std::to_string(nd.activations_caf.load()) + " through CAF; " +
                       std::to_string(nd.activations_held.load()) + " frames held for their CAF activation, " +
                       std::to_string(nd.activations_held_dropped.load()) + " dropped";
    if (nd.data) {
      const auto d = nd.data->stats();
      line += "; data plane frames sent " + std::to_string(d.frames_sent) + " (" +
              std::to_string(d.activations_sent) + " activations), received " + std::to_string(d.frames_received) +
              " (" + std::to_string(d.activations_received) + " activations), dropped " +
              std::to_string(d.frames_dropped);
    }
    log(self, line);
  }
}

/// The weights' part of a spawn: the slice's model and how it got here.
struct slice_source {
  std::shared_ptr<const model::model_file> file;
  shard_spawned info;  // source, shipped_bytes, bytes_read
  clk::time_point arrived;
};

shard_spawned do_spawn(daemon_actor* self, shard_spawn& s, const slice_source& src) {
  auto& st = self->state;
  shard_spawned out = src.info;
  auto cl = st.clients.find(s.owner.address());
  if (!s.owner || cl == st.clients.end()) {
    out.error = "this front end has not joined (node_join first)";
    return out;
  }
  std::shared_ptr<const model::model_file> file_ptr = src.file;
  const std::shared_ptr<const model::model_file>* file = &file_ptr;
  auto fmt = model::parse_weight_format(s.weights);
  if (!fmt) {
    out.error = fmt.message();
    return out;
  }
  // A backend this build lacks (a cross build has no OpenBLAS) is replaced by
  // the best conforming one; the front end reports it from the join's list.
  const auto choice = kernels::choose_backend(s.kernels);
  if (!choice.be) {
    out.error = "kernels: " + choice.note;
    return out;
  }
  if (!choice.note.empty())
    log(self, "placement index " + std::to_string(s.index) + ": " + choice.note);
  const kernels::backend* be = choice.be;
  model::slice_spec spec;
  spec.layer_begin = s.layer_begin;
  spec.layer_end = s.layer_end;
  spec.kv_head_begin = s.kv_head_begin;
  spec.kv_head_end = s.kv_head_end;
  spec.ffn_begin = s.ffn_begin;
  spec.ffn_end = s.ffn_end;
  spec.embedding = s.embedding;
  spec.classifier = s.classifier;
  spec.vocab_begin = s.vocab_begin;
  spec.vocab_end = s.vocab_end;
  spec.routed = s.routed;
  spec.experts.assign(s.experts.begin(), s.experts.end());
  kernels::matmul_mode mm = kernels::matmul_mode::count;
  if (!s.matmul.empty()) {
    auto m = model::parse_matmul_mode(s.matmul);
    if (!m) {
      out.error = m.message();
      return out;
    }
    mm = *m;
  }
  auto w = model::shard_weights::make(*file, spec, *fmt, mm);
  if (!w) {
    out.error = w.message();
    return out;
  }
  out.reload_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now() - src.arrived).count();
  auto& n = *st.node;
  const uint64_t need = (*w)->bytes() + s.kv_bytes + s.buffer_bytes;
  const uint64_t used = n.used_bytes.load();
  if (n.budget_bytes != 0 && used + need > n.budget_bytes) {
    out.error = "out of memory (" + n.profile + ", budget " + topologies::format_bytes(n.budget_bytes) +
                "): placement index " + std::to_string(s.index) + " needs " +
                topologies::format_bytes(need) + " (weights " + topologies::format_bytes((*w)->bytes()) +
                " + KV cache " + topologies::format_bytes(s.kv_bytes) + " + buffers " +
                topologies::format_bytes(s.buffer_bytes) + "), " + topologies::format_bytes(used) +
                " already in use";
    return out;
  }
  std::shared_ptr<supervision::fault_injector> faults;
  if (!s.faults.empty()) {
    faults = std::make_shared<supervision::fault_injector>();
    for (const auto& spec : s.faults) {
      auto p = supervision::parse_fault_spec(spec);
      if (!p) {
        out.error = "placement index " + std::to_string(s.index) + ": " + p.message();
        return out;
      }
      if (p->node != static_cast<uint32_t>(s.index)) {
        out.error = "placement index " + std::to_string(s.index) + ": fault plan '" + spec +
                    "' is for placement index " + std::to_string(p->node);
        return out;
      }
      faults->add(*p);
    }
  }
  n.index = s.node;
  shard_init init;
  init.index = s.index;
  init.stage = s.stage;
  init.rank = s.rank;
  init.group_size = s.group_size;
  init.checkpoint_every = s.checkpoint_every;
  init.batch_size = s.batch_size;
  init.restarted = s.restarted;
  init.faults = std::move(faults);
  init.heartbeat = s.heartbeat;
  init.coordinator = s.coordinator;
  init.weights = *w;
  init.backend = be;
  init.node = st.node;
  caf::actor a = spawn_shard(self->system(), std::move(init));
  self->monitor(a);  // the down handler forgets it when it ends
  cl->second.shards.insert(a.address());
  st.shards[a.address()] = daemon_state::shard_record{a, s.owner.address(), s.index};
  out.shard = a;
  out.weight_bytes = (*w)->bytes();
  log(self, "placement index " + std::to_string(s.index) + " (stage " + std::to_string(s.stage) +
                " rank " + std::to_string(s.rank) + ", " + spec.to_string() + ") started, " +
                topologies::format_bytes(out.weight_bytes) + " of weights (slice from " + out.source + ")" +
                (s.faults.empty() ? std::string() : ", " + std::to_string(s.faults.size()) + " fault plan(s)"));
  return out;
}

std::string who(const shard_spawn& s) { return "placement index " + std::to_string(s.index); }

/// Builds the model of a verified slice image, remembers it and spawns.
shard_spawned spawn_from_slice(daemon_actor* self, shard_spawn& s, const model::manifest& m,
                               const std::vector<uint8_t>& bytes, shard_spawned info, clk::time_point arrived) {
  model::load_options lo;
  lo.ctx = s.ctx;
  auto f = model::open_slice(m, bytes.data(), bytes.size(), lo);
  if (!f) {
    info.error = who(s) + ": " + f.message();
    return info;
  }
  self->state.loaded[{m.digest(), s.ctx}] = *f;
  return do_spawn(self, s, slice_source{*f, info, arrived});
}

/// shard_spawn: the slice from memory, --cache, --models or the front end.
caf::result<shard_spawned> acquire_and_spawn(daemon_actor* self, shard_spawn& s) {
  auto& st = self->state;
  const auto arrived = clk::now();
  shard_spawned out;
  auto cl = st.clients.find(s.owner.address());
  if (!s.owner || cl == st.clients.end()) {
    out.error = "this front end has not joined (node_join first)";
    return out;
  }
  auto m = model::manifest::decode(s.manifest);
  if (!m) {
    out.error = who(s) + ": " + m.message();
    return out;
  }
  // 1. Loaded already (a restart in place, or two shards of one slice).
  auto it = st.loaded.find({m->digest(), s.ctx});
  if (it != st.loaded.end()) {
    if (auto f = it->second.lock()) {
      out.source = "memory";
      return do_spawn(self, s, slice_source{f, out, arrived});
    }
    st.loaded.erase(it);
  }
  // 2. The cache.
  if (st.cache) {
    auto g = st.cache->get(*m);
    if (!g) {
      out.error = who(s) + ": " + g.message();
      return out;
    }
    if (g->found) {
      ++st.cache_hits;
      out.source = "cache";
      out.bytes_read = g->bytes.size();
      return spawn_from_slice(self, s, *m, g->bytes, out, arrived);
    }
    if (!g->dropped.empty()) log(self, who(s) + ": " + g->dropped + "; removed, fetching the slice again");
  }
  // 3. The node's own copy of the file: only the manifest's bytes, verified.
  if (!st.opts.models_dir.empty()) {
    auto path = models_path(st, m->model_name, "model");
    struct stat sb;
    if (path && ::stat(path->c_str(), &sb) == 0) {
      uint64_t read = 0;
      auto failure = model::slice_file_failure::none;
      model::load_options lo;
      lo.ctx = s.ctx;
      auto f = model::open_slice_file(*m, *path, "its " + m->model_name + " in " + st.opts.models_dir, lo, &read,
                                      &failure);
      if (!f) {
        if (failure == model::slice_file_failure::model)
          out.error = who(s) + ": " + f.message();
        else
          out.error = "model differs: " + f.message() +
                      (failure == model::slice_file_failure::digest ? " (the front end's manifest)" : "");
        return out;
      }
      out.source = "models";
      out.bytes_read = read;
      st.loaded[{m->digest(), s.ctx}] = *f;
      return do_spawn(self, s, slice_source{*f, out, arrived});
    }
  }
  // 4. Shipped by the front end: it pushes the chunks, then asks again.
  if (!s.weight_server) {
    out.error = who(s) + ": the slice of " + m->model_name + " (" + std::to_string(m->bytes()) +
                " bytes) is neither in --models " + st.opts.models_dir + " nor in the cache, and the front end ships none";
    return out;
  }
  if (st.cache && !st.cache->fits(m->bytes())) {
    out.error = "no room for the slice: " + who(s) + " of " + m->model_name + " needs " +
                std::to_string(m->bytes()) + " bytes, --cache-max of " + st.cache->dir() + " is " +
                std::to_string(st.cache->max_bytes());
    return out;
  }
  const uint64_t key = m->digest();
  auto pit = st.pending.find(key);
  if (pit != st.pending.end() && pit->second.complete()) {
    pending_slice p = std::move(pit->second);
    st.pending.erase(pit);
    shard_spawned info;
    info.source = "shipped";
    info.shipped_bytes = p.received;
    info.ship_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(p.done - p.asked).count();
    auto ok = model::verify_slice(p.m, p.bytes.data(), p.bytes.size(), "the slice shipped by the front end");
    if (!ok) {  // every chunk passed its digest, the whole did not: ship it all again
      info.error = who(s) + ": " + ok.message();
      return info;
    }
    const double ms = std::chrono::duration<double, std::milli>(clk::now() - p.started).count();
    std::string stored;
    if (st.cache) {
      auto put = st.cache->put(p.m, p.bytes.data(), p.bytes.size());
      stored = put ? ", stored in " + st.cache->dir() : ", not stored: " + put.message();
    }
    log(self, who(s) + ": shipped " + std::to_string(p.bytes.size()) + " bytes of slice " + p.m.key() + " in " +
                  std::to_string(ms) + " ms" + stored);
    return spawn_from_slice(self, s, p.m, p.bytes, info, p.started);
  }
  if (pit == st.pending.end()) {
    pending_slice p;
    p.m = *m;
    p.bytes = model::large_buffer(m->bytes());
    p.have.assign((m->bytes() + st.opts.chunk_bytes - 1) / st.opts.chunk_bytes, false);
    p.started = arrived;
    p.asked = clk::now();
    st.pending.emplace(key, std::move(p));
    log(self, who(s) + ": slice " + m->key() + " of " + m->model_name + " not here; " + std::to_string(m->bytes()) +
                  " bytes to be shipped by the front end");
  }
  out.source = "need";  // the front end ships the chunks and asks again
  return out;
}

/// A chunk of a pending slice (shipped by the front end's weight server,
/// actors/weight_server.hpp); the acknowledgement goes back to the sender.
slice_ack take_chunk(daemon_actor* self, const slice_fetch& h, const slice_chunk& c) {
  auto& st = self->state;
  slice_ack ack;
  ack.key = h.key;
  ack.offset = h.offset;
  auto it = st.pending.find(h.key);
  if (it == st.pending.end()) {  // not asked for (or done)
    ack.status = 2;
    ack.error = "no spawn here waits for slice " + model::format_digest(h.key);
    return ack;
  }
  auto& p = it->second;
  const uint64_t cb = st.opts.chunk_bytes;
  const uint64_t total = p.bytes.size();
  const bool aligned = h.offset % cb == 0 && h.offset < total;
  const uint64_t len = aligned ? std::min<uint64_t>(cb, total - h.offset) : 0;
  const bool good = aligned && c.error.empty() && c.bytes.size() == len &&
                    XXH3_64bits(c.bytes.data(), c.bytes.size()) == c.digest;
  if (!good) {
    log(self, "the chunk at byte " + std::to_string(h.offset) + " of slice " + p.m.key() + " failed its check (size " +
                  std::to_string(c.bytes.size()) + " of " + std::to_string(len) +
                  ", or its XXH3 digest); shipping it again" + (c.error.empty() ? "" : ": " + c.error));
    ack.status = 1;
    ack.error = c.error;
    return ack;
  }
  const size_t i = h.offset / cb;
  if (p.have[i]) return ack;
  std::memcpy(p.bytes.data() + h.offset, c.bytes.data(), len);
  p.have[i] = true;
  p.received += len;
  if (p.complete()) p.done = clk::now();
  st.shipped_bytes += len;
  const int decile = static_cast<int>(p.received * 10 / total);
  if (decile > p.last_decile && p.received < total) {
    p.last_decile = decile;
    log(self, "slice " + p.m.key() + ": shipping " + std::to_string(decile * 10) + "% (" + std::to_string(p.received) +
                  " of " + std::to_string(total) + " bytes)");
  }
  return ack;
}

/// slice_room_ask: per slice, "" when this node can hold it, else why not.
/// The memory check is the spawn's (budget against what is in use), with the
/// placement's need; the cache check applies only to a slice that would be
/// shipped (not loaded here, not in --cache, no --models copy of the file).
slice_room room_for(daemon_actor* self, const slice_room_ask& a) {
  auto& st = self->state;
  auto& node = *st.node;
  slice_room out;
  bool have_copy = false;
  if (!st.opts.models_dir.empty()) {
    auto path = models_path(st, a.model_name, "model");
    struct stat sb;
    have_copy = path && ::stat(path->c_str(), &sb) == 0 && static_cast<uint64_t>(sb.st_size) == a.file_bytes;
  }
  auto loaded = [&](uint64_t key) {
    for (const auto& kv : st.loaded)
      if (kv.first.first == key && !kv.second.expired()) return true;
    return false;
  };
  const uint64_t used = node.used_bytes.load();
  const size_t n = std::min({a.keys.size(), a.bytes.size(), a.need.size()});
  for (size_t i = 0; i < n; ++i) {
    std::string why;
    if (node.budget_bytes != 0 && used + a.need[i] > node.budget_bytes) {
      why = "out of memory (" + node.profile + ", budget " + topologies::format_bytes(node.budget_bytes) +
            "): the shard needs " + topologies::format_bytes(a.need[i]) + " (weights, KV cache and buffers), " +
            topologies::format_bytes(used) + " already in use";
    } else if (st.cache && !have_copy && !loaded(a.keys[i]) && !st.cache->holds(a.keys[i]) &&
               !st.cache->fits(a.bytes[i])) {
      why = "no room for the slice: it needs " + std::to_string(a.bytes[i]) + " bytes, --cache-max of " +
            st.cache->dir() + " is " + std::to_string(st.cache->max_bytes());
    }
    out.verdicts.push_back(std::move(why));
  }
  return out;
}

/// Connecting to the other daemons of a cluster, one after another. CAF 0.17.6
/// drops a connection whose handshake has not completed by the next heartbeat
/// tick with connection_timeout (actors/tls.hpp), which TLS handshakes hit a
/// few times in a hundred; such a handshake is retried while the deadline
/// allows.
struct peer_job {
  node_peers peers;
  size_t next = 0;
  int attempt = 0;
  node_peers_done out;
  caf::response_promise rp;
  caf::io::middleman_actor mm;
  std::chrono::steady_clock::time_point until;
};

void dial_next(daemon_actor* self, std::shared_ptr<peer_job> job) {
  const auto& p = job->peers;
  const size_t n = std::min({p.nodes.size(), p.hosts.size(), p.ports.size()});
  if (job->next >= n) {
    job->rp.deliver(job->out);
    return;
  }
  const size_t i = job->next;
  const std::string who = "node " + std::to_string(p.nodes[i]) + " (" + p.hosts[i] + ":" +
                          std::to_string(p.ports[i]) + ")";
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(job->until - std::chrono::steady_clock::now());
  if (left.count() < 1) left = std::chrono::milliseconds(1);
  auto local = guarded_port(p.hosts[i], p.ports[i]);
  if (!local) {
    job->out.error += (job->out.error.empty() ? "" : "; ") + who + ": " + local.message();
    job->next++;
    job->attempt = 0;
    dial_next(self, job);
    return;
  }
  self->request(job->mm, left, caf::connect_atom::value, std::string("127.0.0.1"), *local)
      .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (!ptr) {
              job->out.error += (job->out.error.empty() ? "" : "; ") + who + ": no actor published there";
              job->next++;
              job->attempt = 0;
              dial_next(self, job);
              return;
            }
            // One round trip on the new connection: when it returns, the peer
            // has processed our side of the handshake too, so it routes to us
            // directly (not through whoever introduces us later).
            auto left2 = std::chrono::duration_cast<std::chrono::milliseconds>(job->until - std::chrono::steady_clock::now());
            if (left2.count() < 1) left2 = std::chrono::milliseconds(1);
            self->request(caf::actor_cast<caf::actor>(ptr), left2, stats_atom::value)
                .then(
                    [=](node_report&) {
                      ++job->out.connected;
                      job->next++;
                      job->attempt = 0;
                      dial_next(self, job);
                    },
                    [=](caf::error& e) {
                      job->out.error += (job->out.error.empty() ? "" : "; ") + who + ": no answer after connecting: " +
                                        describe_connect_error(self->system(), e);
                      job->next++;
                      job->attempt = 0;
                      dial_next(self, job);
                    });
          },
          [=](caf::error& e) {
            const bool stalled = e.category() == caf::atom("system") &&
                                 static_cast<caf::sec>(e.code()) == caf::sec::connection_timeout;
            if (stalled && job->attempt < 5 && std::chrono::steady_clock::now() < job->until) {
              ++job->attempt;
              log(self, "connection to " + who + " stalled; retrying");
              dial_next(self, job);
              return;
            }
            job->out.error += (job->out.error.empty() ? "" : "; ") + who + ": " +
                              describe_connect_error(self->system(), e);
            job->next++;
            job->attempt = 0;
            dial_next(self, job);
          });
}

caf::behavior daemon_behavior(daemon_actor* self, daemon_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.node = std::make_shared<node_state>();
  auto prof = topologies::find_profile(st.opts.profile);
  st.node->profile = st.opts.profile;
  {
    const int kt = st.opts.threads > 0 ? st.opts.threads : kernels::available_cpus();
    if (kt > 1) st.node->kernel_pool = std::make_shared<kernels::pool>(kt);
  }
  st.node->budget_bytes = st.opts.memory ? st.opts.memory : (prof ? prof->memory_bytes : 0);
  if (!st.opts.cache_dir.empty()) {
    auto c = model::slice_cache::open(st.opts.cache_dir, st.opts.cache_max);
    if (c) st.cache = std::move(*c);  // validated by node_daemon::start
  }
  {
    topologies::link_spec link = prof ? prof->link : topologies::link_spec{};
    if (!st.opts.link.empty()) {
      auto l = topologies::parse_link(st.opts.link);
      if (l) link = *l;  // validated by node_daemon::start
    }
    st.node->shaper = std::make_shared<link_shaper>(link);
  }
  // Partial sums between daemons on sockets of their own (actors/data_plane.hpp);
  // not with TLS (frames are not encrypted) nor on a wildcard address (peers
  // would not know where to dial).
  if (!st.opts.net.tls.requested() && data_plane::enabled_by_env() && st.opts.host != "0.0.0.0" &&
      st.opts.host != "::" && !st.opts.host.empty()) {
    if (auto dp = data_plane::start(st.opts.host, st.opts.log)) st.node->data = std::move(*dp);
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    if (st.clients.count(dm.source)) {
      stop_client(self, dm.source, self->system().render(dm.reason));
      return;
    }
    auto sh = st.shards.find(dm.source);
    if (sh == st.shards.end()) return;  // stopped with its front end (stop_client logged it)
    // E.g. the front end took the shard away (its node was suspected silent)
    // or an injected crash.
    auto cl = st.clients.find(sh->second.owner);
    if (cl != st.clients.end()) {
      cl->second.shards.erase(dm.source);
      log(self, "placement index " + std::to_string(sh->second.index) + " stopped: " +
                    self->system().render(dm.reason));
    }
    st.shards.erase(sh);
  });
  // Stopping the daemon (an exit message) stops every shard it spawned.
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto& kv : self->state.shards) self->send_exit(kv.second.handle, em.reason);
    self->state.shards.clear();
    for (auto& c : self->state.clients)
      for (auto& h : c.second.heartbeats) self->send_exit(h, em.reason);
    self->quit(em.reason);
  });
  return {
      [=](node_join& j) -> node_joined {
        auto& st = self->state;
        node_joined r;
        r.models_dir = st.opts.models_dir;
        r.profile = st.node->profile;
        r.budget_bytes = st.node->budget_bytes;
        r.used_bytes = st.node->used_bytes.load();
        r.link_bandwidth_bps = st.node->shaper->spec().bandwidth_bps;
        r.link_latency_us = st.node->shaper->spec().latency_us;
        r.backends = kernels::backend_names();
        r.big_endian = model::host_is_big_endian();
        if (j.fp.protocol != node_protocol_version) {
          r.error = "protocol version " + std::to_string(j.fp.protocol) + " (this node speaks " +
                    std::to_string(node_protocol_version) + ")";
          return r;
        }
        // The model is checked per slice (the spawn's manifest); the
        // tokenizer when this node has a copy (shards do not tokenize).
        r.fp.model_name = j.fp.model_name;
        r.fp.model_digest = j.fp.model_digest;
        r.fp.tokenizer_name = j.fp.tokenizer_name;
        r.fp.tokenizer_digest = j.fp.tokenizer_digest;
        auto tpath = models_path(st, j.fp.tokenizer_name, "tokenizer");
        struct stat tsb;
        if (!st.opts.models_dir.empty() && tpath && ::stat(tpath->c_str(), &tsb) == 0) {
          auto t = tokenizer_for(st, j.fp.tokenizer_name);
          if (!t) {
            r.error = t.message();
            return r;
          }
          r.fp.tokenizer_digest = (*t)->digest();
        }
        const bool same = r.fp.model_digest == j.fp.model_digest &&
                          r.fp.tokenizer_digest == j.fp.tokenizer_digest;
        if (!same) {
          log(self, "join as node " + std::to_string(j.node) + " refused: fingerprint differs");
          return r;  // the front end names what differs; no spawns for it
        }
        if (!j.owner) {
          r.error = "join without an owner actor";
          return r;
        }
        st.node->index = j.node;
        if (!st.clients.count(j.owner.address())) {
          self->monitor(j.owner);
          st.clients[j.owner.address()].fp = r.fp;
          log(self, "joined as node " + std::to_string(j.node) + " (" + j.fp.model_name + " " +
                        std::to_string(r.fp.model_digest) + " bytes, " + j.fp.tokenizer_name + " " +
                        model::format_digest(r.fp.tokenizer_digest) + ")");
        }
        return r;
      },
      [=](node_peers& p) -> caf::result<node_peers_done> {
        auto job = std::make_shared<peer_job>();
        job->peers = std::move(p);
        job->rp = self->make_response_promise<node_peers_done>();
        job->mm = connector(self->system(), self->state.opts.net.tls.requested());
        job->until = std::chrono::steady_clock::now() + self->state.opts.peer_timeout;
        dial_next(self, job);
        return job->rp;
      },
      [=](shard_spawn& s) -> caf::result<shard_spawned> { return acquire_and_spawn(self, s); },
      [=](slice_fetch& h, slice_chunk& c) -> slice_ack { return take_chunk(self, h, c); },
      [=](slice_room_ask& a) -> slice_room { return room_for(self, a); },
      [=](heartbeat_start& h) -> heartbeat_started {
        auto& st = self->state;
        heartbeat_started r;
        auto cl = st.clients.find(h.owner.address());
        if (!h.owner || cl == st.clients.end()) {
          r.error = "this front end has not joined (node_join first)";
          return r;
        }
        if (!h.monitor || h.interval_ms < 1) {
          r.error = "heartbeat_start needs a monitor and an interval of at least 1 ms";
          return r;
        }
        supervision::heartbeat_sender_config hc;
        hc.monitor = h.monitor;
        hc.peer = h.peer;
        hc.interval = std::chrono::milliseconds(h.interval_ms);
        // Its own thread: heartbeats and probe answers go on while this
        // actor's thread reads a slice (acquire_and_spawn), even with
        // --caf-threads 1, where a scheduled sender starved and the front end
        // gave the spawn up on a node "suspected silent".
        hc.detached = true;
        r.sender = supervision::spawn_heartbeat_sender(self->system(), hc);
        cl->second.heartbeats.push_back(r.sender);
        log(self, "heartbeats every " + std::to_string(h.interval_ms) + " ms as node " + std::to_string(h.peer));
        return r;
      },
      [=](stats_atom) -> node_report {
        auto& st = self->state;
        node_report r;
        r.node = st.node->index;
        r.profile = st.node->profile;
        r.budget_bytes = st.node->budget_bytes;
        r.used_bytes = st.node->used_bytes.load();
        r.shards = static_cast<int32_t>(st.shards.size());
        r.clients = static_cast<int32_t>(st.clients.size());
        r.pid = static_cast<int32_t>(::getpid());
        r.sessions = st.node->sessions.load();
        r.uptime_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                            st.started)
                          .count();
        r.link = st.opts.link;
        r.version = CELLSHARD_VERSION;
        r.tls = st.opts.net.tls.requested();
        r.guard_rejected = guard_rejected_total();
        r.shipped_bytes = st.shipped_bytes;
        r.cache_hits = st.cache_hits;
        if (st.cache) {
          const auto u = st.cache->usage();
          r.cache_bytes = u.bytes;
          r.cache_entries = u.entries;
          r.cache_dir = st.cache->dir();
          r.cache_max = st.cache->max_bytes();
        }
        return r;
      },
  };
}

bool is_dir(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode);
}

/// 127.0.0.0/8, ::1 and "localhost": the addresses a plain daemon may use.
bool is_loopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  return host.rfind("127.", 0) == 0;
}

}  // namespace

caf::actor spawn_daemon(caf::actor_system& sys, const daemon_options& o) {
  return sys.spawn(daemon_behavior, o);
}

struct node_daemon::impl {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  daemon_options opts;
  caf::actor daemon;
  std::string host;
  uint16_t port = 0;
  std::unique_ptr<guard_listener> guard;
  bool stopped = false;
};

node_daemon::node_daemon(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
node_daemon::~node_daemon() { stop(); }

result<std::unique_ptr<node_daemon>> node_daemon::start(const daemon_options& o) {
  // Everything that CAF would otherwise reject by terminating, first.
  auto prof = topologies::find_profile(o.profile);
  if (!prof) return make_error("--profile: " + prof.message());
  if (!o.models_dir.empty() && !is_dir(o.models_dir)) return make_error("--models: " + o.models_dir + " is not a folder");
  if (!o.cache_dir.empty()) {
    auto c = model::slice_cache::open(o.cache_dir, o.cache_max);
    if (!c) return c.err();
  }
  if (o.host.empty()) return make_error("--listen: empty host");
  if (!o.net.tls.requested() && !o.insecure && !is_loopback(o.host))
    return make_error("--listen " + o.host + ": a daemon without TLS listens on loopback only (127.0.0.1, ::1, "
                      "localhost); give --tls-cert/--tls-key/--tls-ca (see `cellshard certs`), or --insecure "
                      "to accept unauthenticated plain connections on " + o.host);
  if (!o.link.empty()) {
    auto l = topologies::parse_link(o.link);
    if (!l) return make_error("--link: " + l.message());
  }
  auto im = std::make_unique<impl>();
  im->opts = o;
  register_messages(im->cfg);
  auto net = configure_network(im->cfg, o.net);
  if (!net) return net.err();
  kernels::set_blas_threads(o.blas_threads);
  try {
    im->sys = std::make_unique<caf::actor_system>(im->cfg);
  } catch (const std::exception& e) {
    return make_error(std::string("cannot start CAF: ") + e.what());
  }
  auto chk = check_network(*im->sys, o.net);
  if (!chk) return chk.err();
  const bool tls = o.net.tls.requested();
  im->host = o.host;
  im->daemon = spawn_daemon(*im->sys, o);
  // CAF listens on loopback at a port of its own; only the guard connects
  // there, after a peer proved to be one of ours (actors/guard.hpp).
  caf::expected<uint16_t> inner = tls ? caf::openssl::publish(im->daemon, 0, "127.0.0.1", true)
                                      : im->sys->middleman().publish(im->daemon, 0, "127.0.0.1", true);
  if (!inner) {
    caf::anon_send_exit(im->daemon, caf::exit_reason::user_shutdown);
    return make_error("--listen " + o.host + ":" + std::to_string(o.port) + ": cannot listen: " +
                      im->sys->render(inner.error()));
  }
  auto guard = guard_listener::start(o.host, o.port, *inner, o.guard);
  if (!guard) {
    caf::anon_send_exit(im->daemon, caf::exit_reason::user_shutdown);
    return make_error(guard.message() + ": cannot listen");
  }
  im->guard = std::move(*guard);
  im->port = im->guard->port();
  return std::unique_ptr<node_daemon>(new node_daemon(std::move(im)));
}

const std::string& node_daemon::host() const { return impl_->host; }
uint16_t node_daemon::port() const { return impl_->port; }
caf::actor_system& node_daemon::system() { return *impl_->sys; }
caf::actor node_daemon::handle() const { return impl_->daemon; }

void node_daemon::stop() {
  if (!impl_ || impl_->stopped) return;
  impl_->stopped = true;
  if (impl_->daemon) caf::anon_send_exit(impl_->daemon, caf::exit_reason::user_shutdown);
  impl_->daemon = nullptr;
  impl_->guard.reset();  // no new connections; relayed ones end with CAF's
  impl_->sys.reset();
}

}  // namespace cellshard::actors
