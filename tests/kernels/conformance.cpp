// The kernel conformance test (llama.cpp test-backend-ops' idea): every
// kernel of every backend against `reference`, over shapes that are not
// block multiples (1, 7, 33, 4097, stories260K's 64/172/32/8/512, and sizes
// beyond one tile, panel or chunk), operands misaligned by chosen byte
// offsets, seeded inputs, an NMSE bound. The Cell backends run under several
// configurations (tile sizes, worker counts, DMA completion modes, a
// poisoned local store) so that every tiling path is taken.
#include "kernels/backend.hpp"
#include "kernels/native.hpp"
#include "kernels/reference.hpp"
#include "kernels/spe.hpp"
#include "kernels/spu/spu_job.h"
#include "tests/kernels/common.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

using namespace cellshard;
using namespace cellshard::kernels;
using cellshard::test::buffer;
using cellshard::test::nmse;

namespace {

// NMSE bounds. spe sums in a different order than reference (16 lanes in
// 64-float blocks, then a tree): measured at most 2.3e-12 here. spu-host
// also rounds every operation toward zero and fuses multiply-adds as an SPU
// does: at most 1.4e-10 with the default tiles, up to 6e-10 when the
// test-only 64-byte tiles cut a row of 40000 into 1250 panels whose partial
// sums are added one by one.
constexpr double bound_f32 = 1e-10;
constexpr double bound_spu = 1e-9;

struct config {
  const char* name;
  spe::options opts;
};

std::vector<config> cell_configs() {
  std::vector<config> c;
  spe::options o;
  o.poison_ls = true;
  c.push_back({"default tiles, 1 worker, deferred DMA", o});
  o.tile_bytes = 64;  // forces many panels, tiles and lists on small shapes
  o.chunk_floats = 12;
  o.workers = 3;
  o.min_rows_per_worker = 1;
  c.push_back({"64-byte tiles, 12-float chunks, 3 workers", o});
  o.tile_bytes = 400;
  o.chunk_floats = 40;
  o.workers = 6;
  o.completion = dma::completion::eager;
  c.push_back({"400-byte tiles, 6 workers, eager DMA", o});
  return c;
}

// A build without OpenBLAS (CELLSHARD_BLAS=OFF, the cross builds) has no blas backend.
bool blas_in_build() {
#ifndef CELLSHARD_NO_BLAS
  return true;
#else
  return false;
#endif
}
bool is_blas(const backend* be) { return std::string(be->name) == "blas"; }

struct subject {
  std::string name;
  const backend* be;
  double bound;
  bool exact_elementwise;  // swiglu/rope identical to reference bit for bit
};

// Every backend under every configuration it has.
template <class F>
void for_each_subject(F&& f) {
  test::register_cell_backends();
  const spe::options saved = spe::get_options();
  for (const char* n : {"reference", "blas"}) {
    const backend* be = find_backend(n);
    if (!be && std::string(n) == "blas" && !blas_in_build()) continue;  // cross builds: no OpenBLAS
    REQUIRE(be != nullptr);
    f(subject{n, be, bound_f32, true});
  }
  // native under every instruction-set level this CPU has (portable always).
  const native::isa best = native::best_isa();
  for (native::isa i : native::all_isas) {
    if (!native::set_isa(i)) continue;
    f(subject{std::string("native [") + native::to_string(i) + "]", &native_backend(), bound_f32,
              true});
  }
  native::set_isa(best);
  for (const config& c : cell_configs()) {
    spe::set_options(c.opts);
    f(subject{std::string("spe [") + c.name + "]", &spe_backend(), bound_f32, true});
    f(subject{std::string("spu-host [") + c.name + "]", &spu_host_backend(), bound_spu, false});
  }
  spe::set_options(saved);
}

void expect_close(const subject& s, const std::string& what, const float* got, const float* want,
                  std::size_t n, bool exact) {
  const double e = nmse(got, want, n);
  INFO(s.name << ": " << what << " nmse " << e);
  if (exact)
    CHECK(std::memcmp(got, want, n * sizeof(float)) == 0);
  else
    CHECK(e <= s.bound);
}

}  // namespace

