// topologies/plan_sim.cpp: the discrete-event simulation of a plan.
#include "topologies/plan_sim.hpp"
#include "base/percentile.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <queue>
#include <random>

namespace cellshard::topologies {

namespace {

enum class ev_kind : uint8_t { arrive, done, token, fail, repair, request };

struct event {
  double t = 0;
  uint64_t order = 0;  // FIFO among equal times (determinism)
  ev_kind kind = ev_kind::arrive;
  int station = 0;
  int batch = -1;      // index into the batch pool
  uint32_t version = 0;
  bool operator>(const event& o) const { return t != o.t ? t > o.t : order > o.order; }
};

struct station_state {
  std::deque<int> queue;  // sequence ids waiting
  bool busy = false;
  int in_service = -1;    // batch index
  uint32_t version = 0;   // bumps when a service is cancelled by a failure
  bool down = false;
};

struct sequence {
  double token_start = 0;
  double request_start = 0;
  int remaining = 0;
  uint64_t failures_at_start = 0;
  bool active = false;
};


}  // namespace

result<sim_result> simulate(const plan_result& p, const sim_options& o) {
  const plan_request& r = p.request;
  const plan_layout& l = p.layout;
  const plan_assumptions& a = r.assume;
  const int S = static_cast<int>(l.groups.size());
  if (S == 0) return make_error("simulate: the plan has no stations");
  if (!(p.tokens_per_s > 0) || !std::isfinite(p.chain_s)) {
    return make_error("simulate: the plan has no finite time per token (unknown hardware rates?)");
  }
  const int mb = std::max(1, p.micro_batch);
  const int B = std::max(1, r.batch);

  // Station work W[s][n] and hops H[s][n] for n = 1..mb sequences; return hop R[n].
  std::vector<std::vector<double>> W(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(mb) + 1, 0));
  std::vector<std::vector<double>> H = W;
  std::vector<double> R(static_cast<size_t>(mb) + 1, 0);
  for (int n = 1; n <= mb; ++n) {
    const chain_costs c = chain_cost(r, l, n);
    for (int s = 0; s < S; ++s) {
      W[static_cast<size_t>(s)][static_cast<size_t>(n)] = c.station_work[static_cast<size_t>(s)].seconds(a);
      H[static_cast<size_t>(s)][static_cast<size_t>(n)] = c.station_hop[static_cast<size_t>(s)].seconds(a);
    }
    R[static_cast<size_t>(n)] = c.return_hop.seconds(a);
  }

  // Node roles: the ranks of every station, then the expert nodes (each
  // mapped to the station of the MoE layer its first expert belongs to).
  const model_spec& m = r.model;
  std::vector<int> layer_station(static_cast<size_t>(std::max(m.n_layers, 1)), 0);
  for (int s = 0; s < S; ++s) {
    const auto& g = l.groups[static_cast<size_t>(s)];
    for (int k = g.first_layer; k < g.end_layer; ++k) layer_station[static_cast<size_t>(k)] = s;
  }
  std::vector<int> node_station;
  node_station.reserve(static_cast<size_t>(l.used_nodes));
  std::vector<double> station_reload(static_cast<size_t>(S), 0);
  const double link_Bps = r.hw.node.link.bandwidth_bps == 0
                              ? 0
                              : static_cast<double>(r.hw.node.link.bandwidth_bps) * a.link_efficiency / 8.0;
  for (int s = 0; s < S; ++s) {
    const auto& g = l.groups[static_cast<size_t>(s)];
    for (int k = 0; k < g.tp; ++k) node_station.push_back(s);
    station_reload[static_cast<size_t>(s)] = a.reload_over_link && link_Bps > 0 ? g.weight_bytes / link_Bps : 0;
  }
  const size_t first_expert = node_station.size();
  const double expert_reload =
      a.reload_over_link && link_Bps > 0 ? l.experts_per_node * expert_bytes(m) / link_Bps : 0;
  for (int i = 0; i < l.expert_nodes; ++i) {
    const long e = static_cast<long>(i) * l.experts_per_node;
    const int moe = std::max(1, m.moe_layers());
    const int layer = m.n_dense_layers + static_cast<int>((e / std::max(1, m.n_experts)) % moe);
    node_station.push_back(layer_station[static_cast<size_t>(std::min(layer, m.n_layers - 1))]);
  }
  const int U = static_cast<int>(node_station.size());

  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  auto expo = [&](double rate) { return -std::log(1.0 - unif(rng)) / rate; };

