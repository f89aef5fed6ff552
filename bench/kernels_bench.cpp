// `cellshard bench kernels`: see bench/kernels_bench.hpp.
#include "bench/kernels_bench.hpp"

#include "kernels/backend.hpp"
#include "kernels/native.hpp"
#include "kernels/pool.hpp"
#include "kernels/reference.hpp"
#include "kernels/spe.hpp"
#include "kernels/types.hpp"

#ifndef CELLSHARD_NO_BLAS
#include <cblas.h>
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>
#include <vector>

namespace cellshard::bench {
namespace {

using clock_type = std::chrono::steady_clock;
typedef float v4f __attribute__((vector_size(16)));

struct free_deleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using aligned_ptr = std::unique_ptr<T[], free_deleter>;

template <class T>
aligned_ptr<T> alloc(std::size_t n) {
  const std::size_t bytes = (n * sizeof(T) + 127) / 128 * 128;
  return aligned_ptr<T>(static_cast<T*>(std::aligned_alloc(128, bytes)));
}

// xorshift64*: fast fill of large buffers (the values only need to be finite
// and varied; the kernels' correctness is the tests' business).
struct fast_rng {
  uint64_t s;
  uint32_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return static_cast<uint32_t>((s * 0x2545F4914F6CDD1Dull) >> 32);
  }
  float uniform() { return static_cast<float>(next() >> 8) * (2.0f / 16777216.0f) - 1.0f; }
};

// CPU seconds of the calling thread (CLOCK_THREAD_CPUTIME_ID).
double thread_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
bool g_cpu_time = false;  // kernels_bench_options::cpu_time for this run

// Median time of f() in seconds (wall, or the calling thread's CPU time with
// --cpu-time): calls until min_s of wall time have passed (at least 2, at
// most 50), after one warm-up call when a call is short.
template <class F>
double time_median(F&& f, double min_s) {
  std::vector<double> t;
  auto now = [] { return g_cpu_time ? thread_cpu_s() : std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(); };
  const auto start = clock_type::now();
  const double t0 = now();
  f();
  const double first = now() - t0;
  if (first > min_s) t.push_back(first);  // slow: the first call counts
  while (t.size() < 2 ||
         (std::chrono::duration<double>(clock_type::now() - start).count() < min_s && t.size() < 50)) {
    const double a = now();
    f();
    t.push_back(now() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Read bandwidth: `threads` threads each sum their share of p[0..n) with
// four vector accumulators. Best of 5 (bytes / s).
double read_bandwidth(const float* p, std::size_t n, int threads) {
  volatile float sink = 0;
  std::vector<double> cpu(threads);
  auto pass = [&] {
    std::vector<std::thread> ts;
    std::vector<float> part(threads);
    const std::size_t per = (n / threads) & ~std::size_t{15};
    for (int i = 0; i < threads; ++i)
      ts.emplace_back([&, i] {
        const double c0 = thread_cpu_s();
        const v4f* v = reinterpret_cast<const v4f*>(p + per * i);
        v4f a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
        for (std::size_t k = 0; k + 4 <= per / 4; k += 4) {
          a0 += v[k];
          a1 += v[k + 1];
          a2 += v[k + 2];
          a3 += v[k + 3];
        }
        const v4f s = (a0 + a1) + (a2 + a3);
        part[i] = s[0] + s[1] + s[2] + s[3];
        cpu[i] = thread_cpu_s() - c0;
      });
    for (auto& t : ts) t.join();
    for (float f : part) sink = sink + f;
  };
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto a = clock_type::now();
    pass();
    const double wall = std::chrono::duration<double>(clock_type::now() - a).count();
    best = std::min(best, g_cpu_time ? *std::max_element(cpu.begin(), cpu.end()) : wall);
  }
  const std::size_t per = (n / threads) & ~std::size_t{15};
  return static_cast<double>(per * threads * sizeof(float)) / best;
}

enum class wtype { f32, q8_0, q4_0 };

struct shape {
  int rows, cols;
  wtype type;
  bool quant() const { return type != wtype::f32; }
};

std::string fmt(double v, int prec = 3) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

std::string mib(double bytes) { return fmt(bytes / (1024.0 * 1024.0), 1); }

}  // namespace

std::string kernels_bench_json(const std::vector<kernels_bench_row>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json o = {{"name", r.name}, {"params", r.params}, {"value", r.value}, {"unit", r.unit}};
    if (r.baseline >= 0) {
      o["baseline"] = r.baseline;
      o["baseline_name"] = r.baseline_name;
      o["ratio"] = r.ratio;
    }
    j.push_back(o);
  }
  return j.dump(2) + "\n";
}

int run_kernels_bench(const kernels_bench_options& o, std::ostream& out,
                      std::vector<kernels_bench_row>& rows) {
  kernels::register_backend(&kernels::spe_backend());
  kernels::register_backend(&kernels::spu_host_backend());
  g_cpu_time = o.cpu_time;
  std::vector<const kernels::backend*> bes;
  for (const auto& n : o.backends) {
    const kernels::backend* be = kernels::find_backend(n);
    if (!be) {
      out << "bench kernels: unknown backend '" << n << "'\n";
      return 1;
    }
    bes.push_back(be);
  }
  // --isa: native's level for this run (restored on every return).
  struct isa_restore {
    kernels::native::isa saved = kernels::native::active_isa();
    ~isa_restore() { kernels::native::set_isa(saved); }
  } isa_guard;
  if (!o.isa.empty()) {
    bool set = false;
    for (kernels::native::isa i : kernels::native::all_isas)
      if (o.isa == kernels::native::to_string(i)) set = kernels::native::set_isa(i);
    if (!set) {
      out << "bench kernels: --isa '" << o.isa << "' is not a level this CPU and build run (best here: "
          << kernels::native::to_string(kernels::native::best_isa())
          << "; levels: portable, avx2, avx512, avx512vnni, neon)\n";
      return 1;
    }
  }
  const int threads =
      o.workers > 0 ? o.workers : std::max(1u, std::thread::hardware_concurrency());
  const kernels::spe::options saved = kernels::spe::get_options();
  kernels::spe::options so;
  so.workers = threads;
  kernels::spe::set_options(so);
  kernels::set_blas_threads(threads);
  // native splits rows over the pool installed on this thread.
  kernels::pool native_pool(threads);
  kernels::pool::scope use_pool(&native_pool);
  const kernels::native::precision saved_precision = kernels::native::active_precision();

  // Default: f32 16 MiB (fits the 32 MiB L3 here), 64 MiB, 256 MiB; q8_0
  // 17.0 MiB (fits), 272 MiB.
  const bool custom = o.rows > 0 && o.cols > 0;
  const std::vector<shape> shapes =
      custom ? std::vector<shape>{{o.rows, o.cols, wtype::f32},
                                  {o.rows, o.cols, wtype::q8_0},
                                  {o.rows, o.cols, wtype::q4_0}}
             : std::vector<shape>{{2048, 2048, wtype::f32},    {4096, 4096, wtype::f32},
                                  {8192, 8192, wtype::f32},    {4096, 4096, wtype::q8_0},
                                  {16384, 16384, wtype::q8_0}, {4096, 4096, wtype::q4_0},
                                  {16384, 16384, wtype::q4_0}};

  // The bandwidth probe reads 256 MiB by default (more than any cache).
  const std::size_t probe_n = static_cast<std::size_t>(std::max(1, o.probe_mib)) << 18;
  double probe_bps;
  {
    auto buf = alloc<float>(probe_n);
    if (!buf) {
      out << "bench kernels: cannot allocate the " << o.probe_mib << " MiB probe buffer\n";
      return 1;
    }
    fast_rng r{0x9e3779b97f4a7c15ull};
    for (std::size_t i = 0; i < probe_n; ++i) buf[i] = r.uniform();
    probe_bps = read_bandwidth(buf.get(), probe_n, threads);
  }
  out << "bench kernels: " << threads << " thread(s) for blas/native/spe/sgemv (reference: 1); native level "
      << kernels::native::to_string(kernels::native::active_isa()) << "\n"
      << "read bandwidth probe (" << o.probe_mib << " MiB, " << threads << " threads): " << fmt(probe_bps / 1e9, 2)
      << " GB/s\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-10s %-11s %6s %6s %8s %10s %9s %8s %9s %9s %s\n", "kernel",
                "backend", "rows", "cols", "MiB", "ms/call", "GFLOP/s", "GB/s", "x sgemv", "x probe",
                "dma/weights");
  out << line;
  {
    kernels_bench_row r;
    r.name = "read_bandwidth";
    r.params = {{"threads", std::to_string(threads)}, {"bytes", std::to_string(probe_n * 4)}};
    r.value = probe_bps / 1e9;
    r.unit = "GB/s";
    rows.push_back(r);
  }