TEST_CASE("matvec f32 conforms on every backend", "[kernels][conformance]") {
  struct shape {
    int rows, cols, ld;
    std::size_t w_off, x_off, out_off;  // bytes past a 128-byte boundary
  };
  const shape shapes[] = {
      {1, 1, 1, 0, 0, 0},         {7, 7, 7, 4, 8, 12},        {33, 33, 33, 12, 4, 4},
      {64, 64, 64, 0, 0, 0},      {32, 64, 64, 28, 0, 0},     {172, 64, 64, 0, 4, 8},
      {64, 172, 172, 4, 0, 8},    {512, 64, 64, 0, 0, 0},     {4097, 33, 35, 8, 4, 4},
      {33, 4097, 4097, 4, 0, 12}, {7, 4097, 5000, 12, 8, 0},  {5, 9001, 9003, 4, 4, 4},
      {1, 4097, 4097, 0, 0, 4},   {2048, 1, 3, 4, 12, 8},
  };
  for_each_subject([&](const subject& s) {
    for (const shape& sh : shapes) {
      test::rng r(1000u + static_cast<uint32_t>(sh.rows * 31 + sh.cols));
      buffer<float> W(static_cast<std::size_t>(sh.rows - 1) * sh.ld + sh.cols, sh.w_off);
      buffer<float> x(sh.cols, sh.x_off), out(sh.rows, sh.out_off);
      test::fill(r, W.data(), W.size());
      for (int i = 0; i + 1 < sh.rows; ++i)  // columns beyond cols: never to be used
        for (int c = sh.cols; c < sh.ld; ++c) W[static_cast<std::size_t>(i) * sh.ld + c] = NAN;
      test::fill(r, x.data(), x.size());
      std::vector<float> want(sh.rows);
      ref::matvec(want.data(), W.data(), x.data(), sh.rows, sh.cols, sh.ld);
      s.be->matvec(out.data(), W.data(), x.data(), sh.rows, sh.cols, sh.ld);
      std::ostringstream what;
      what << "matvec " << sh.rows << "x" << sh.cols << " ld " << sh.ld << " offsets " << sh.w_off
           << "/" << sh.x_off << "/" << sh.out_off;
      expect_close(s, what.str(), out.data(), want.data(), sh.rows, s.be == &reference_backend());
      CHECK(out.intact());
    }
  });
}

TEST_CASE("matvec q8_0 conforms on every backend", "[kernels][conformance]") {
  struct shape {
    int rows, cols;
    std::size_t w_off, x_off, out_off;  // w_off: bytes, even (q8 blocks are 2-aligned)
  };
  const shape shapes[] = {
      {1, 1, 0, 0, 0},      {7, 7, 2, 4, 12},     {33, 33, 34, 0, 4},  {64, 64, 0, 0, 0},
      {172, 64, 6, 4, 8},   {64, 172, 14, 8, 0},  {512, 64, 0, 0, 0},  {4097, 33, 2, 4, 4},
      {33, 4097, 10, 0, 8}, {3, 40000, 4, 4, 4},
  };
  for_each_subject([&](const subject& s) {
    for (const shape& sh : shapes) {
      test::rng r(2000u + static_cast<uint32_t>(sh.rows * 17 + sh.cols));
      const int nb = q8_blocks_per_row(sh.cols);
      std::vector<float> row(sh.cols);
      buffer<q8_block> W(static_cast<std::size_t>(sh.rows) * nb, sh.w_off);
      for (int i = 0; i < sh.rows; ++i) {
        test::fill(r, row.data(), row.size(), -2.0f, 2.0f);
        quantize_row_q8(row.data(), W.data() + static_cast<std::size_t>(i) * nb, sh.cols);
      }
      buffer<float> x(sh.cols, sh.x_off), out(sh.rows, sh.out_off);
      test::fill(r, x.data(), x.size());
      std::vector<float> want(sh.rows);
      ref::matvec_q8(want.data(), W.data(), x.data(), sh.rows, sh.cols);
      s.be->matvec_q8(out.data(), W.data(), x.data(), sh.rows, sh.cols);
      std::ostringstream what;
      what << "matvec_q8 " << sh.rows << "x" << sh.cols << " offsets " << sh.w_off << "/"
           << sh.x_off << "/" << sh.out_off;
      expect_close(s, what.str(), out.data(), want.data(), sh.rows,
                   s.be == &reference_backend() || is_blas(s.be));
      CHECK(out.intact());
    }
  });
}

