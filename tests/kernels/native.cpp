// The native backend beyond the shared conformance test: q4_0 weights and the
// ggml precision against oracles computed in double from the dequantized
// blocks, q4_0 quantization against its definition, and the thread pool
// (every index once; results identical for 1, 2 and 3 threads).
#include "kernels/native.hpp"
#include "kernels/pool.hpp"
#include "kernels/reference.hpp"
#include "kernels/types.hpp"
#include "tests/kernels/common.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

using namespace cellshard;
using namespace cellshard::kernels;
using cellshard::test::buffer;
using cellshard::test::nmse;

namespace {

std::vector<native::isa> levels() {
  std::vector<native::isa> v;
  const native::isa best = native::best_isa();
  for (native::isa i : native::all_isas)
    if (native::set_isa(i)) v.push_back(i);
  native::set_isa(best);
  return v;
}

struct restore {
  native::isa i = native::active_isa();
  native::precision p = native::active_precision();
  ~restore() {
    native::set_isa(i);
    native::set_precision(p);
  }
};

// q8 blocks of a seeded [rows x cols] matrix and the same as q4 blocks.
struct quant_matrix {
  int rows, cols, nb;
  std::vector<q8_block> q8;
  std::vector<q4_block> q4;
  quant_matrix(int r, int c, uint32_t seed) : rows(r), cols(c), nb(q8_blocks_per_row(c)) {
    test::rng g(seed);
    std::vector<float> row(c);
    q8.resize(static_cast<std::size_t>(r) * nb);
    q4.resize(static_cast<std::size_t>(r) * nb);
    for (int i = 0; i < r; ++i) {
      test::fill(g, row.data(), c, -2.0f, 2.0f);
      quantize_row_q8(row.data(), &q8[static_cast<std::size_t>(i) * nb], c);
      quantize_row_q4(row.data(), &q4[static_cast<std::size_t>(i) * nb], c);
    }
  }
};

// Oracle for exact precision: the dequantized row times x, in double.
template <class B, class D>
std::vector<float> oracle_exact(const std::vector<B>& W, const float* x, int rows, int cols, D deq) {
  const int nb = q8_blocks_per_row(cols);
  std::vector<float> row(cols), out(rows);
  for (int r = 0; r < rows; ++r) {
    deq(&W[static_cast<std::size_t>(r) * nb], row.data(), cols);
    double s = 0;
    for (int c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * x[c];
    out[r] = static_cast<float>(s);
  }
  return out;
}

// Oracle for ggml precision: x rounded to q8 blocks first, then the same.
template <class B, class D>
std::vector<float> oracle_ggml(const std::vector<B>& W, const float* x, int rows, int cols, D deq) {
  std::vector<q8_block> xq(q8_blocks_per_row(cols));
  native::quantize_activations_q8(x, xq.data(), cols);
  std::vector<float> xr(cols);
  dequantize_row_q8(xq.data(), xr.data(), cols);
  return oracle_exact(W, xr.data(), rows, cols, deq);
}

const int shapes[][2] = {{1, 1}, {7, 7}, {33, 33}, {5, 64}, {64, 172}, {4097, 33}, {33, 4097},
                         {3, 9001}};

}  // namespace

TEST_CASE("native q4_0 and q8_0 matvecs match dequantized oracles in both precisions",
          "[kernels][native]") {
  restore saved;
  for (native::isa lv : levels()) {
    REQUIRE(native::set_isa(lv));
    for (auto sh : shapes) {
      const int rows = sh[0], cols = sh[1];
      const quant_matrix m(rows, cols, 500u + rows * 7 + cols);
      test::rng g(77u + cols);
      buffer<float> x(cols, 4), out(rows, 8);
      test::fill(g, x.data(), cols);
      const auto want8 = oracle_exact(m.q8, x.data(), rows, cols, dequantize_row_q8);
      const auto want4 = oracle_exact(m.q4, x.data(), rows, cols, dequantize_row_q4);
      const auto want8g = oracle_ggml(m.q8, x.data(), rows, cols, dequantize_row_q8);
      const auto want4g = oracle_ggml(m.q4, x.data(), rows, cols, dequantize_row_q4);
      std::ostringstream what;
      what << native::to_string(lv) << " " << rows << "x" << cols;
      INFO(what.str());
      for (native::precision p : {native::precision::exact, native::precision::ggml}) {
        native::set_precision(p);
        const bool exact = p == native::precision::exact;
        INFO(native::to_string(p));
        native::matvec_q8(out.data(), m.q8.data(), x.data(), rows, cols);
        CHECK(nmse(out.data(), (exact ? want8 : want8g).data(), rows) <= 1e-10);
        CHECK(out.intact());
        native_backend().matvec_q4(out.data(), m.q4.data(), x.data(), rows, cols);
        CHECK(nmse(out.data(), (exact ? want4 : want4g).data(), rows) <= 1e-10);
        CHECK(out.intact());
        if (exact) {  // and the reference loop the other backends use
          ref::matvec_q4(out.data(), m.q4.data(), x.data(), rows, cols);
          CHECK(nmse(out.data(), want4.data(), rows) <= 1e-10);
        }
        // ggml's rounded activations are visibly different from exact but close.
        if (!exact && cols >= 64) {
          const double e = nmse(out.data(), want4.data(), rows);
          CHECK(e > 0);
          CHECK(e < 1e-3);
        }
      }
    }
  }
}

TEST_CASE("activation quantization (ggml precision) is the same at every level, bit for bit",
          "[kernels][native]") {
  restore saved;
  for (int cols : {1, 7, 16, 17, 32, 33, 100, 768, 4097}) {
    test::rng g(900u + cols);
    std::vector<float> x(cols);
    test::fill(g, x.data(), cols, -3.0f, 3.0f);
    if (cols > 40) x[37] = 0.0f;  // and a block of zeros (amax 0: d 0, q 0)
    if (cols >= 768) std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    const int nb = q8_blocks_per_row(cols);
    REQUIRE(native::set_isa(native::isa::portable));
    std::vector<q8_block> want(nb), got(nb);
    native::quantize_activations_q8(x.data(), want.data(), cols);
    // The rule itself on one block: d = amax/127 as f16, q = round(x*127/amax).
    float amax = 0;
    for (int i = 0; i < std::min(32, cols); ++i) amax = std::max(amax, std::fabs(x[i]));
    CHECK(want[0].d == fp32_to_fp16(amax / 127.0f));
    CHECK(want[0].qs[0] == static_cast<int8_t>(std::nearbyint(x[0] * (127.0f / amax))));
    for (native::isa lv : levels()) {
      REQUIRE(native::set_isa(lv));
      INFO(native::to_string(lv) << " cols " << cols);
      std::memset(got.data(), 0x55, nb * sizeof(q8_block));
      native::quantize_activations_q8(x.data(), got.data(), cols);
      CHECK(std::memcmp(got.data(), want.data(), nb * sizeof(q8_block)) == 0);
    }
  }
}

TEST_CASE("q4_0 quantization follows ggml's reference rule", "[kernels][native]") {
  // A block whose largest-magnitude value is -4: d = -4 / -8 = 0.5, and
  // values k*0.5 for k in [-8, 7] round-trip exactly.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = 0.5f * static_cast<float>((i % 16) - 8);
  x[3] = -4.0f;
  q4_block b;
  quantize_row_q4(x.data(), &b, 32);
  CHECK(fp16_to_fp32(b.d) == 0.5f);
  std::vector<float> back(32);
  dequantize_row_q4(&b, back.data(), 32);
  CHECK(back == x);
  // Largest magnitude positive (8): d = -1, so +8 maps to q 0 and -7 to 15.
  std::vector<float> y(32, 0.0f);
  y[0] = 8.0f;
  y[20] = -7.0f;
  quantize_row_q4(y.data(), &b, 32);
  CHECK(fp16_to_fp32(b.d) == -1.0f);
  CHECK((b.qs[0] & 0x0f) == 0);
  CHECK((b.qs[4] >> 4) == 15);
  CHECK((b.qs[1] & 0x0f) == 8);  // zero
  // A partial block is padded with zeros (q = 8).
  std::vector<float> z = {1.0f, -1.0f, 0.25f};
  quantize_row_q4(z.data(), &b, 3);
  for (int j = 3; j < 16; ++j) CHECK((b.qs[j] & 0x0f) == 8);
  for (int j = 0; j < 16; ++j) CHECK((b.qs[j] >> 4) == 8);
}

TEST_CASE("activations are quantized as ggml's CPU backend does", "[kernels][native]") {
  // max |x| = 127: the scale is 1 and q = x rounded half to even.
  std::vector<float> x = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.49f, -126.6f};
  std::vector<q8_block> q(1);
  native::quantize_activations_q8(x.data(), q.data(), static_cast<int>(x.size()));
  CHECK(fp16_to_fp32(q[0].d) == 1.0f);
  const int want[] = {127, 2, 4, -2, -4, 0, -127};
  for (int i = 0; i < 7; ++i) CHECK(q[0].qs[i] == want[i]);
  for (int i = 7; i < 32; ++i) CHECK(q[0].qs[i] == 0);  // padding
  // An all-zero block: scale 0, all q 0.
  std::vector<float> z(40, 0.0f);
  std::vector<q8_block> qz(2);
  native::quantize_activations_q8(z.data(), qz.data(), 40);
  CHECK(qz[1].d == 0);
  CHECK(qz[1].qs[3] == 0);
}