  std::priority_queue<event, std::vector<event>, std::greater<event>> evq;
  uint64_t order = 0;
  auto push = [&](double t, ev_kind k, int station, int batch, uint32_t version = 0) {
    evq.push(event{t, order++, k, station, batch, version});
  };
  std::vector<std::vector<int>> pool;
  std::vector<int> free_batches;
  auto new_batch = [&]() {
    if (!free_batches.empty()) {
      const int i = free_batches.back();
      free_batches.pop_back();
      pool[static_cast<size_t>(i)].clear();
      return i;
    }
    pool.emplace_back();
    return static_cast<int>(pool.size() - 1);
  };

  std::vector<station_state> st(static_cast<size_t>(S));
  std::vector<sequence> seqs(static_cast<size_t>(B));
  std::deque<double> waiting_requests;  // arrival times (open mode)
  std::vector<int> idle_sessions;
  sim_result res;
  res.nodes = r.nodes;
  res.used_nodes = U;
  res.stations = S;
  int spares = l.spare_nodes;
  uint64_t failures = 0;
  const double warmup = 0.1 * o.duration_s;
  std::vector<float> token_lat, request_lat;
  uint64_t tokens_after_warmup = 0;

  auto start_service = [&](int s, double now) {
    station_state& x = st[static_cast<size_t>(s)];
    if (x.busy || x.down || x.queue.empty()) return;
    const int bi = new_batch();
    auto& b = pool[static_cast<size_t>(bi)];
    while (!x.queue.empty() && static_cast<int>(b.size()) < mb) {
      b.push_back(x.queue.front());
      x.queue.pop_front();
    }
    x.busy = true;
    x.in_service = bi;
    push(now + W[static_cast<size_t>(s)][b.size()], ev_kind::done, s, bi, x.version);
  };
  // A batch of sequences enters station 0 after the session's hop.
  auto send_to_first = [&](const std::vector<int>& ids, double now) {
    if (ids.empty()) return;
    for (size_t k = 0; k < ids.size(); k += static_cast<size_t>(mb)) {
      const int bi = new_batch();
      auto& b = pool[static_cast<size_t>(bi)];
      for (size_t j = k; j < std::min(ids.size(), k + static_cast<size_t>(mb)); ++j) b.push_back(ids[j]);
      push(now + H[0][b.size()], ev_kind::arrive, 0, bi);
    }
  };
  auto begin_request = [&](int id, double arrival, double now) {
    sequence& q = seqs[static_cast<size_t>(id)];
    q.active = true;
    q.request_start = arrival;
    q.token_start = now;
    q.remaining = std::max(1, a.request_tokens);
    q.failures_at_start = failures;
  };

  // Start: closed loop, all sessions at t = 0; open: Poisson arrivals.
  if (o.arrival_rate <= 0) {
    std::vector<int> ids;
    for (int i = 0; i < B; ++i) {
      begin_request(i, 0, 0);
      ids.push_back(i);
    }
    send_to_first(ids, 0);
  } else {
    for (int i = B - 1; i >= 0; --i) idle_sessions.push_back(i);
    push(expo(o.arrival_rate), ev_kind::request, 0, -1);
  }
  const double lambda = o.failure_scale * U * r.hw.failures_per_year / 8766.0 / 3600.0;  // per second
  if (lambda > 0) push(expo(lambda), ev_kind::fail, 0, -1);