  int status = 0;
  for (const shape& sh : shapes) {
    const std::size_t n = static_cast<std::size_t>(sh.rows) * sh.cols;
    const std::size_t nb = static_cast<std::size_t>(kernels::q8_blocks_per_row(sh.cols));
    const double wbytes =
        sh.type == wtype::q8_0   ? static_cast<double>(sh.rows) * nb * sizeof(kernels::q8_block)
        : sh.type == wtype::q4_0 ? static_cast<double>(sh.rows) * nb * sizeof(kernels::q4_block)
                                 : static_cast<double>(n) * sizeof(float);
    const double io_bytes = wbytes + (sh.cols + sh.rows) * 4.0;
    const double flops = 2.0 * static_cast<double>(n);
    fast_rng r{0x1234567ull + n};
    auto x = alloc<float>(sh.cols);
    auto y = alloc<float>(sh.rows);
    for (int i = 0; i < sh.cols; ++i) x[i] = r.uniform();
    aligned_ptr<float> W;
    aligned_ptr<kernels::q8_block> Wq;
    aligned_ptr<kernels::q4_block> W4;
    if (sh.type == wtype::q4_0) {
      W4 = alloc<kernels::q4_block>(static_cast<std::size_t>(sh.rows) * nb);
      if (!W4) {
        out << "bench kernels: cannot allocate " << mib(wbytes) << " MiB\n";
        status = 1;
        break;
      }
      for (std::size_t b = 0; b < static_cast<std::size_t>(sh.rows) * nb; ++b) {
        W4[b].d = kernels::fp32_to_fp16(0.01f + 0.001f * static_cast<float>(r.next() % 16));
        for (int i = 0; i < 16; ++i) W4[b].qs[i] = static_cast<uint8_t>(r.next());
      }
    } else if (sh.type == wtype::q8_0) {
      Wq = alloc<kernels::q8_block>(static_cast<std::size_t>(sh.rows) * nb);
      if (!Wq) {
        out << "bench kernels: cannot allocate " << mib(wbytes) << " MiB\n";
        status = 1;
        break;
      }
      for (std::size_t b = 0; b < static_cast<std::size_t>(sh.rows) * nb; ++b) {
        Wq[b].d = kernels::fp32_to_fp16(0.01f + 0.001f * static_cast<float>(r.next() % 16));
        for (int i = 0; i < 32; ++i) Wq[b].qs[i] = static_cast<int8_t>(r.next() % 255 - 127);
      }
    } else {
      W = alloc<float>(n);
      if (!W) {
        out << "bench kernels: cannot allocate " << mib(wbytes) << " MiB\n";
        status = 1;
        break;
      }
      for (std::size_t i = 0; i < n; ++i) W[i] = r.uniform();
    }

    // Baseline: OpenBLAS sgemv on the f32 matrix of this shape (for q8 shapes
    // too: same product, 3.8x the bytes). Skipped for q8 shapes above 64 MiB of f32.
    double sgemv_s = -1;
#ifndef CELLSHARD_NO_BLAS  // a build without OpenBLAS (cross builds) has no baseline row
    if (!sh.quant()) {
      sgemv_s = time_median(
          [&] {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, sh.rows, sh.cols, 1.0f, W.get(), sh.cols,
                        x.get(), 1, 0.0f, y.get(), 1);
          },
          o.min_seconds);
    } else if (n * sizeof(float) <= (std::size_t{64} << 20)) {
      auto Wf = alloc<float>(n);
      for (std::size_t i = 0; i < n; ++i) Wf[i] = r.uniform();
      sgemv_s = time_median(
          [&] {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, sh.rows, sh.cols, 1.0f, Wf.get(), sh.cols,
                        x.get(), 1, 0.0f, y.get(), 1);
          },
          o.min_seconds);
    }
