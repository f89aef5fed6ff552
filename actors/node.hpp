// actors/node.hpp: a logical node in one process: its index, profile name,
// memory budget and the bytes in use on it (weights + KV caches + buffers).
// Shards of a node charge their allocations here, so a session whose KV cache
// would overflow the node fails with a clear error instead of swapping.
// Thread safety: the counters are atomics; a node_state is shared by the
// shards on it (std::shared_ptr).
#pragma once

#include "actors/transport.hpp"
#include "kernels/pool.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace cellshard::actors {

class data_plane;  // actors/data_plane.hpp

struct node_state {
  int index = 0;
  std::string profile = "host";
  uint64_t budget_bytes = 0;  // 0 = unlimited
  std::atomic<uint64_t> used_bytes{0};
  std::atomic<int32_t> sessions{0};  // per-session KV caches held by its shards
  /// The node's outgoing links (unshaped by default).
  std::shared_ptr<link_shaper> shaper = std::make_shared<link_shaper>();
  /// Threads for the kernels of this node's shards (kernels/pool.hpp); null:
  /// each shard computes on the thread that runs it. Shards install it with a
  /// kernels::pool::scope around their compute; two shards computing at once
  /// are safe (the second one's kernels then run on its own thread).
  std::shared_ptr<kernels::pool> kernel_pool;
  /// The process's data plane (actors/data_plane.hpp): partial sums to shards
  /// of other daemons go over its sockets; null (in process, TLS, or
  /// CELLSHARD_DATA_PLANE=caf): everything through CAF.
  std::shared_ptr<data_plane> data;
  /// Activations its shards received from other processes (counted by the
  /// shards, logged by the daemon when a front end leaves): through CAF, as
  /// data-plane frames, frames held for their epoch's CAF activation, and
  /// held frames dropped (a newer epoch, a closed session, the bound).
  std::atomic<uint64_t> activations_caf{0}, activations_frames{0}, activations_held{0},
      activations_held_dropped{0};

  /// Charges `bytes`; false (and nothing charged) when the budget would be exceeded.
  bool try_charge(uint64_t bytes) {
    uint64_t cur = used_bytes.load();
    do {
      if (budget_bytes != 0 && cur + bytes > budget_bytes) return false;
    } while (!used_bytes.compare_exchange_weak(cur, cur + bytes));
    return true;
  }
  void release(uint64_t bytes) { used_bytes -= bytes; }
};

}  // namespace cellshard::actors
