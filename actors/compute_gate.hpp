// actors/compute_gate.hpp: a test-only latch on a shard's compute worker
// (issue #15: "the shard actor stays responsive while a step computes").
//
// Compiled in always, armed only by tests (shard_init::gate; the runtime
// never sets it, and an unset gate costs one null-pointer test per job).
// When armed for n jobs, the worker holds each of its next n jobs at the
// start, before any kernel runs, until the test calls release(): the test
// then knows for certain that a step is in the middle of its compute while
// it talks to the shard (liveness probe, step probe), with no sleep and no
// timing. tests/actors/test_shard_liveness.cpp is its user.
//
// Every wait has a deadline:
// - the worker side (hold) waits until release(), open(), or `max_hold`
//   after the job arrived (default 60 s), whichever comes first, so a test
//   that fails before releasing cannot hang the worker for ever;
// - compute_worker's destructor calls open(), so a shard killed while a job
//   is held shuts down at once;
// - the test side (wait_held) takes an absolute deadline and says whether a
//   job was held by then.
//
// Thread safety: every member may be called from any thread (one mutex).
// Ownership: shared (std::shared_ptr) by the test and the worker.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace cellshard::actors {

class compute_gate {
public:
  using clock = std::chrono::steady_clock;

  explicit compute_gate(std::chrono::milliseconds max_hold = std::chrono::seconds(60)) : max_hold_(max_hold) {}

  /// Holds the next `jobs` jobs the worker starts (adds to any still armed).
  void arm(int jobs = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ += jobs;
  }

  /// Worker side, at the start of every job: returns at once unless armed;
  /// otherwise counts the job as held and waits for release(), open(),
  /// `cancelled` seen at a release/open, or max_hold.
  void hold(const std::atomic<bool>& cancelled) {
    std::unique_lock<std::mutex> lock(mu_);
    if (armed_ == 0 || open_) return;
    --armed_;
    ++held_;
    holding_ = true;
    const unsigned ticket = releases_;
    changed_.notify_all();
    changed_.wait_until(lock, clock::now() + max_hold_,
                        [&] { return releases_ != ticket || open_ || cancelled.load(); });
    holding_ = false;
    changed_.notify_all();
  }

  /// Test side: true once a job is being held (within the deadline).
  bool wait_held(clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_until(lock, deadline, [&] { return holding_; });
  }

  /// Lets the job being held (if any) run on.
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    ++releases_;
    changed_.notify_all();
  }

  /// Disarms for good and lets any held job run (compute_worker's destructor).
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }

  /// A job is being held right now.
  bool holding() const {
    std::lock_guard<std::mutex> lock(mu_);
    return holding_;
  }
  /// Jobs held so far.
  int held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_;
  }

private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::chrono::milliseconds max_hold_;
  int armed_ = 0;
  int held_ = 0;
  unsigned releases_ = 0;
  bool holding_ = false;
  bool open_ = false;
};

}  // namespace cellshard::actors
