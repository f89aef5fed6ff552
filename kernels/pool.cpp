#include "kernels/pool.hpp"

#include <chrono>
#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CELLSHARD_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CELLSHARD_CPU_RELAX() asm volatile("yield")
#else
#define CELLSHARD_CPU_RELAX() ((void)0)
#endif

namespace cellshard::kernels {

namespace {
thread_local pool* current_pool = nullptr;
thread_local bool inside_chunk = false;
}  // namespace

pool::pool(int threads, int spin_us) : spin_us_(spin_us < 0 ? 0 : spin_us) {
  if (threads < 1) threads = 1;
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

pool::~pool() {
  {
    std::lock_guard<std::mutex> lk(m_);
    stop_ = true;
    gen_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

pool* pool::current() { return current_pool; }

pool::scope::scope(pool* p) : prev_(current_pool) { current_pool = p; }
pool::scope::~scope() { current_pool = prev_; }

void pool::run_chunks() {
  const bool was_inside = inside_chunk;
  inside_chunk = true;
  for (;;) {
    const int c = next_.fetch_add(1, std::memory_order_relaxed);
    if (c >= nchunks_) break;
    const int b = c * chunk_;
    const int e = b + chunk_ < n_ ? b + chunk_ : n_;
    call_(ctx_, b, e);
  }
  inside_chunk = was_inside;
}

void pool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    // Poll for a new generation for spin_us, then sleep.
    const auto spin_end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    int polls = 0;
    while (gen_.load(std::memory_order_acquire) == seen) {
      CELLSHARD_CPU_RELAX();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() >= spin_end) {
        std::unique_lock<std::mutex> lk(m_);
        wake_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        break;
      }
    }
    seen = gen_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lk(m_);
      if (stop_) return;
    }
    run_chunks();
    if (acks_.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<int>(workers_.size())) {
      std::lock_guard<std::mutex> lk(m_);
      done_.notify_one();
    }
  }
}

void pool::parallel_for(int n, int chunk, range_fn f) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  const int nchunks = (n + chunk - 1) / chunk;
  // Serial: no workers, a single chunk, or called from inside a chunk (or
  // while another caller uses the pool, which the contract forbids: stay safe).
  if (workers_.empty() || nchunks == 1 || inside_chunk ||
      busy_.exchange(true, std::memory_order_acquire)) {
    for (int b = 0; b < n; b += chunk) f(b, b + chunk < n ? b + chunk : n);
    return;
  }
  n_ = n;
  chunk_ = chunk;
  nchunks_ = nchunks;
  ctx_ = f.ctx_;
  call_ = f.call_;
  next_.store(0, std::memory_order_relaxed);
  acks_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(m_);
    gen_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_chunks();
  // Every worker acknowledges every generation after it found no chunk left;
  // when all have, every chunk taken has finished and none can start.
  const int want = static_cast<int>(workers_.size());
  for (int polls = 0; acks_.load(std::memory_order_acquire) != want; ++polls) {
    if (polls < 20000) {
      CELLSHARD_CPU_RELAX();
      continue;
    }
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return acks_.load(std::memory_order_acquire) == want; });
    break;
  }
  busy_.store(false, std::memory_order_release);
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
}

}  // namespace cellshard::kernels
