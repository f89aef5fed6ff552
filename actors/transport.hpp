// actors/transport.hpp: the link shaper. Every data message a shard sends to
// another node passes through its node's shaper, which models that node's
// outgoing links (one per destination node) as a token bucket (bandwidth:
// a message of b bytes occupies the link for 8b / bandwidth seconds after the
// previous one left) followed by a delay queue (latency, one way). The
// resulting delivery delay is applied with a delayed send on the actor clock,
// so in-process and multi-process runs see the same link, and nothing sleeps.
// Delivery times on one link only grow, so messages keep their order.
//
// The shaper is what a profile's link promises (`--profile ps3`: 1 Gbit/s,
// 100 us) or `--link`; what a run actually gets is measured separately by
// probe bursts (cluster::measure_links) and reported next to the target.
// Thread safety: schedule() is locked; one shaper is shared by the shards of a node.
// Time: read from `now` (steady_clock by default; tests inject their own, so
// the shaper's arithmetic is tested without a wall clock).
#pragma once

#include "topologies/profile.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace cellshard::actors {

class link_shaper {
public:
  using clock_type = std::chrono::steady_clock;
  using now_function = std::function<clock_type::time_point()>;
  explicit link_shaper(topologies::link_spec spec = {}, now_function now = &clock_type::now)
      : spec_(spec), now_(std::move(now)) {}

  const topologies::link_spec& spec() const { return spec_; }
  bool shaped() const { return spec_.bandwidth_bps > 0 || spec_.latency_us > 0; }

  /// Delay from now until `bytes` sent now to node `dest` arrive there.
  std::chrono::nanoseconds schedule(int32_t dest, uint64_t bytes);

  /// Extra delay for the next `count` messages on every link (fault `delay`).
  void add_delay(std::chrono::milliseconds d, uint32_t count);

private:
  topologies::link_spec spec_;
  now_function now_;
  std::mutex mu_;
  std::map<int32_t, clock_type::time_point> busy_until_;  // per destination node
  std::chrono::milliseconds extra_{0};
  uint32_t extra_count_ = 0;
};

}  // namespace cellshard::actors
