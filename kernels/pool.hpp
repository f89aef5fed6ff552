// kernels/pool.hpp: a persistent thread pool for the kernels of one shard
// (issue #18: "threads inside a shard"). Plain C++ threads; no CAF here.
//
// A pool of N threads is the caller plus N-1 workers it owns. parallel_for()
// cuts an index range [0, n) into chunks, hands them out in order through an
// atomic counter (so a core busy with something else takes fewer chunks), runs
// chunks on the calling thread too, and returns when every chunk is done.
//
// Kernels find the pool through pool::current(): the pool a caller installed
// on its own thread with a pool::scope. A kernel that finds none (or a pool of
// one thread) runs on the calling thread. This keeps the backend tables
// (kernels/backend.hpp) free of a context argument, and lets one shard's
// worker thread give its kernels its own pool while another shard on the same
// process uses another.
//
// Results: the matvec kernels compute every output row with the same
// operations in the same order whatever chunk it falls in, so their results
// do not depend on the thread count (tested in tests/kernels/pool.cpp).
//
// Thread safety: one caller thread at a time per pool (parallel_for is not
// re-entrant: calling it from inside a chunk runs the inner loop serially on
// that thread). Creating and destroying a pool is done by its owner.
// Waiting: workers spin briefly (`spin_us`) after a job, then sleep on a
// condition variable; the caller waits only for chunks already taken by its
// own workers, which never block, so the wait ends without a deadline.
// Errors: an exception escaping a chunk is not supported (the kernels throw
// none); the constructor throws std::system_error if a thread cannot start.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace cellshard::kernels {

class pool {
public:
  /// A non-owning reference to a callable taking (begin, end).
  class range_fn {
  public:
    template <class F>
    range_fn(F& f)  // NOLINT: implicit on purpose
        : ctx_(&f), call_([](void* c, int b, int e) { (*static_cast<F*>(c))(b, e); }) {}
    void operator()(int b, int e) const { call_(ctx_, b, e); }

  private:
    friend class pool;
    void* ctx_;
    void (*call_)(void*, int, int);
  };

  /// `threads` >= 1 (values below 1 count as 1): the caller plus threads-1
  /// workers. `spin_us`: how long an idle worker polls for the next job before
  /// it sleeps (decode issues a matvec every few microseconds).
  explicit pool(int threads, int spin_us = 200);
  ~pool();
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  /// Calls f(begin, end) for consecutive chunks of [0, n) of `chunk` indices
  /// (the last may be shorter), spread over the pool's threads; returns when
  /// all are done. n <= 0 does nothing.
  void parallel_for(int n, int chunk, range_fn f);

  /// The pool installed on this thread by a scope, or nullptr.
  static pool* current();

  /// Installs `p` as this thread's pool for the scope's lifetime (nesting
  /// restores the previous one). p may be nullptr (no pool).
  class scope {
  public:
    explicit scope(pool* p);
    ~scope();
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

  private:
    pool* prev_;
  };

private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  int spin_us_;
  std::mutex m_;
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> acks_{0};
  std::atomic<int> next_{0};
  bool stop_ = false;  // guarded by m_
  std::atomic<bool> busy_{false};
  // The job in flight (written by the caller before gen_ is bumped).
  int n_ = 0, chunk_ = 1, nchunks_ = 0;
  void* ctx_ = nullptr;
  void (*call_)(void*, int, int) = nullptr;
};

/// The number of CPUs this process may run on (sched_getaffinity), at least 1.
int available_cpus();

}  // namespace cellshard::kernels