TEST_CASE("rmsnorm conforms on every backend", "[kernels][conformance]") {
  struct shape {
    int n;
    std::size_t x_off, w_off, out_off;
    bool in_place;
  };
  const shape shapes[] = {{1, 0, 0, 0, false},    {7, 4, 8, 12, false},   {33, 12, 0, 4, false},
                          {64, 0, 0, 0, true},    {172, 4, 4, 4, false},  {4097, 8, 12, 0, false},
                          {20000, 4, 0, 8, true}, {20000, 0, 4, 12, false}};
  for_each_subject([&](const subject& s) {
    for (const shape& sh : shapes) {
      test::rng r(3000u + static_cast<uint32_t>(sh.n));
      buffer<float> x(sh.n, sh.x_off), w(sh.n, sh.w_off), out(sh.n, sh.out_off);
      test::fill(r, x.data(), sh.n, -3.0f, 3.0f);
      test::fill(r, w.data(), sh.n, 0.5f, 1.5f);
      std::vector<float> want(sh.n);
      ref::rmsnorm(want.data(), x.data(), w.data(), sh.n);
      float* o = sh.in_place ? x.data() : out.data();
      s.be->rmsnorm(o, x.data(), w.data(), sh.n);
      std::ostringstream what;
      what << "rmsnorm n " << sh.n << (sh.in_place ? " in place" : "");
      expect_close(s, what.str(), o, want.data(), sh.n, s.be == &reference_backend() ||
                                                            is_blas(s.be));
      CHECK(x.intact());
      CHECK(out.intact());
    }
  });
}

TEST_CASE("rope conforms on every backend", "[kernels][conformance]") {
  struct shape {
    int nq, nk, head_size, pos;
    std::size_t q_off, k_off;
  };
  const shape shapes[] = {{64, 32, 8, 0, 0, 0},     {64, 32, 8, 7, 4, 8},   {64, 32, 8, 511, 12, 4},
                          {8, 8, 8, 3, 0, 0},       {42, 18, 6, 33, 4, 12}, {2, 0, 2, 1, 8, 0},
                          {4098, 2050, 2, 100, 4, 4}, {8200, 4104, 8, 9, 8, 12}};
  for_each_subject([&](const subject& s) {
    for (const shape& sh : shapes) {
      test::rng r(4000u + static_cast<uint32_t>(sh.nq + sh.pos));
      buffer<float> q(sh.nq, sh.q_off), k(std::max(sh.nk, 1), sh.k_off);
      test::fill(r, q.data(), sh.nq);
      test::fill(r, k.data(), sh.nk);
      std::vector<float> wq(q.data(), q.data() + sh.nq), wk(k.data(), k.data() + sh.nk);
      ref::rope(wq.data(), sh.nq, wk.data(), sh.nk, sh.pos, sh.head_size);
      s.be->rope(q.data(), sh.nq, k.data(), sh.nk, sh.pos, sh.head_size);
      std::ostringstream what;
      what << "rope nq " << sh.nq << " nk " << sh.nk << " head " << sh.head_size << " pos "
           << sh.pos;
      expect_close(s, what.str() + " q", q.data(), wq.data(), sh.nq, s.exact_elementwise);
      if (sh.nk > 0)
        expect_close(s, what.str() + " k", k.data(), wk.data(), sh.nk, s.exact_elementwise);
      CHECK(q.intact());
      CHECK(k.intact());
    }
  });
}

