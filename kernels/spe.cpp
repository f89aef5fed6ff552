// The PPE side of the spe and spu-host backends: splits a kernel call into
// SPU job blocks, runs them on the SPE workers (each a thread with its own
// LS + MFC model), collects status and counters. See kernels/spe.hpp.
#include "kernels/spe.hpp"

#include "kernels/reference.hpp"
#include "kernels/types.hpp"
#include "kernels/spu/host/spu_host.hpp"
#include "kernels/spu/spu_job.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

static_assert(sizeof(spu_job) == SPU_JOB_BYTES, "job block is 128 bytes");
static_assert(offsetof(spu_job, status) == SPU_JOB_STATUS_OFFSET, "status words at 112");

namespace cellshard::kernels::spe {
namespace {

// ---- configuration and statistics ---------------------------------------
std::mutex config_mutex;
options config;

struct atomic_stats {
  std::atomic<uint64_t> kernel_calls{0}, jobs{0}, errors{0};
  std::atomic<uint64_t> commands{0}, list_commands{0}, transfers{0}, bytes_get{0},
      bytes_put{0}, waits{0}, rejected{0};
  std::atomic<uint32_t> ls_high_water{0};
};
atomic_stats totals;
std::mutex error_mutex;
std::string last_error_message;

options snapshot() {
  std::lock_guard<std::mutex> g(config_mutex);
  return config;
}

// ---- the worker pool ----------------------------------------------------
// Worker 0 is the calling thread; workers 1..n-1 are pool threads. Each
// thread owns one emulated SPE (engine), created on first use.
dma::engine& local_engine() {
  thread_local std::unique_ptr<dma::engine> e;
  if (!e) e = std::make_unique<dma::engine>();
  return *e;
}

class pool {
public:
  static pool& instance() {
    static pool p;
    return p;
  }

  /// Runs fn(i) for i in [0, n), i = 0 on the caller. Returns when all are
  /// done. The wait has no deadline: it joins our own threads' finite
  /// compute, which depends on nothing external.
  void run(int n, const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (n <= 1 || !busy.owns_lock()) {  // pool busy: same jobs, this thread
      for (int i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      std::lock_guard<std::mutex> g(m_);
      while (static_cast<int>(threads_.size()) < n - 1) {
        const int index = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, index] { loop(index); });
      }
      fn_ = &fn;
      n_ = n;
      remaining_ = n - 1;
      ++generation_;
    }
    work_.notify_all();
    fn(0);
    std::unique_lock<std::mutex> g(m_);
    done_.wait(g, [this] { return remaining_ == 0; });
    fn_ = nullptr;
  }

  ~pool() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_) t.join();
  }

