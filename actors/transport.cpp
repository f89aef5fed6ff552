#include "actors/transport.hpp"

namespace cellshard::actors {

std::chrono::nanoseconds link_shaper::schedule(int32_t dest, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = now_();
  std::chrono::nanoseconds extra{0};
  if (extra_count_ > 0) {
    extra = extra_;
    --extra_count_;
  }
  if (!shaped()) return extra;
  // Token bucket of depth one message: the link sends one message at a time.
  auto& busy = busy_until_[dest];
  const auto start = busy > now ? busy : now;
  const auto tx = spec_.bandwidth_bps > 0
                      ? std::chrono::nanoseconds(static_cast<int64_t>(8.0 * bytes * 1e9 / spec_.bandwidth_bps))
                      : std::chrono::nanoseconds(0);
  busy = start + tx;
  const auto latency = std::chrono::nanoseconds(static_cast<int64_t>(spec_.latency_us * 1000.0));
  return std::chrono::duration_cast<std::chrono::nanoseconds>(busy - now) + latency + extra;
}

void link_shaper::add_delay(std::chrono::milliseconds d, uint32_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  extra_ = d;
  extra_count_ = count;
}

}  // namespace cellshard::actors