#endif
    const char* kname = sh.type == wtype::q8_0   ? "matvec_q8"
                        : sh.type == wtype::q4_0 ? "matvec_q4"
                                                 : "matvec_f32";
    if (sgemv_s > 0) {
      std::snprintf(line, sizeof line, "%-10s %-11s %6d %6d %8s %10.3f %9.2f %8.2f %9s %9.3f %s\n",
                    "sgemv_f32", "openblas", sh.rows, sh.cols,
                    mib(static_cast<double>(n) * 4).c_str(), sgemv_s * 1e3, flops / sgemv_s / 1e9,
                    (static_cast<double>(n) * 4 + (sh.cols + sh.rows) * 4.0) / sgemv_s / 1e9,
                    "1.000", (static_cast<double>(n) * 4 / sgemv_s) / probe_bps, "");
      out << line;
      kernels_bench_row br;
      br.name = "sgemv_f32";
      br.params = {{"rows", std::to_string(sh.rows)}, {"cols", std::to_string(sh.cols)},
                   {"threads", std::to_string(threads)},
                   {"ms_per_call", fmt(sgemv_s * 1e3, 4)}};
      br.value = flops / sgemv_s / 1e9;
      br.unit = "GFLOP/s";
      rows.push_back(br);
    }

    struct subject {
      const kernels::backend* be;
      kernels::native::precision precision;
      std::string label;
    };
    std::vector<subject> subjects;
    for (const kernels::backend* be : bes) {
      const bool native = be == &kernels::native_backend();
      if (sh.type == wtype::q8_0 && !be->supports(kernels::op::matvec_q8) &&
          be != &kernels::reference_backend())
        continue;  // e.g. blas: its q8 slot is reference's loop, measured already
      if (sh.type == wtype::q4_0 && !native) continue;  // only native has q4_0
      subjects.push_back({be, kernels::native::precision::exact, be->name});
      if (native && sh.quant())
        subjects.push_back({be, kernels::native::precision::ggml, "native/ggml"});
    }
    for (const subject& sj : subjects) {
      const kernels::backend* be = sj.be;
      kernels::native::set_precision(sj.precision);
      kernels::spe::reset_stats();
      const double s = time_median(
          [&] {
            if (sh.type == wtype::q8_0)
              be->matvec_q8(y.get(), Wq.get(), x.get(), sh.rows, sh.cols);
            else if (sh.type == wtype::q4_0)
              kernels::native::matvec_q4(y.get(), W4.get(), x.get(), sh.rows, sh.cols);
            else
              be->matvec(y.get(), W.get(), x.get(), sh.rows, sh.cols, sh.cols);
          },
          o.min_seconds);
      const kernels::spe::stats st = kernels::spe::get_stats();
      const bool cell = be == &kernels::spe_backend() || be == &kernels::spu_host_backend();
      if (cell && st.errors > 0) {
        out << "bench kernels: " << be->name << " failed: " << kernels::spe::last_error() << "\n";
        status = 1;
      }
      std::string dma = "";
      if (cell && st.kernel_calls > 0)
        dma = fmt(static_cast<double>(st.dma.bytes_get) / static_cast<double>(st.kernel_calls) /
                      wbytes,
                  4);
      const double gflops = flops / s / 1e9, gbps = io_bytes / s / 1e9;
      const double vs_sgemv = sgemv_s > 0 ? sgemv_s / s : -1;
      std::snprintf(line, sizeof line, "%-10s %-11s %6d %6d %8s %10.3f %9.2f %8.2f %9s %9.3f %s\n",
                    kname, sj.label.c_str(), sh.rows, sh.cols, mib(wbytes).c_str(), s * 1e3, gflops, gbps,
                    vs_sgemv > 0 ? fmt(vs_sgemv).c_str() : "-", io_bytes / s / probe_bps, dma.c_str());
      out << line;
      const int be_threads = be == &kernels::reference_backend() ? 1 : threads;
      std::map<std::string, std::string> params = {
          {"backend", be->name},
          {"precision", kernels::native::to_string(sj.precision)},
          {"rows", std::to_string(sh.rows)},
          {"cols", std::to_string(sh.cols)},
          {"threads", std::to_string(be_threads)},
          {"weight_mib", mib(wbytes)},
          {"ms_per_call", fmt(s * 1e3, 4)}};
      if (!dma.empty()) params["dma_bytes_per_weight_byte"] = dma;
      kernels_bench_row a;
      a.name = std::string(kname) + "_speed";
      a.params = params;
      a.value = gflops;
      a.unit = "GFLOP/s";
      if (sgemv_s > 0) {
        a.baseline = flops / sgemv_s / 1e9;
        a.baseline_name = "openblas sgemv f32";
        a.ratio = a.value / a.baseline;
      }
      rows.push_back(a);
      kernels_bench_row b;
      b.name = std::string(kname) + "_bandwidth";
      b.params = params;
      b.value = gbps;
      b.unit = "GB/s";
      b.baseline = probe_bps / 1e9;
      b.baseline_name = "read bandwidth probe";
      b.ratio = b.value / b.baseline;
      rows.push_back(b);
    }
  }
  // GGUF weight types without a llama2.c slot (backend::matvec_typed):
  // native's kernels against the reference loops, both precisions, random
  // blocks with small finite scales, 4096 x 4096 (or the custom shape when its
  // columns are a multiple of 256).
  if (status == 0) {
    const int trows = custom ? o.rows : 4096;
    const int tcols = custom && o.cols % kernels::qk_k == 0 ? o.cols : 4096;
    for (kernels::dtype t : {kernels::dtype::f16, kernels::dtype::bf16, kernels::dtype::q4_k, kernels::dtype::q6_k}) {
      const std::size_t stride = kernels::row_bytes(t, tcols);
      const double wbytes = static_cast<double>(stride) * trows;
      std::vector<uint8_t> Wt(stride * trows);
      fast_rng r{0xabcdefull + static_cast<unsigned>(t)};
      for (auto& b : Wt) b = static_cast<uint8_t>(r.next());
      const uint16_t small = kernels::fp32_to_fp16(0.01f);
      for (int row = 0; row < trows; ++row) {
        uint8_t* base = Wt.data() + stride * row;
        if (t == kernels::dtype::f16 || t == kernels::dtype::bf16) {
          auto* h = reinterpret_cast<uint16_t*>(base);
          for (int c = 0; c < tcols; ++c)
            h[c] = t == kernels::dtype::f16 ? kernels::fp32_to_fp16(r.uniform()) : kernels::fp32_to_bf16(r.uniform());
        } else if (t == kernels::dtype::q4_k) {
          auto* b = reinterpret_cast<kernels::block_q4_k*>(base);
          for (int k = 0; k < tcols / kernels::qk_k; ++k) b[k].d = b[k].dmin = small;
        } else {
          auto* b = reinterpret_cast<kernels::block_q6_k*>(base);
          for (int k = 0; k < tcols / kernels::qk_k; ++k) b[k].d = small;
        }
      }
      auto x = alloc<float>(tcols);
      auto y = alloc<float>(trows);
      for (int i = 0; i < tcols; ++i) x[i] = r.uniform();
      for (kernels::matmul_mode mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
        const double ref_s = time_median(
            [&] { kernels::ref::matvec_typed(y.get(), Wt.data(), t, stride, x.get(), trows, tcols, mode); },
            o.min_seconds);
        const double nat_s = time_median(
            [&] {
              kernels::native_backend().matvec_typed(y.get(), Wt.data(), t, stride, x.get(), trows, tcols, mode);
            },
            o.min_seconds);
        const std::string kname = std::string("typed_") + kernels::to_string(t);
        for (int which = 0; which < 2; ++which) {
          const double s = which ? nat_s : ref_s;
          const double gbps = (wbytes + (tcols + trows) * 4.0) / s / 1e9;
          std::snprintf(line, sizeof line, "%-10s %-11s %6d %6d %8s %10.3f %9.2f %8.2f %9s %9.3f %s\n",
                        kname.c_str(), which ? (mode == kernels::matmul_mode::ggml ? "native/ggml" : "native")
                                             : (mode == kernels::matmul_mode::ggml ? "ref/ggml" : "reference"),
                        trows, tcols, mib(wbytes).c_str(), s * 1e3, 2.0 * trows * tcols / s / 1e9, gbps, "-",
                        gbps * 1e9 / probe_bps, which ? ("x ref " + fmt(ref_s / nat_s, 2)).c_str() : "");
          out << line;
        }
        kernels_bench_row a;
        a.name = kname + "_bandwidth";
        a.params = {{"backend", "native"},
                    {"precision", kernels::to_string(mode)},
                    {"rows", std::to_string(trows)},
                    {"cols", std::to_string(tcols)},
                    {"threads", std::to_string(threads)},
                    {"weight_mib", mib(wbytes)},
                    {"x_reference", fmt(ref_s / nat_s, 2)}};
        a.value = (wbytes + (tcols + trows) * 4.0) / nat_s / 1e9;
        a.unit = "GB/s";
        a.baseline = probe_bps / 1e9;
        a.baseline_name = "read bandwidth probe";
        a.ratio = a.value / a.baseline;
        rows.push_back(a);
      }
    }
  }
  out << "GB/s counts weight + x + out bytes once per call; 'x sgemv' is speed relative to "
         "OpenBLAS sgemv f32 on the same shape; 'x probe' is GB/s relative to the read "
         "bandwidth probe; dma/weights is the spe backend's DMA-in bytes per weight byte.\n";
  kernels::spe::set_options(saved);
  kernels::native::set_precision(saved_precision);
  return status;
}

int run_kernels_bench(const kernels_bench_options& o, std::ostream& out, std::string* json_out) {
  std::vector<kernels_bench_row> rows;
  const int st = run_kernels_bench(o, out, rows);
  if (json_out) *json_out = kernels_bench_json(rows);
  return st;
}

}  // namespace cellshard::bench