// ref::rope_base computes each place's rotation once per call and reuses it
// for every head (session 12); llama2.c computes it for every pair. Same
// expressions, so the same floats: checked bit for bit against the per-pair
// loop written out here, with and without factors and another base, for even
// and odd head sizes and one over the cache (512 places).
TEST_CASE("reference rope equals the per-pair rotation bit for bit", "[kernels][conformance]") {
  struct shape {
    int nq, nk, head_size, pos;
  };
  const shape shapes[] = {{768, 768, 64, 0},  {768, 256, 64, 517}, {64, 32, 8, 3}, {28, 14, 7, 9},
                          {14, 14, 2, 1},     {6, 0, 6, 2},        {4, 6, 8, 5},   {2048, 1024, 1024, 11}};
  for (const shape& sh : shapes) {
    for (int variant = 0; variant < 2; ++variant) {
      test::rng r(4500u + static_cast<uint32_t>(sh.nq + sh.pos + variant));
      std::vector<float> q(sh.nq), k(std::max(sh.nk, 1)), factors(sh.head_size / 2 + 1);
      test::fill(r, q.data(), sh.nq, -2.0f, 2.0f);
      test::fill(r, k.data(), sh.nk, -2.0f, 2.0f);
      for (std::size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + static_cast<float>(i % 5);
      const float base = variant ? 500000.0f : 10000.0f;
      const float* f = variant ? factors.data() : nullptr;
      std::vector<float> wq = q, wk = k;
      for (int i = 0; i < std::max(sh.nq, sh.nk); i += 2) {  // llama2.c's loop
        const int head_dim = i % sh.head_size;
        const float freq = 1.0f / powf(base, head_dim / static_cast<float>(sh.head_size));
        const float val = f ? sh.pos * freq / f[head_dim / 2] : sh.pos * freq;
        const float fcr = cosf(val), fci = sinf(val);
        for (int which = 0; which < 2; ++which) {
          std::vector<float>& v = which ? wk : wq;
          if (i >= (which ? sh.nk : sh.nq)) continue;
          const float v0 = v[i], v1 = v[i + 1];
          v[i] = v0 * fcr - v1 * fci;
          v[i + 1] = v0 * fci + v1 * fcr;
        }
      }
      ref::rope_base(q.data(), sh.nq, k.data(), sh.nk, sh.pos, sh.head_size, base, f);
      INFO("rope nq " << sh.nq << " nk " << sh.nk << " head " << sh.head_size << " pos " << sh.pos
                      << " variant " << variant);
      CHECK(std::memcmp(q.data(), wq.data(), sizeof(float) * sh.nq) == 0);
      CHECK(std::memcmp(k.data(), wk.data(), sizeof(float) * sh.nk) == 0);
    }
  }
}

TEST_CASE("softmax conforms on every backend", "[kernels][conformance]") {
  // Checked against a double-precision oracle: for long inputs reference's
  // running float sum itself drops terms below half an ulp of the partial sum
  // (n 40000: NMSE 1.3e-9 against the oracle), while spe sums in blocks
  // (4e-14). A backend passes if within the bound or no worse than reference.
  const int sizes[] = {1, 7, 33, 172, 512, 4097, 40000};
  for_each_subject([&](const subject& s) {
    for (int n : sizes) {
      for (std::size_t off : {std::size_t{0}, std::size_t{12}}) {
        test::rng r(5000u + static_cast<uint32_t>(n));
        buffer<float> x(n, off);
        test::fill(r, x.data(), n, -8.0f, 8.0f);
        std::vector<float> want(x.data(), x.data() + n), oracle(n);
        ref::softmax(want.data(), n);
        double mx = x[0], sum = 0;
        for (int i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
        std::vector<double> e(n);
        for (int i = 0; i < n; ++i) sum += (e[i] = std::exp(x[i] - mx));
        for (int i = 0; i < n; ++i) oracle[i] = static_cast<float>(e[i] / sum);
        s.be->softmax(x.data(), n);
        const double err = nmse(x.data(), oracle.data(), n);
        const double ref_err = nmse(want.data(), oracle.data(), n);
        INFO(s.name << ": softmax n " << n << " offset " << off << " nmse vs oracle " << err
                    << ", reference's " << ref_err);
        if (s.be == &reference_backend() || is_blas(s.be))
          CHECK(std::memcmp(x.data(), want.data(), n * sizeof(float)) == 0);
        else
          CHECK(err <= std::max(s.bound, ref_err));
        CHECK(x.intact());
      }
    }
  });
}

TEST_CASE("swiglu conforms on every backend", "[kernels][conformance]") {
  const int sizes[] = {1, 7, 33, 172, 4097, 20000};
  for_each_subject([&](const subject& s) {
    for (int n : sizes) {
      test::rng r(6000u + static_cast<uint32_t>(n));
      buffer<float> hb(n, 4), hb2(n, 8);
      test::fill(r, hb.data(), n, -6.0f, 6.0f);
      test::fill(r, hb2.data(), n);
      std::vector<float> want(hb.data(), hb.data() + n);
      ref::swiglu(want.data(), hb2.data(), n);
      s.be->swiglu(hb.data(), hb2.data(), n);
      std::ostringstream what;
      what << "swiglu n " << n;
      expect_close(s, what.str(), hb.data(), want.data(), n, s.exact_elementwise);
      CHECK(hb.intact());
    }
  });
}

TEST_CASE("attention over a KV cache conforms on every backend", "[kernels][conformance]") {
  struct shape {
    int n_heads, kv_mul, head_size, kv_stride, pos;
    std::size_t cache_off;
  };
  const shape shapes[] = {
      {8, 2, 8, 32, 0, 0},   {8, 2, 8, 32, 6, 4},    {8, 2, 8, 32, 511, 0},  // stories260K
      {3, 1, 6, 18, 33, 8},  {3, 1, 6, 19, 40, 4},   {2, 2, 7, 7, 40, 12},
      {4, 4, 33, 33, 5, 0},  {1, 1, 172, 172, 100, 4}, {2, 1, 8, 16, 4096, 0},
  };
  for_each_subject([&](const subject& s) {
    for (const shape& sh : shapes) {
      test::rng r(7000u + static_cast<uint32_t>(sh.pos * 7 + sh.head_size));
      const std::size_t T = static_cast<std::size_t>(sh.pos) + 1;
      const std::size_t qn = static_cast<std::size_t>(sh.n_heads) * sh.head_size;
      buffer<float> q(qn, 4), kc(T * sh.kv_stride, sh.cache_off), vc(T * sh.kv_stride, sh.cache_off);
      buffer<float> att(sh.n_heads * T, 8), out(qn, 12);
      test::fill(r, q.data(), qn, -2.0f, 2.0f);
      test::fill(r, kc.data(), kc.size(), -2.0f, 2.0f);
      test::fill(r, vc.data(), vc.size());
      const int kv_width = sh.n_heads / sh.kv_mul * sh.head_size;
      for (std::size_t t = 0; t < T; ++t)  // cache columns of no kv head: never to be used
        for (int c = kv_width; c < sh.kv_stride; ++c) kc[t * sh.kv_stride + c] = vc[t * sh.kv_stride + c] = NAN;
      std::vector<float> want(qn), want_att(sh.n_heads * T);
      ref::attention(want.data(), q.data(), kc.data(), vc.data(), want_att.data(), sh.n_heads,
                     sh.kv_mul, sh.head_size, sh.kv_stride, sh.pos);
      s.be->attention(out.data(), q.data(), kc.data(), vc.data(), att.data(), sh.n_heads,
                      sh.kv_mul, sh.head_size, sh.kv_stride, sh.pos);
      std::ostringstream what;
      what << "attention heads " << sh.n_heads << " kv_mul " << sh.kv_mul << " head "
           << sh.head_size << " stride " << sh.kv_stride << " pos " << sh.pos;
      const bool exact = s.be == &reference_backend() || is_blas(s.be);
      expect_close(s, what.str() + " out", out.data(), want.data(), qn, exact);
      expect_close(s, what.str() + " att", att.data(), want_att.data(), want_att.size(), exact);
      CHECK(out.intact());
      CHECK(att.intact());
    }
  });
}

TEST_CASE("spe results do not depend on the worker count", "[kernels][spe]") {
  const spe::options saved = spe::get_options();
  test::rng r(42);
  const int rows = 1001, cols = 333, ld = 334;
  buffer<float> W(static_cast<std::size_t>(rows) * ld, 4), x(cols, 8);
  test::fill(r, W.data(), W.size());
  test::fill(r, x.data(), cols);
  std::vector<q8_block> Wq(static_cast<std::size_t>(rows) * q8_blocks_per_row(cols));
  for (int i = 0; i < rows; ++i)
    quantize_row_q8(W.data() + static_cast<std::size_t>(i) * ld,
                    Wq.data() + static_cast<std::size_t>(i) * q8_blocks_per_row(cols), cols);
  std::vector<float> kc(65 * 40), vc(65 * 40), q(10 * 8);
  test::fill(r, kc.data(), kc.size());
  test::fill(r, vc.data(), vc.size());
  test::fill(r, q.data(), q.size());
  std::vector<std::vector<float>> results;
  for (int workers : {1, 2, 3, 6, 16}) {
    spe::options o;
    o.workers = workers;
    o.min_rows_per_worker = 1;
    spe::set_options(o);
    std::vector<float> a(rows), b(rows), att(10 * 65), out(10 * 8);
    REQUIRE(spe::matvec(a.data(), W.data(), x.data(), rows, cols, ld));
    REQUIRE(spe::matvec_q8(b.data(), Wq.data(), x.data(), rows, cols));
    REQUIRE(spe::attention(out.data(), q.data(), kc.data(), vc.data(), att.data(), 10, 2, 8, 40, 64));
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), out.begin(), out.end());
    results.push_back(a);
  }
  for (std::size_t i = 1; i < results.size(); ++i) CHECK(results[i] == results[0]);
  spe::set_options(saved);
}

