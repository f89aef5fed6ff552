// tests/busy_loops.hpp: a machine under full CPU load for the length of a
// test (issue #20: "while busy loops run on every core"). One std::thread per
// core spins on an atomic flag; the destructor raises the flag and joins them
// (RAII: whatever the test's outcome). Each loop also ends by itself once
// `bound` has passed, so a test that hangs elsewhere cannot leave the machine
// loaded past it. No timing is asserted with these: they only make the
// kernels and the heartbeats compete with spinning threads for every core.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace cellshard::test {

class busy_loops {
public:
  /// `threads` spinning threads (0: one per core, std::thread::hardware_concurrency).
  /// Returns once every one of them spins.
  explicit busy_loops(std::chrono::seconds bound, unsigned threads = 0) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    const auto until = std::chrono::steady_clock::now() + bound;
    for (unsigned i = 0; i < threads; ++i)
      threads_.emplace_back([this, until] {
        {
          std::lock_guard<std::mutex> lk(mu_);
          ++started_;
        }
        cv_.notify_all();
        std::uint64_t n = 0;
        while (!stop_.load(std::memory_order_relaxed)) {
          // The clock is read once per 2^20 turns (a few ms of spinning).
          if ((++n & 0xFFFFF) == 0 && std::chrono::steady_clock::now() >= until) {
            bounded_.fetch_add(1);
            break;
          }
        }
        spins_.fetch_add(n);
      });
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return started_ == threads_.size(); });
  }
  ~busy_loops() { stop(); }
  busy_loops(const busy_loops&) = delete;
  busy_loops& operator=(const busy_loops&) = delete;

  /// Stops and joins the loops (idempotent).
  void stop() {
    stop_.store(true);
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  unsigned threads() const { return static_cast<unsigned>(threads_.size()); }
  /// How many loops ended on their time bound rather than on stop(): 0 means
  /// the load lasted until stop() (call after stop()).
  unsigned ended_on_bound() const { return bounded_.load(); }
  /// Turns of all loops together (after stop()): > 0 shows they ran.
  std::uint64_t spins() const { return spins_.load(); }

private:
  std::atomic<bool> stop_{false};
  std::atomic<unsigned> bounded_{0};
  std::atomic<std::uint64_t> spins_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  size_t started_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace cellshard::test