  double now = 0;
  while (!evq.empty()) {
    const event e = evq.top();
    if (e.t > o.duration_s) break;
    if (res.events >= o.max_events) {
      res.stopped_early = true;
      break;
    }
    evq.pop();
    ++res.events;
    now = e.t;
    switch (e.kind) {
      case ev_kind::arrive: {
        station_state& x = st[static_cast<size_t>(e.station)];
        for (int id : pool[static_cast<size_t>(e.batch)]) x.queue.push_back(id);
        free_batches.push_back(e.batch);
        start_service(e.station, now);
        break;
      }
      case ev_kind::done: {
        station_state& x = st[static_cast<size_t>(e.station)];
        if (e.version != x.version) break;  // cancelled by a failure; the batch was re-queued
        x.busy = false;
        x.in_service = -1;
        const size_t n = pool[static_cast<size_t>(e.batch)].size();
        if (e.station + 1 < S) push(now + H[static_cast<size_t>(e.station) + 1][n], ev_kind::arrive, e.station + 1, e.batch);
        else push(now + R[n], ev_kind::token, 0, e.batch);
        start_service(e.station, now);
        break;
      }
      case ev_kind::token: {
        std::vector<int> next;
        for (int id : pool[static_cast<size_t>(e.batch)]) {
          sequence& q = seqs[static_cast<size_t>(id)];
          if (now >= warmup) {
            ++tokens_after_warmup;
            if (token_lat.size() < o.max_samples) token_lat.push_back(static_cast<float>(now - q.token_start));
          }
          ++res.tokens;
          res.token_latency_max_s = std::max(res.token_latency_max_s, now - q.token_start);
          q.token_start = now;
          if (--q.remaining > 0) {
            next.push_back(id);
            continue;
          }
          ++res.requests_done;
          if (failures > q.failures_at_start) ++res.requests_hit;
          if (request_lat.size() < o.max_samples) request_lat.push_back(static_cast<float>(now - q.request_start));
          q.active = false;
          if (o.arrival_rate <= 0) {
            begin_request(id, now, now);
            next.push_back(id);
          } else if (!waiting_requests.empty()) {
            const double arrival = waiting_requests.front();
            waiting_requests.pop_front();
            begin_request(id, arrival, now);
            next.push_back(id);
          } else {
            idle_sessions.push_back(id);
          }
        }
        free_batches.push_back(e.batch);
        send_to_first(next, now);
        break;
      }
      case ev_kind::request: {
        if (!idle_sessions.empty()) {
          const int id = idle_sessions.back();
          idle_sessions.pop_back();
          begin_request(id, now, now);
          send_to_first({id}, now);
        } else {
          waiting_requests.push_back(now);
        }
        push(now + expo(o.arrival_rate), ev_kind::request, 0, -1);
        break;
      }
      case ev_kind::fail: {
        ++failures;
        ++res.failures;
        const size_t node = std::min(static_cast<size_t>(unif(rng) * U), static_cast<size_t>(U - 1));
        const int s = node_station[node];
        station_state& x = st[static_cast<size_t>(s)];
        if (spares > 0) --spares;
        else if (res.spares_exhausted_at_s < 0) res.spares_exhausted_at_s = now;
        const double reload = node >= first_expert ? expert_reload : station_reload[static_cast<size_t>(s)];
        const double replay = unif(rng) * a.checkpoint_every * W[static_cast<size_t>(s)][1];
        const double down = a.detect_s + a.recover_s + reload + replay;
        res.downtime_s += down;
        if (x.busy) {
          // The batch in service is served again after the repair.
          ++x.version;
          auto& b = pool[static_cast<size_t>(x.in_service)];
          for (auto it = b.rbegin(); it != b.rend(); ++it) x.queue.push_front(*it);
          free_batches.push_back(x.in_service);
          x.busy = false;
          x.in_service = -1;
        }
        if (!x.down) {
          x.down = true;
          push(now + down, ev_kind::repair, s, -1);
        }
        push(now + expo(lambda), ev_kind::fail, 0, -1);
        break;
      }
      case ev_kind::repair: {
        st[static_cast<size_t>(e.station)].down = false;
        start_service(e.station, now);
        break;
      }
    }
  }
  res.simulated_s = std::min(o.duration_s, std::max(now, o.duration_s));
  const double measured = res.simulated_s - warmup;
  res.tokens_per_s = measured > 0 ? static_cast<double>(tokens_after_warmup) / measured : 0;
  res.token_latency_p50_s = percentile(token_lat, 0.50);
  res.token_latency_p90_s = percentile(token_lat, 0.90);
  res.token_latency_p99_s = percentile(token_lat, 0.99);
  res.request_latency_p50_s = percentile(request_lat, 0.50);
  res.request_latency_p99_s = percentile(request_lat, 0.99);
  res.request_failure_fraction =
      res.requests_done > 0 ? static_cast<double>(res.requests_hit) / static_cast<double>(res.requests_done) : 0;
  res.spares_left = spares;
  return res;
}

}  // namespace cellshard::topologies
