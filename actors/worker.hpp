// actors/worker.hpp: a shard's compute worker -- one thread outside CAF's
// scheduler that runs the shard's kernels (issue #15: compute never runs on
// the threads that carry messages and heartbeats).
//
// A shard actor posts a job (a layer half over a batch of positions, or the
// classifier) and goes on handling messages: liveness probes, partial sums,
// link probes, statistics. The job ends by sending its result to the actor
// as an ordinary message (caf::anon_send is thread safe), so every piece of
// shard state is still touched by the actor only; a job owns (by value or
// shared_ptr) everything it reads or writes, so an actor killed mid-step
// frees nothing under it.
//
// Jobs run one at a time in posting order (FIFO). The destructor cancels:
// the running job sees `cancelled()` become true and should return early (the
// shard checks it between chunks of up to shard_init::batch_size positions),
// queued jobs are dropped, then the thread is joined -- a bounded wait of at
// most one chunk's work (one layer half over up to batch_size positions).
//
// Why a thread and not a CAF actor: a detached actor would also get its own
// thread, but CAF 0.17 gives no control over its lifetime at shutdown or its
// priority; a std::thread is plain. The thread runs at `nice_increment` above
// the process's niceness (Linux per-thread nice, setpriority on its tid;
// ignored elsewhere), so that under contention the scheduler threads that
// carry heartbeats win the CPU over kernels (measured: docs/reliability.md).
// A job may spread one matvec over the node's kernels::pool (--threads, issue
// #18): the job's thread is one of the pool's participants.
//
// Thread safety: post() may be called from any thread; the destructor must
// not run on the worker thread itself.
//
// Inline mode (tests on CAF's test_coordinator only, shard_init::
// compute_inline): no thread; post() runs the job at once on the caller's
// thread -- the shard's handler -- so its result message enters the shard's
// mailbox in an order the test coordinator decides alone. A runtime never
// uses it: kernels would then run on CAF's threads.
//
// Gate (tests only, actors/compute_gate.hpp): with a compute_gate given, the
// thread passes every job through gate->hold() before running it, so a test
// can hold a step mid-compute; the destructor opens the gate before joining.
// Ignored in inline mode (holding there would block the test coordinator).
#pragma once

#include "actors/compute_gate.hpp"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace cellshard::actors {

class compute_worker {
public:
  /// A job; `cancelled` becomes true when the worker is being destroyed.
  using job = std::function<void(const std::atomic<bool>& cancelled)>;

  explicit compute_worker(std::string name, int nice_increment = 2, bool inline_jobs = false,
                          std::shared_ptr<compute_gate> gate = nullptr);
  ~compute_worker();
  compute_worker(const compute_worker&) = delete;
  compute_worker& operator=(const compute_worker&) = delete;

  /// Queues a job (runs after every job posted before it).
  void post(job j);
  /// Queues a job to run right after the first queued job (at the front of
  /// the queue when none is): a running job that yields lets one other job
  /// run, then resumes, without going behind the whole queue. Inline: runs it.
  void post_next(job j);
  /// Jobs queued or running (for statistics and tests).
  std::size_t pending() const;

private:
  void loop(int nice_increment);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> jobs_;
  std::size_t running_ = 0;
  bool inline_ = false;
  std::atomic<bool> cancelled_{false};
  std::string name_;
  std::shared_ptr<compute_gate> gate_;  // tests only; null in a runtime
  std::thread thread_;
};

}  // namespace cellshard::actors
