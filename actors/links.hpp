// actors/links.hpp: a shard's links (issue #15: fault injection and link
// shaping as a wrapper around a shard's links, link probes in their own
// actor, so that the shard actor is compute, KV cache and replay log).
//
// Links. Every data payload a shard sends to another node asks its
// link_env what happens to it on the way: dropped, corrupted, and after
// which delay it arrives (link_verdict); the shard then applies the verdict
// (actors/shard.cpp `deliver`). As in LevelDB's Env/EnvWrapper, the base
// environment is the real thing -- shaped_links, the node's shaper
// (actors/transport.hpp) -- and a wrapper forwards every call to the
// environment it wraps, overriding only what it changes: faulty_links adds
// the link faults of the fault plan (supervision/fault_plan.hpp: drop,
// corrupt, delay), which the shard arms when its fault hooks fire. A
// dropped payload never reaches the link (the shaper is not charged for it).
// Payloads to the shard's own node take no link and do not ask.
//
// Probes. cluster::measure_links asks shard A (probe_atom, dest B, B's node, n,
// bytes, reply_to). A hands the request to its prober, which sends a probe
// burst to B through A's node shaper (actors/transport.hpp): 5 tiny messages
// (the smallest transit is the latency), then n messages of `bytes` back to
// back (their inter-arrival times give the bandwidth), each delivered after
// the shaper's delay on the actor clock. B hands every probe_msg to its own
// prober, which collects the arrivals and sends the probe_result to
// reply_to after the last one. The messages (actors/messages.hpp probe_msg,
// probe_result) and what goes between processes are as before: only the
// shard's part moved here.
//
// Lifetime: spawned by its shard (spawn_link_prober), told to stop when
// the shard ends (for any reason). Thread safety: an actor; the shaper is
// locked (shared by the shards of a node). Latency is computed from the
// sender's and the receiver's steady clocks: right on one host (loopback,
// network namespaces), not across machines.
#pragma once

#include "actors/transport.hpp"

#include <caf/actor.hpp>
#include <caf/local_actor.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

namespace cellshard::actors {

/// What happens to one payload on its link.
struct link_verdict {
  bool drop = false;     // never delivered
  bool corrupt = false;  // delivered with one bit flipped (its checksum then fails)
  std::chrono::nanoseconds delay{0};  // from now until it arrives
};

/// A shard's outgoing links. Thread safety: one per shard, used by its
/// actor only (shaped_links' shaper is itself locked and shared per node).
class link_env {
public:
  virtual ~link_env() = default;
  /// A payload of `bytes` leaves now for node `dest` (not the sender's node).
  virtual link_verdict send(int32_t dest, uint64_t bytes) = 0;
};

/// The node's links as its shaper models them: a delay, nothing lost.
class shaped_links final : public link_env {
public:
  explicit shaped_links(std::shared_ptr<link_shaper> shaper) : shaper_(std::move(shaper)) {}
  link_verdict send(int32_t dest, uint64_t bytes) override {
    link_verdict v;
    v.delay = shaper_->schedule(dest, bytes);
    return v;
  }

private:
  std::shared_ptr<link_shaper> shaper_;
};

/// Forwards every call to the environment it wraps (never null).
class link_env_wrapper : public link_env {
public:
  explicit link_env_wrapper(std::unique_ptr<link_env> target) : target_(std::move(target)) {}
  link_verdict send(int32_t dest, uint64_t bytes) override { return target_->send(dest, bytes); }

private:
  std::unique_ptr<link_env> target_;
};

/// The fault plan's link faults around another environment. drop and
/// corrupt accumulate (two `drop 1` faults drop two payloads); a `delay`
/// replaces one still pending. A dropped payload is not passed on.
class faulty_links final : public link_env_wrapper {
public:
  using link_env_wrapper::link_env_wrapper;
  void drop_next(uint32_t n) { drop_left_ += n; }
  void corrupt_next(uint32_t n) { corrupt_left_ += n; }
  void delay_next(std::chrono::milliseconds d, uint32_t n) {
    delay_ = d;
    delay_left_ = n;
  }
  /// True while a fault is pending: some payload will not pass untouched.
  bool armed() const { return drop_left_ > 0 || corrupt_left_ > 0 || delay_left_ > 0; }
  link_verdict send(int32_t dest, uint64_t bytes) override {
    if (drop_left_ > 0) {
      --drop_left_;
      link_verdict v;
      v.drop = true;
      return v;
    }
    auto v = link_env_wrapper::send(dest, bytes);
    if (corrupt_left_ > 0) {
      --corrupt_left_;
      v.corrupt = true;
    }
    if (delay_left_ > 0) {
      --delay_left_;
      v.delay += delay_;
    }
    return v;
  }

private:
  uint32_t drop_left_ = 0, corrupt_left_ = 0, delay_left_ = 0;
  std::chrono::milliseconds delay_{0};
};

/// Probe bursts start with this many tiny messages (latency); the rest carry
/// the requested bytes (bandwidth).
constexpr int32_t probe_tiny_messages = 5;

/// Spawns the prober of a shard that runs on node `node` and sends over
/// `shaper` (its node's outgoing links); it stops when `owner` ends.
caf::actor spawn_link_prober(caf::local_actor& owner, int32_t node, std::shared_ptr<link_shaper> shaper);

}  // namespace cellshard::actors