private:
  void loop(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> g(m_);
    for (;;) {
      work_.wait(g, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= n_) continue;
      const std::function<void(int)>* fn = fn_;
      g.unlock();
      (*fn)(index);
      g.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  std::mutex busy_;  // held by the one call using the pool
  std::mutex m_;
  std::condition_variable work_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int n_ = 0;
  int remaining_ = 0;
  bool stop_ = false;
};

// ---- jobs ----------------------------------------------------------------
constexpr int max_windows = 8;

struct alignas(128) job_slot {
  spu_job job;
  window windows[max_windows];
  int n_windows = 0;
  // results
  uint32_t spu = 0;
  dma::fault_report fault;
  dma::counters counters;
  uint32_t ls_high_water = 0;

  void add(const void* p, std::size_t bytes, bool writable) {
    if (bytes > 0) windows[n_windows++] = {p, bytes, writable};
  }
};

job_slot make_slot(uint32_t op, const options& o) {
  job_slot s{};
  std::memset(&s.job, 0, sizeof s.job);
  s.job.op = op;
  s.job.tile_bytes = o.tile_bytes;
  s.job.chunk_floats = o.chunk_floats;
  s.job.status = std::numeric_limits<uint32_t>::max();
  return s;
}

uint64_t ea(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Runs one job on the calling thread's SPE.
void run_slot(job_slot& s, const options& o, arithmetic a) {
  dma::engine& e = local_engine();
  e.clear_fault();
  e.clear_windows();
  e.reset_stats();
  e.set_completion(o.completion);
  if (o.poison_ls) e.poison_data();
  e.allow_read(&s.job, sizeof s.job);
  e.allow_write(reinterpret_cast<uint8_t*>(&s.job) + SPU_JOB_STATUS_OFFSET, 16);
  for (int i = 0; i < s.n_windows; ++i) {
    const window& w = s.windows[i];
    e.allow_read(w.p, w.bytes);
    if (w.writable) e.allow_write(const_cast<void*>(w.p), w.bytes);
  }
  spu_host::bind(&e);
  if (a == arithmetic::spu) {
    spu_host::spu_arithmetic mode;
    s.spu = spu_program::spu_run_job(ea(&s.job));
  } else {
    s.spu = spe_program::spu_run_job(ea(&s.job));
  }
  spu_host::bind(nullptr);
  e.finish();
  s.fault = e.first_fault();
  s.counters = e.stats();
  s.ls_high_water = s.fault.code == dma::fault::none ? s.job.ls_high_water : 0;
  e.clear_windows();
}

const char* spu_status_name(uint32_t st) {
  switch (st) {
    case SPU_OK: return "ok";
    case SPU_ERR_BAD_JOB: return "bad job (unknown op or inconsistent shape)";
    case SPU_ERR_LS_BUDGET: return "shape needs more local store than the 192 KiB data region";
    default: return "unknown SPU status";
  }
}

template <class T>
void atomic_max(std::atomic<T>& a, T v) {
  T cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
}

status run_slots(job_slot* slots, int n, const options& o, arithmetic a, const char* what) {
  pool::instance().run(n, [&](int i) { run_slot(slots[i], o, a); });
  status st;
  for (int i = 0; i < n; ++i) {
    const job_slot& s = slots[i];
    totals.commands += s.counters.commands;
    totals.list_commands += s.counters.list_commands;
    totals.transfers += s.counters.transfers;
    totals.bytes_get += s.counters.bytes_get;
    totals.bytes_put += s.counters.bytes_put;
    totals.waits += s.counters.waits;
    totals.rejected += s.counters.rejected;
    atomic_max(totals.ls_high_water, s.ls_high_water);
    if (st.ok() && (s.spu != SPU_OK || s.fault.code != dma::fault::none)) {
      st.spu = s.spu;
      st.fault = s.fault.code;
      std::ostringstream m;
      m << (a == arithmetic::spu ? "spu-host " : "spe ") << what << " (worker " << i << " of "
        << n << "): ";
      if (s.fault.code != dma::fault::none) {
        m << s.fault.message();
      } else {
        m << spu_status_name(s.spu);
        if (s.spu == SPU_ERR_LS_BUDGET) {
          st.ls_need = s.job.detail;
          m << " (needs " << s.job.detail << " bytes)";
        }
      }
      st.message = m.str();
    }
  }
  totals.kernel_calls += 1;
  totals.jobs += static_cast<uint64_t>(n);
  if (!st.ok()) {
    totals.errors += 1;
    std::lock_guard<std::mutex> g(error_mutex);
    last_error_message = st.message;
  }
  return st;
}

int clamp_workers(int w) { return std::max(1, std::min(max_workers, w)); }

// Splits [0, n) into at most `parts` ranges whose bounds are multiples of
// `align`. Returns the number of ranges; range i is [b[i], b[i+1]).
int split(int n, int parts, int align, int* b) {
  const int per = ((n + parts - 1) / parts + align - 1) / align * align;
  int k = 0;
  b[0] = 0;
  while (b[k] < n) {
    b[k + 1] = std::min(n, b[k] + per);
    ++k;
  }
  return k;
}

int matvec_workers(const options& o, int rows) {
  const int by_rows = std::max(1, rows / std::max(1, o.min_rows_per_worker));
  return std::min(clamp_workers(o.workers), by_rows);
}

}  // namespace

void set_options(const options& o) {
  std::lock_guard<std::mutex> g(config_mutex);
  config = o;
  config.workers = clamp_workers(o.workers);
}

options get_options() { return snapshot(); }

stats get_stats() {
  stats s;
  s.kernel_calls = totals.kernel_calls;
  s.jobs = totals.jobs;
  s.errors = totals.errors;
  s.dma.commands = totals.commands;
  s.dma.list_commands = totals.list_commands;
  s.dma.transfers = totals.transfers;
  s.dma.bytes_get = totals.bytes_get;
  s.dma.bytes_put = totals.bytes_put;
  s.dma.waits = totals.waits;
  s.dma.rejected = totals.rejected;
  s.ls_high_water = totals.ls_high_water;
  return s;
}

void reset_stats() {
  for (auto* a : {&totals.kernel_calls, &totals.jobs, &totals.errors, &totals.commands,
                  &totals.list_commands, &totals.transfers, &totals.bytes_get, &totals.bytes_put,
                  &totals.waits, &totals.rejected})
    *a = 0;
  totals.ls_high_water = 0;
}

std::string last_error() {
  std::lock_guard<std::mutex> g(error_mutex);
  return last_error_message;
}

status matvec(float* out, const float* W, const float* x, int rows, int cols, int ld,
              arithmetic a) {
  const options o = snapshot();
  job_slot slots[max_workers];
  int b[max_workers + 1];
  const int n = rows > 0 ? split(rows, matvec_workers(o, rows), 4, b) : 0;
  for (int i = 0; i < n; ++i) {
    job_slot& s = slots[i] = make_slot(SPU_OP_MATVEC, o);
    s.job.ea[0] = ea(out);
    s.job.ea[1] = ea(W);
    s.job.ea[2] = ea(x);
    s.job.arg[0] = rows;
    s.job.arg[1] = cols;
    s.job.arg[2] = ld;
    s.job.arg[3] = b[i];
    s.job.arg[4] = b[i + 1];
    const std::size_t first = static_cast<std::size_t>(b[i]) * ld;
    const std::size_t last = static_cast<std::size_t>(b[i + 1] - 1) * ld + cols;
    s.add(W + first, (last - first) * sizeof(float), false);
    s.add(x, static_cast<std::size_t>(cols) * sizeof(float), false);
    s.add(out + b[i], static_cast<std::size_t>(b[i + 1] - b[i]) * sizeof(float), true);
  }
  return run_slots(slots, n, o, a, "matvec");
}

status matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols,
                 arithmetic a) {
  const options o = snapshot();
  job_slot slots[max_workers];
  int b[max_workers + 1];
  const int n = rows > 0 ? split(rows, matvec_workers(o, rows), 4, b) : 0;
  const std::size_t nb = static_cast<std::size_t>(q8_blocks_per_row(cols));
  for (int i = 0; i < n; ++i) {
    job_slot& s = slots[i] = make_slot(SPU_OP_MATVEC_Q8, o);
    s.job.ea[0] = ea(out);
    s.job.ea[1] = ea(W);
    s.job.ea[2] = ea(x);
    s.job.arg[0] = rows;
    s.job.arg[1] = cols;
    s.job.arg[3] = b[i];
    s.job.arg[4] = b[i + 1];
    s.add(W + b[i] * nb, (b[i + 1] - b[i]) * nb * sizeof(q8_block), false);
    s.add(x, static_cast<std::size_t>(cols) * sizeof(float), false);
    s.add(out + b[i], static_cast<std::size_t>(b[i + 1] - b[i]) * sizeof(float), true);
  }
  return run_slots(slots, n, o, a, "matvec_q8");
}

