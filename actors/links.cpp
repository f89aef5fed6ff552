#include "actors/links.hpp"

#include "actors/messages.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;

struct prober_state {
  int32_t node = 0;
  std::shared_ptr<link_shaper> shaper;
  // Bursts being received, by (reply_to, from node): arr[0] is the smallest
  // transit of the tiny messages, then the arrival times of the others (ns).
  std::map<std::pair<caf::actor, int32_t>, std::vector<int64_t>> bursts;
  static inline const char* name = "cellshard.link_prober";
};

using prober_actor = caf::stateful_actor<prober_state>;

uint64_t probe_bytes(const blob& b) { return b.data.size() * sizeof(float); }

caf::behavior link_prober(prober_actor* self, int32_t node, std::shared_ptr<link_shaper> shaper) {
  self->state.node = node;
  self->state.shaper = std::move(shaper);
  return {
      // Measure the link to `dest` (on node `dest_node`) through this node's shaper.
      [=](probe_atom, caf::actor dest, int32_t dest_node, int32_t n, int32_t bytes, caf::actor reply_to) {
        auto& st = self->state;
        constexpr int32_t tiny = probe_tiny_messages;
        for (int32_t seq = 0; seq < n + tiny; ++seq) {
          probe_msg m;
          m.seq = seq;
          m.n = n + tiny - 1;
          m.from_node = st.node;
          m.payload.data.resize(seq < tiny ? 4 : static_cast<size_t>(bytes) / sizeof(float));
          m.reply_to = reply_to;
          m.sent_ns = clock_type::now().time_since_epoch().count();
          const auto delay = st.shaper->schedule(dest_node, probe_bytes(m.payload));
          if (delay.count() > 0) self->delayed_send(dest, delay, std::move(m));
          else self->send(dest, std::move(m));
        }
      },
      [=](probe_msg& m) {
        auto& st = self->state;
        constexpr int32_t tiny = probe_tiny_messages;
        const int64_t now = clock_type::now().time_since_epoch().count();
        auto& arr = st.bursts[{m.reply_to, m.from_node}];
        if (m.seq == 0) arr.assign(1, now - m.sent_ns);
        else if (m.seq < tiny && !arr.empty()) arr[0] = std::min(arr[0], now - m.sent_ns);
        else if (m.seq >= tiny) arr.push_back(now);
        if (m.seq < m.n) return;
        probe_result r;
        r.from = m.from_node;
        r.to = st.node;
        r.latency_us = arr.empty() ? 0 : arr[0] / 1000.0;
        const uint64_t msg_bytes = probe_bytes(m.payload);
        if (arr.size() >= 3 && arr.back() > arr[1])  // k - 1 gaps between k arrivals
          r.bandwidth_bps = 8.0 * msg_bytes * (arr.size() - 2) / ((arr.back() - arr[1]) / 1e9);
        r.bytes = msg_bytes * static_cast<uint64_t>(m.n - tiny + 1);
        st.bursts.erase({m.reply_to, m.from_node});
        self->send(m.reply_to, r);
      },
  };
}

}  // namespace

caf::actor spawn_link_prober(caf::local_actor& owner, int32_t node, std::shared_ptr<link_shaper> shaper) {
  auto prober = owner.spawn(link_prober, node, std::move(shaper));
  // It ends with its owner (whatever the owner's exit reason).
  owner.attach_functor([prober] { caf::anon_send_exit(prober, caf::exit_reason::user_shutdown); });
  return prober;
}

}  // namespace cellshard::actors