TEST_CASE("pool::parallel_for runs every index exactly once", "[kernels][pool]") {
  for (int threads : {1, 2, 3, 5}) {
    pool p(threads, 0);
    CHECK(p.threads() == threads);
    for (int n : {0, 1, 7, 64, 1000, 4097}) {
      for (int chunk : {1, 4, 33, 5000}) {
        std::vector<std::atomic<int>> hits(n > 0 ? n : 1);
        for (auto& h : hits) h = 0;
        auto f = [&](int b, int e) {
          for (int i = b; i < e; ++i) ++hits[i];
        };
        for (int rep = 0; rep < 3; ++rep) p.parallel_for(n, chunk, f);
        int bad = 0;
        for (int i = 0; i < n; ++i) bad += hits[i] != 3;
        INFO("threads " << threads << " n " << n << " chunk " << chunk);
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("a parallel_for inside a chunk runs serially on that thread", "[kernels][pool]") {
  pool p(3, 0);
  std::atomic<int> total{0};
  auto outer = [&](int b, int e) {
    for (int i = b; i < e; ++i) {
      auto inner = [&](int ib, int ie) { total += ie - ib; };
      p.parallel_for(10, 3, inner);
    }
  };
  p.parallel_for(20, 2, outer);
  CHECK(total == 200);
}

TEST_CASE("native matvecs give identical bits for 1, 2 and 3 threads", "[kernels][pool][native]") {
  restore saved;
  const int rows = 1001, cols = 777, ld = 780;
  test::rng g(9);
  std::vector<float> W(static_cast<std::size_t>(rows) * ld), x(cols);
  test::fill(g, W.data(), W.size());
  test::fill(g, x.data(), cols);
  const quant_matrix m(rows, cols, 31);
  for (native::isa lv : levels()) {
    REQUIRE(native::set_isa(lv));
    for (native::precision pr : {native::precision::exact, native::precision::ggml}) {
      native::set_precision(pr);
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        pool p(threads, 0);
        pool::scope use(&p);
        REQUIRE(pool::current() == &p);
        std::vector<float> a(rows), b(rows), c(rows);
        native_backend().matvec(a.data(), W.data(), x.data(), rows, cols, ld);
        native_backend().matvec_q8(b.data(), m.q8.data(), x.data(), rows, cols);
        native::matvec_q4(c.data(), m.q4.data(), x.data(), rows, cols);
        a.insert(a.end(), b.begin(), b.end());
        a.insert(a.end(), c.begin(), c.end());
        results.push_back(a);
      }
      INFO(native::to_string(lv) << " " << native::to_string(pr));
      CHECK(results[1] == results[0]);
      CHECK(results[2] == results[0]);
    }
  }
  CHECK(pool::current() == nullptr);
}

// Prefill in chunks (issue #18) relies on this: a batched product returns, for
// every input vector, exactly the bits of the matvec of that vector -- on
// every level, both precisions, f32 rows at every misalignment, quantized
// rows with partial last blocks, n not a multiple of the 3 or 4 vectors the
// AVX2/AVX-512 kernels take per pass, with and without a pool.
TEST_CASE("native batched products equal matvec bit for bit", "[kernels][native][prefill]") {
  restore saved;
  pool two(2, 0);
  const int bshapes[][2] = {{1, 1}, {7, 7}, {33, 33}, {64, 172}, {37, 288}, {300, 768}, {5, 2051}};
  for (native::isa lv : levels()) {
    REQUIRE(native::set_isa(lv));
    for (auto sh : bshapes) {
      for (int n : {1, 2, 3, 4, 5, 9}) {
        for (pool* p : {static_cast<pool*>(nullptr), &two}) {
          pool::scope use(p);
          const int rows = sh[0], cols = sh[1], ld = cols + 3, ldx = cols + 1, ldo = rows + 2;
          test::rng g(9u + rows + cols * 3 + n);
          buffer<float> W(static_cast<std::size_t>(rows) * ld, 4 * (rows % 8));
          buffer<float> X(static_cast<std::size_t>(n) * ldx, 12);
          test::fill(g, W.data(), rows * ld);
          test::fill(g, X.data(), n * ldx);
          const quant_matrix m(rows, cols, 31u + rows + cols);
          INFO(native::to_string(lv) << " " << rows << "x" << cols << " n " << n
                                     << (p ? " pool 2" : ""));
          std::vector<float> got(static_cast<std::size_t>(n) * ldo, -7.0f), want(rows);
          // f32
          native::matmul_f32(got.data(), ldo, W.data(), X.data(), ldx, n, rows, cols, ld);
          for (int j = 0; j < n; ++j) {
            native::matvec_f32(want.data(), W.data(), X.data() + j * ldx, rows, cols, ld);
            CHECK(std::memcmp(got.data() + j * ldo, want.data(), rows * sizeof(float)) == 0);
            CHECK(got[j * ldo + rows] == -7.0f);  // ldo padding untouched
          }
          for (native::precision pr : {native::precision::exact, native::precision::ggml}) {
            native::set_precision(pr);
            INFO(native::to_string(pr));
            native::matmul_q8(got.data(), ldo, m.q8.data(), X.data(), ldx, n, rows, cols);
            for (int j = 0; j < n; ++j) {
              native::matvec_q8(want.data(), m.q8.data(), X.data() + j * ldx, rows, cols);
              CHECK(std::memcmp(got.data() + j * ldo, want.data(), rows * sizeof(float)) == 0);
            }
            native::matmul_q4(got.data(), ldo, m.q4.data(), X.data(), ldx, n, rows, cols);
            for (int j = 0; j < n; ++j) {
              native::matvec_q4(want.data(), m.q4.data(), X.data() + j * ldx, rows, cols);
              CHECK(std::memcmp(got.data() + j * ldo, want.data(), rows * sizeof(float)) == 0);
            }
          }
          native::set_precision(native::precision::exact);
          // typed slot: q8_0 in both modes, and a type without its own
          // kernel here (f16, through the tiled fallback).
          const std::size_t s8 = q8_blocks_per_row(cols) * sizeof(q8_block);
          for (matmul_mode mode : {matmul_mode::exact, matmul_mode::ggml}) {
            native::matmul_typed(got.data(), ldo, m.q8.data(), dtype::q8_0, s8, X.data(), ldx, n, rows,
                                 cols, mode);
            for (int j = 0; j < n; ++j) {
              native::matvec_typed(want.data(), m.q8.data(), dtype::q8_0, s8, X.data() + j * ldx, rows,
                                   cols, mode);
              CHECK(std::memcmp(got.data() + j * ldo, want.data(), rows * sizeof(float)) == 0);
            }
          }
          std::vector<uint16_t> h(static_cast<std::size_t>(rows) * cols);
          for (std::size_t i = 0; i < h.size(); ++i) h[i] = fp32_to_fp16(g.uniform());
          native::matmul_typed(got.data(), ldo, h.data(), dtype::f16, cols * 2, X.data(), ldx, n, rows,
                               cols, matmul_mode::exact);
          for (int j = 0; j < n; ++j) {
            native::matvec_typed(want.data(), h.data(), dtype::f16, cols * 2, X.data() + j * ldx, rows,
                                 cols, matmul_mode::exact);
            CHECK(std::memcmp(got.data() + j * ldo, want.data(), rows * sizeof(float)) == 0);
            // and the f16 kernel itself (tails of 1..7 columns here) against
            // the reference loop
            std::vector<float> r16(rows);
            ref::matvec_typed(r16.data(), h.data(), dtype::f16, cols * 2, X.data() + j * ldx, rows, cols,
                              matmul_mode::exact);
            CHECK(nmse(want.data(), r16.data(), rows) <= 1e-10);
          }
        }
      }
    }
  }
}

// The AVX2 and AVX-512 quantized kernels pass 4 rows at a time sharing the
// loads of x; a row's result must not depend on that: every row of a
// matrix computed in one call equals the same row computed alone (which
// takes the one-row path), bit for bit, at every level and in both
// precisions, for row counts that leave 1..3 rows after the groups of 4.
TEST_CASE("native quantized rows give the same bits in groups of 4 as alone", "[kernels][native]") {
  restore saved;
  for (native::isa lv : levels()) {
    REQUIRE(native::set_isa(lv));
    // 16001 columns: x_q over 16 KiB, where AVX2 groups rows in ggml precision too.
    for (auto sh : {std::pair<int, int>{9, 33}, {6, 768}, {7, 2051}, {11, 4097}, {6, 16001}}) {
      const int rows = sh.first, cols = sh.second;
      const quant_matrix m(rows, cols, 77u + rows + cols);
      test::rng g(5u + cols);
      std::vector<float> x(cols);
      test::fill(g, x.data(), cols);
      std::vector<q8_block> xq(q8_blocks_per_row(cols));
      native::quantize_activations_q8(x.data(), xq.data(), cols);
      INFO(native::to_string(lv) << " " << rows << "x" << cols);
      std::vector<float> all(rows), one(rows);
      native::matvec_q8_rows(all.data(), m.q8.data(), x.data(), 0, rows, cols);
      for (int r = 0; r < rows; ++r) native::matvec_q8_rows(one.data(), m.q8.data(), x.data(), r, r + 1, cols);
      CHECK(std::memcmp(all.data(), one.data(), rows * sizeof(float)) == 0);
      native::matvec_q4_rows(all.data(), m.q4.data(), x.data(), 0, rows, cols);
      for (int r = 0; r < rows; ++r) native::matvec_q4_rows(one.data(), m.q4.data(), x.data(), r, r + 1, cols);
      CHECK(std::memcmp(all.data(), one.data(), rows * sizeof(float)) == 0);
      native::matvec_q8_q8_rows(all.data(), m.q8.data(), xq.data(), 0, rows, cols);
      for (int r = 0; r < rows; ++r) native::matvec_q8_q8_rows(one.data(), m.q8.data(), xq.data(), r, r + 1, cols);
      CHECK(std::memcmp(all.data(), one.data(), rows * sizeof(float)) == 0);
      native::matvec_q4_q8_rows(all.data(), m.q4.data(), xq.data(), 0, rows, cols);
      for (int r = 0; r < rows; ++r) native::matvec_q4_q8_rows(one.data(), m.q4.data(), xq.data(), r, r + 1, cols);
      CHECK(std::memcmp(all.data(), one.data(), rows * sizeof(float)) == 0);
    }
  }
}

// At the avx512 levels q4_0 exact takes rows 5 at a time when the rows of a
// call hold at least 16 MiB (kernels/native.cpp, q4_stream5_bytes), 4 at a
// time below: 1866 rows of 16001 columns (16.0 MiB + 1 row; 373 passes of 5
// and a lone row, partial last block) give the bits of each row alone and of
// passes of 4.
TEST_CASE("native q4_0 exact rows give the same bits in passes of 5 as alone", "[kernels][native]") {
  restore saved;
  const int rows = 1866, cols = 16001;
  REQUIRE(static_cast<std::size_t>(rows - 1) * q8_blocks_per_row(cols) * sizeof(q4_block) >= (std::size_t{16} << 20));
  const quant_matrix m(rows, cols, 4242u);
  test::rng g(31);
  std::vector<float> x(cols);
  test::fill(g, x.data(), cols);
  for (native::isa lv : levels()) {
    REQUIRE(native::set_isa(lv));
    INFO(native::to_string(lv));
    std::vector<float> all(rows), one(rows), four(rows);
    native::matvec_q4_rows(all.data(), m.q4.data(), x.data(), 0, rows, cols);
    for (int r = 0; r < rows; ++r) native::matvec_q4_rows(one.data(), m.q4.data(), x.data(), r, r + 1, cols);
    for (int r = 0; r < rows; r += 4)
      native::matvec_q4_rows(four.data(), m.q4.data(), x.data(), r, std::min(rows, r + 4), cols);
    CHECK(std::memcmp(all.data(), one.data(), rows * sizeof(float)) == 0);
    CHECK(std::memcmp(all.data(), four.data(), rows * sizeof(float)) == 0);
  }
}

namespace {

// The AVX-512 level's dot product as scalar code: lane l of two 16-lane
// accumulators (s0: the first 16 columns of each 32-column step and a last
// lone 16-column step, s1: the second 16 and the masked tail; every product
// a fused multiply-add), then the horizontal sum in hsum512's order (+ the
// other 256 bits, + the neighbouring 128 bits, lanes 0+2 and 1+3, then those).
float dot_avx512_model(const float* a, const float* b, int n) {
  float s0[16] = {}, s1[16] = {};
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 16; ++l) {
      s0[l] = std::fma(a[i + l], b[i + l], s0[l]);
      s1[l] = std::fma(a[i + 16 + l], b[i + 16 + l], s1[l]);
    }
  if (i + 16 <= n) {
    for (int l = 0; l < 16; ++l) s0[l] = std::fma(a[i + l], b[i + l], s0[l]);
    i += 16;
  }
  if (i < n)
    for (int l = 0; l < 16; ++l) s1[l] = i + l < n ? std::fma(a[i + l], b[i + l], s1[l]) : std::fma(0.0f, 0.0f, s1[l]);
  float v[16], w[16];
  for (int l = 0; l < 16; ++l) v[l] = s0[l] + s1[l];
  for (int l = 0; l < 16; ++l) w[l] = v[l] + v[l ^ 8];
  for (int l = 0; l < 16; ++l) v[l] = w[l] + w[l ^ 4];
  return (v[0] + v[2]) + (v[1] + v[3]);
}

}  // namespace

// native::attention at the AVX-512 levels (session 12: q and the head's output
// held in registers for head sizes up to 128, the dot/axpy calls per position
// beyond) against that order written as scalar code: scores = the level's dot
// product / sqrt(head_size), reference softmax, then out = fma(a_t, v_t, out)
// per element in position order from +0. Bit for bit.
TEST_CASE("native attention at avx512 is its documented operation order bit for bit", "[kernels][native]") {
  restore saved;
  struct shape {
    int n_heads, kv_mul, head_size, pos;
  };
  const shape shapes[] = {{12, 1, 64, 0}, {12, 1, 64, 70},  {4, 2, 48, 33}, {3, 1, 7, 9},   {2, 1, 128, 40},
                          {2, 1, 100, 17}, {2, 2, 33, 5},   {1, 1, 16, 3},  {2, 1, 172, 12}, {1, 1, 257, 4}};
  bool ran = false;
  for (native::isa lv : levels()) {
    if (lv != native::isa::avx512 && lv != native::isa::avx512vnni) continue;
    REQUIRE(native::set_isa(lv));
    ran = true;
    for (const shape& sh : shapes) {
      test::rng g(8100u + static_cast<uint32_t>(sh.head_size * 31 + sh.pos));
      const int kv_stride = sh.n_heads / sh.kv_mul * sh.head_size + 3;  // a gap after the kv heads
      const std::size_t T = static_cast<std::size_t>(sh.pos) + 1;
      const std::size_t qn = static_cast<std::size_t>(sh.n_heads) * sh.head_size;
      std::vector<float> q(qn), kc(T * kv_stride), vc(T * kv_stride);
      test::fill(g, q.data(), qn, -2.0f, 2.0f);
      test::fill(g, kc.data(), kc.size(), -2.0f, 2.0f);
      test::fill(g, vc.data(), vc.size());
      std::vector<float> out(qn), att(sh.n_heads * T), want(qn), want_att(sh.n_heads * T);
      native::attention(out.data(), q.data(), kc.data(), vc.data(), att.data(), sh.n_heads, sh.kv_mul, sh.head_size,
                        kv_stride, sh.pos);
      const float scale = sqrtf(static_cast<float>(sh.head_size));
      for (int h = 0; h < sh.n_heads; ++h) {
        const int kvo = (h / sh.kv_mul) * sh.head_size;
        float* a = &want_att[static_cast<std::size_t>(h) * T];
        for (std::size_t t = 0; t < T; ++t)
          a[t] = dot_avx512_model(&q[static_cast<std::size_t>(h) * sh.head_size], &kc[t * kv_stride + kvo],
                                  sh.head_size) /
                 scale;
        ref::softmax(a, static_cast<int>(T));
        float* o = &want[static_cast<std::size_t>(h) * sh.head_size];
        for (std::size_t t = 0; t < T; ++t)
          for (int i = 0; i < sh.head_size; ++i) o[i] = std::fma(a[t], vc[t * kv_stride + kvo + i], o[i]);
      }
      INFO(native::to_string(lv) << " heads " << sh.n_heads << " kv_mul " << sh.kv_mul << " head " << sh.head_size
                                 << " pos " << sh.pos);
      CHECK(std::memcmp(att.data(), want_att.data(), sizeof(float) * att.size()) == 0);
      CHECK(std::memcmp(out.data(), want.data(), sizeof(float) * qn) == 0);
    }
  }
  if (!ran) WARN("no AVX-512 level on this CPU: attention order not checked");
}