status rmsnorm(float* out, const float* x, const float* weight, int n, arithmetic a) {
  const options o = snapshot();
  job_slot s = make_slot(SPU_OP_RMSNORM, o);
  s.job.ea[0] = ea(out);
  s.job.ea[1] = ea(x);
  s.job.ea[2] = ea(weight);
  s.job.arg[0] = n;
  const std::size_t bytes = static_cast<std::size_t>(std::max(n, 0)) * sizeof(float);
  s.add(x, bytes, false);
  s.add(weight, bytes, false);
  s.add(out, bytes, true);
  return run_slots(&s, 1, o, a, "rmsnorm");
}

status rope(float* q, int nq, float* k, int nk, int pos, int head_size, arithmetic a) {
  const options o = snapshot();
  job_slot s = make_slot(SPU_OP_ROPE, o);
  s.job.ea[0] = ea(q);
  s.job.ea[1] = ea(k);
  s.job.arg[0] = nq;
  s.job.arg[1] = nk;
  s.job.arg[2] = pos;
  s.job.arg[3] = head_size;
  s.add(q, static_cast<std::size_t>(std::max(nq, 0)) * sizeof(float), true);
  s.add(k, static_cast<std::size_t>(std::max(nk, 0)) * sizeof(float), true);
  return run_slots(&s, 1, o, a, "rope");
}