TEST_CASE("spe counts its DMA traffic", "[kernels][spe]") {
  const spe::options saved = spe::get_options();
  spe::set_options(spe::options{});
  const int rows = 256, cols = 4096;  // aligned: one 16 KiB line per row
  std::vector<float> W(static_cast<std::size_t>(rows) * cols, 0.5f), x(cols, 2.0f), out(rows);
  spe::reset_stats();
  REQUIRE(spe::matvec(out.data(), W.data(), x.data(), rows, cols, cols));
  for (float v : out) CHECK(v == 4096.0f);
  const spe::stats st = spe::get_stats();
  CHECK(st.kernel_calls == 1);
  CHECK(st.errors == 0);
  // weights + x + the 128-byte job block in; out + 16 status bytes back
  const std::size_t wbytes = W.size() * sizeof(float);
  const bool aligned = reinterpret_cast<uintptr_t>(W.data()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(out.data()) % 16 == 0;
  if (aligned) {
    CHECK(st.dma.bytes_get == wbytes + cols * sizeof(float) + SPU_JOB_BYTES);
    CHECK(st.dma.bytes_put == rows * sizeof(float) + 16);
    CHECK(st.dma.list_commands == 128);  // two 16 KiB rows per 32 KiB tile, one list each
  }
  CHECK(st.ls_high_water <= dma::ls_data_size);
  CHECK(st.ls_high_water > 64 * 1024);  // two 32 KiB tiles at least
  spe::set_options(saved);
}

TEST_CASE("a shape beyond the local store is an error value, outputs NaN", "[kernels][spe]") {
  const spe::options saved = spe::get_options();
  spe::options o;
  spe::set_options(o);
  // Attention keeps pos+1 scores in the LS: 60000 positions do not fit.
  const int pos = 59999, hs = 8, stride = 8;
  std::vector<float> kc(static_cast<std::size_t>(pos + 1) * stride, 0.1f), vc(kc), q(hs, 1.0f);
  std::vector<float> att(pos + 1), out(hs, 0.0f);
  const spe::status st =
      spe::attention(out.data(), q.data(), kc.data(), vc.data(), att.data(), 1, 1, hs, stride, pos);
  CHECK_FALSE(st.ok());
  CHECK(st.spu == SPU_ERR_LS_BUDGET);
  CHECK(st.ls_need > dma::ls_data_size);
  CHECK(st.message.find("local store") != std::string::npos);
  const uint64_t errors = spe::get_stats().errors;
  spe_backend().attention(out.data(), q.data(), kc.data(), vc.data(), att.data(), 1, 1, hs,
                          stride, pos);
  for (float v : out) CHECK(std::isnan(v));
  CHECK(spe::get_stats().errors == errors + 1);
  CHECK(spe::last_error().find("attention") != std::string::npos);

  // A head too long for one row of K in a tile.
  std::vector<float> big(9000 * 2, 0.5f), att2(2), out2(9000);
  const spe::status st2 = spe::attention(out2.data(), big.data(), big.data(), big.data(),
                                         att2.data(), 1, 1, 9000, 9000, 1);
  CHECK(st2.spu == SPU_ERR_LS_BUDGET);
  spe::set_options(saved);
}

TEST_CASE("spe kernels are re-entrant across threads sharing the pool", "[kernels][spe]") {
  // Several threads (as tensor-parallel shards in one process would) call spe
  // at once; the pool serves one call, the others run their jobs on their own
  // threads. Every result must equal the single-threaded one bit for bit.
  const spe::options saved = spe::get_options();
  spe::options o;
  o.workers = 3;
  o.min_rows_per_worker = 4;
  spe::set_options(o);
  const int rows = 300, cols = 77;
  test::rng r(11);
  std::vector<float> W(static_cast<std::size_t>(rows) * cols), x(cols), want(rows);
  test::fill(r, W.data(), W.size());
  test::fill(r, x.data(), cols);
  REQUIRE(spe::matvec(want.data(), W.data(), x.data(), rows, cols, cols));
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      std::vector<float> out(rows);
      for (int i = 0; i < 50; ++i) {
        if (!spe::matvec(out.data(), W.data(), x.data(), rows, cols, cols)) ++failures;
        if (out != want) ++mismatches;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(failures == 0);
  CHECK(mismatches == 0);
  spe::set_options(saved);
}