status softmax(float* x, int n, arithmetic a) {
  const options o = snapshot();
  job_slot s = make_slot(SPU_OP_SOFTMAX, o);
  s.job.ea[0] = ea(x);
  s.job.arg[0] = n;
  s.add(x, static_cast<std::size_t>(std::max(n, 0)) * sizeof(float), true);
  return run_slots(&s, 1, o, a, "softmax");
}

status attention(float* out, const float* q, const float* k_cache, const float* v_cache,
                 float* att, int n_heads, int kv_mul, int head_size, int kv_stride, int pos,
                 arithmetic a) {
  const options o = snapshot();
  job_slot slots[max_workers];
  int b[max_workers + 1];
  const int n =
      n_heads > 0 ? split(n_heads, std::min(clamp_workers(o.workers), n_heads), 1, b) : 0;
  const std::size_t T = static_cast<std::size_t>(std::max(pos, 0)) + 1;
  const std::size_t hs = static_cast<std::size_t>(std::max(head_size, 0));
  for (int i = 0; i < n; ++i) {
    job_slot& s = slots[i] = make_slot(SPU_OP_ATTENTION, o);
    s.job.ea[0] = ea(out);
    s.job.ea[1] = ea(q);
    s.job.ea[2] = ea(k_cache);
    s.job.ea[3] = ea(v_cache);
    s.job.ea[4] = ea(att);
    s.job.arg[0] = n_heads;
    s.job.arg[1] = kv_mul;
    s.job.arg[2] = head_size;
    s.job.arg[3] = kv_stride;
    s.job.arg[4] = pos;
    s.job.arg[5] = b[i];
    s.job.arg[6] = b[i + 1];
    const std::size_t h0 = b[i], h1 = b[i + 1];
    s.add(q + h0 * hs, (h1 - h0) * hs * sizeof(float), false);
    s.add(k_cache, T * kv_stride * sizeof(float), false);
    s.add(v_cache, T * kv_stride * sizeof(float), false);
    s.add(att + h0 * T, (h1 - h0) * T * sizeof(float), true);
    s.add(out + h0 * hs, (h1 - h0) * hs * sizeof(float), true);
  }
  return run_slots(slots, n, o, a, "attention");
}

status swiglu(float* hb, const float* hb2, int n, arithmetic a) {
  const options o = snapshot();
  job_slot s = make_slot(SPU_OP_SWIGLU, o);
  s.job.ea[0] = ea(hb);
  s.job.ea[1] = ea(hb2);
  s.job.arg[0] = n;
  const std::size_t bytes = static_cast<std::size_t>(std::max(n, 0)) * sizeof(float);
  s.add(hb, bytes, true);
  s.add(hb2, bytes, false);
  return run_slots(&s, 1, o, a, "swiglu");
}

status run_raw_job(spu_job* job, const window* windows, int n_windows, arithmetic a) {
  const options o = snapshot();
  job_slot s = make_slot(job->op, o);
  s.job = *job;
  for (int i = 0; i < n_windows && i < max_windows; ++i)
    s.add(windows[i].p, windows[i].bytes, windows[i].writable);
  status st = run_slots(&s, 1, o, a, "raw job");
  *job = s.job;
  return st;
}

}  // namespace cellshard::kernels::spe

// ---- the backend tables -----------------------------------------------------
namespace cellshard::kernels {
namespace {

constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

void poison(float* p, int n) {
  for (int i = 0; i < n; ++i) p[i] = nan_value;
}

template <spe::arithmetic A>
struct table {
  static void matvec(float* out, const float* W, const float* x, int rows, int cols, int ld) {
    if (!spe::matvec(out, W, x, rows, cols, ld, A)) poison(out, rows);
  }
  static void matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols) {
    if (!spe::matvec_q8(out, W, x, rows, cols, A)) poison(out, rows);
  }
  static void rmsnorm(float* out, const float* x, const float* weight, int n) {
    if (!spe::rmsnorm(out, x, weight, n, A)) poison(out, n);
  }
  static void rope(float* q, int nq, float* k, int nk, int pos, int head_size) {
    if (!spe::rope(q, nq, k, nk, pos, head_size, A)) {
      poison(q, nq);
      poison(k, nk);
    }
  }
  static void softmax(float* x, int n) {
    if (!spe::softmax(x, n, A)) poison(x, n);
  }
  static void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
                        float* att, int n_heads, int kv_mul, int head_size, int kv_stride,
                        int pos) {
    if (!spe::attention(out, q, k_cache, v_cache, att, n_heads, kv_mul, head_size, kv_stride,
                        pos, A))
      poison(out, n_heads * head_size);
  }
  static void swiglu(float* hb, const float* hb2, int n) {
    if (!spe::swiglu(hb, hb2, n, A)) poison(hb, n);
  }
  // f32 weights stream through the SPE matvec in place; other types in
  // `exact` mode are dequantized by the host (the PPE) in chunks of rows that
  // then stream through the same SPE matvec; `ggml` rounding of non-f32 types
  // uses the reference loops.
  static void matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride,
                           const float* x, int rows, int cols, matmul_mode mode) {
    if (t == dtype::f32) {
      matvec(out, static_cast<const float*>(W), x, rows, cols,
             static_cast<int>(row_stride / sizeof(float)));
      return;
    }
    if (mode != matmul_mode::exact) {
      ref::matvec_typed(out, W, t, row_stride, x, rows, cols, mode);
      return;
    }
    constexpr int chunk = 64;
    thread_local std::vector<float> buf;
    buf.resize(static_cast<std::size_t>(chunk) * cols);
    const uint8_t* p = static_cast<const uint8_t*>(W);
    for (int r0 = 0; r0 < rows; r0 += chunk) {
      const int n = rows - r0 < chunk ? rows - r0 : chunk;
      for (int r = 0; r < n; ++r)
        dequantize_row(t, p + (r0 + r) * row_stride, buf.data() + static_cast<std::size_t>(r) * cols,
                       cols);
      matvec(out + r0, buf.data(), x, n, cols, cols);
    }
  }
  static bool supports(op o) { return o != op::count; }
};

}  // namespace

const backend& spe_backend() {
  using t = table<spe::arithmetic::host>;
  static const backend b{"spe",      t::matvec,    t::matvec_q8, t::rmsnorm, t::rope,
                         t::softmax, t::attention, t::swiglu,    t::supports,
                         t::matvec_typed};
  return b;
}

const backend& spu_host_backend() {
  using t = table<spe::arithmetic::spu>;
  static const backend b{"spu-host", t::matvec,    t::matvec_q8, t::rmsnorm, t::rope,
                         t::softmax,  t::attention, t::swiglu,    t::supports,
                         t::matvec_typed};
  return b;
}

void set_spe_workers(int n) {
  spe::options o = spe::get_options();
  o.workers = n;
  spe::set_options(o);
}

int spe_workers() { return spe::get_options().workers; }

}  // namespace cellshard::kernels
