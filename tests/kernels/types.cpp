// Weight types: dequantization of each ggml block layout against blocks packed
// here from the layout's description (independent of the dequantizer's loops),
// quantizers' round trips, byte swapping, and the typed matvec of every
// backend in both matmul modes against reference and against double math.
#include "kernels/backend.hpp"
#include "kernels/native.hpp"
#include "kernels/reference.hpp"
#include "kernels/spe.hpp"
#include "kernels/types.hpp"
#include "tests/kernels/common.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <iterator>
#include <vector>

using namespace cellshard;
using namespace cellshard::kernels;

namespace {

// q4_K: pack 8 (scale, min) pairs of 6 bits and 256 4-bit values.
block_q4_k pack_q4_k(float d, float dmin, const int sc[8], const int m[8], const int q[256]) {
  block_q4_k b{};
  b.d = fp32_to_fp16(d);
  b.dmin = fp32_to_fp16(dmin);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
  for (int e = 0; e < 256; ++e) {
    const int sb = e / 32, l = e % 32;
    uint8_t& byte = b.qs[32 * (sb / 2) + l];
    byte = static_cast<uint8_t>(sb % 2 ? (byte & 0x0F) | (q[e] << 4) : (byte & 0xF0) | q[e]);
  }
  return b;
}

// q6_K: 256 6-bit values (0..63, stored with +32 bias) and 16 int8 scales.
block_q6_k pack_q6_k(float d, const int8_t sc[16], const int q[256]) {
  block_q6_k b{};
  b.d = fp32_to_fp16(d);
  std::memcpy(b.scales, sc, 16);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128, quad = r / 32, l = r % 32;
    const int v = q[e];
    uint8_t& lo = b.ql[64 * h + l + (quad % 2) * 32];
    lo = static_cast<uint8_t>(quad < 2 ? (lo & 0xF0) | (v & 0xF) : (lo & 0x0F) | ((v & 0xF) << 4));
    b.qh[32 * h + l] |= static_cast<uint8_t>(((v >> 4) & 3) << (2 * quad));
  }
  return b;
}

}  // namespace

TEST_CASE("types: layouts and sizes", "[kernels][types]") {
  CHECK(row_bytes(dtype::f32, 64) == 256);
  CHECK(row_bytes(dtype::f16, 64) == 128);
  CHECK(row_bytes(dtype::bf16, 64) == 128);
  CHECK(row_bytes(dtype::q8_0, 64) == 68);
  CHECK(row_bytes(dtype::q4_0, 64) == 36);
  CHECK(row_bytes(dtype::q4_k, 512) == 288);
  CHECK(row_bytes(dtype::q6_k, 512) == 420);
  for (int i = 0; i < static_cast<int>(dtype::count); ++i) {
    dtype back;
    REQUIRE(dtype_from_ggml(ggml_type_of(static_cast<dtype>(i)), &back));
    CHECK(back == static_cast<dtype>(i));
  }
  CHECK(row_bytes(dtype::q4_1, 64) == 40);
  CHECK(row_bytes(dtype::q5_0, 64) == 44);
  CHECK(row_bytes(dtype::q5_1, 64) == 48);
  CHECK(row_bytes(dtype::q5_k, 512) == 352);
  dtype t;
  REQUIRE(dtype_from_ggml(6, &t));  // Q5_0
  CHECK(t == dtype::q5_0);
  REQUIRE(dtype_from_ggml(13, &t));  // Q5_K
  CHECK(t == dtype::q5_k);
  CHECK_FALSE(dtype_from_ggml(10, &t));  // Q2_K
  CHECK_FALSE(dtype_from_ggml(20, &t));  // IQ4_NL
}

TEST_CASE("types: bf16 conversions", "[kernels][types]") {
  CHECK(fp32_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_fp32(0x3f80) == 1.0f);
  CHECK(bf16_to_fp32(0xc040) == -3.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  CHECK(bf16_to_fp32(fp32_to_bf16(1.00390625f)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1.0078125 and 1.015625: to even (1.015625).
  CHECK(bf16_to_fp32(fp32_to_bf16(1.01171875f)) == 1.015625f);
  CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
  // Subnormals round like any value (ggml's current GGML_FP32_TO_BF16; an
  // older version flushed them to zero): 1e-40 is 0x000116c2 -> 0x0001.
  CHECK(fp32_to_bf16(1e-40f) == 0x0001);
  CHECK(fp32_to_bf16(-1e-40f) == 0x8001);
}

TEST_CASE("types: dequantization of each type against its layout", "[kernels][types]") {
  SECTION("q8_0") {
    q8_block b{};
    b.d = fp32_to_fp16(0.25f);
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
    float out[32];
    dequantize_row(dtype::q8_0, &b, out, 32);
    for (int j = 0; j < 32; ++j) CHECK(out[j] == 0.25f * (j * 8 - 128));
  }
  SECTION("q4_0") {
    block_q4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float out[32];
    dequantize_row(dtype::q4_0, &b, out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == 0.5f * (j - 8));
      CHECK(out[j + 16] == 0.5f * (15 - j - 8));
    }
  }
  SECTION("q4_K") {
    int sc[8], m[8], q[256];
    for (int j = 0; j < 8; ++j) {
      sc[j] = 63 - 7 * j;  // uses the top bits of the 6-bit fields
      m[j] = 5 * j + 20;
    }
    for (int e = 0; e < 256; ++e) q[e] = (e * 7 + 3) % 16;
    const block_q4_k b = pack_q4_k(0.125f, 0.0625f, sc, m, q);
    float out[256];
    dequantize_row(dtype::q4_k, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const double want = 0.125 * sc[e / 32] * q[e] - 0.0625 * m[e / 32];
      INFO("element " << e);
      CHECK(out[e] == Approx(want).margin(1e-6));
    }
  }
  SECTION("q6_K") {
    int8_t sc[16];
    int q[256];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int8_t>(j * 9 - 70);
    for (int e = 0; e < 256; ++e) q[e] = (e * 11 + 5) % 64;
    const block_q6_k b = pack_q6_k(0.03125f, sc, q);
    float out[256];
    dequantize_row(dtype::q6_k, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const double want = 0.03125 * sc[e / 16] * (q[e] - 32);
      INFO("element " << e);
      CHECK(out[e] == Approx(want).margin(1e-6));
    }
  }
  SECTION("q4_1") {
    block_q4_1 b{};
    b.d = fp32_to_fp16(0.5f);
    b.m = fp32_to_fp16(-3.0f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float out[32];
    dequantize_row(dtype::q4_1, &b, out, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(out[j] == 0.5f * j - 3.0f);
      CHECK(out[j + 16] == 0.5f * (15 - j) - 3.0f);
    }
  }
  SECTION("q5_0 and q5_1: the fifth bit of weight j is bit j of the little-endian qh") {
    int q[32];
    for (int e = 0; e < 32; ++e) q[e] = (e * 11 + 7) % 32;
    uint32_t qh = 0;
    uint8_t qs[16];
    for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
    for (int e = 0; e < 32; ++e) qh |= static_cast<uint32_t>(q[e] >> 4) << e;
    block_q5_0 b0{};
    b0.d = fp32_to_fp16(0.25f);
    for (int k = 0; k < 4; ++k) b0.qh[k] = static_cast<uint8_t>(qh >> (8 * k));
    std::memcpy(b0.qs, qs, 16);
    block_q5_1 b1{};
    b1.d = fp32_to_fp16(0.125f);
    b1.m = fp32_to_fp16(1.5f);
    std::memcpy(b1.qh, b0.qh, 4);
    std::memcpy(b1.qs, qs, 16);
    float o0[32], o1[32];
    dequantize_row(dtype::q5_0, &b0, o0, 32);
    dequantize_row(dtype::q5_1, &b1, o1, 32);
    for (int e = 0; e < 32; ++e) {
      INFO("element " << e);
      CHECK(o0[e] == 0.25f * (q[e] - 16));
      CHECK(o1[e] == 0.125f * q[e] + 1.5f);
    }
  }
  SECTION("q5_K") {
    int sc[8], m[8], q[256];
    for (int j = 0; j < 8; ++j) {
      sc[j] = 63 - 7 * j;
      m[j] = 5 * j + 20;
    }
    for (int e = 0; e < 256; ++e) q[e] = (e * 13 + 3) % 32;
    // q4_K's packing for the scales, mins and low nibbles; the fifth bit of
    // element e (sub-block sb = e / 32, l = e % 32) is bit sb of qh[l].
    int low[256];
    for (int e = 0; e < 256; ++e) low[e] = q[e] & 15;
    const block_q4_k k4 = pack_q4_k(0.125f, 0.0625f, sc, m, low);
    block_q5_k b{};
    b.d = k4.d;
    b.dmin = k4.dmin;
    std::memcpy(b.scales, k4.scales, 12);
    std::memcpy(b.qs, k4.qs, 128);
    for (int e = 0; e < 256; ++e) b.qh[e % 32] |= static_cast<uint8_t>((q[e] >> 4) << (e / 32));
    float out[256];
    dequantize_row(dtype::q5_k, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const double want = 0.125 * sc[e / 32] * q[e] - 0.0625 * m[e / 32];
      INFO("element " << e);
      CHECK(out[e] == Approx(want).margin(1e-6));
    }
  }
  SECTION("f16 and bf16") {
    const uint16_t h[3] = {0x3c00, 0xc000, 0x3800};  // 1, -2, 0.5
    float out[3];
    dequantize_row(dtype::f16, h, out, 3);
    CHECK((out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f));
    const uint16_t b[2] = {0x4040, 0xbf00};  // 3, -0.5
    dequantize_row(dtype::bf16, b, out, 2);
    CHECK((out[0] == 3.0f && out[1] == -0.5f));
  }
}

TEST_CASE("types: quantizers round-trip within their step", "[kernels][types]") {
  test::rng r(7);
  std::vector<float> x(512), back(512);
  test::fill(r, x.data(), x.size());
  SECTION("q4_0: error at most half a step (d = max/-8), a whole step where 8 clamps to 7") {
    std::vector<block_q4_0> q(16);
    quantize_row_q4_0(x.data(), q.data(), 512);
    dequantize_row(dtype::q4_0, q.data(), back.data(), 512);
    for (int b = 0; b < 16; ++b) {
      const float d = std::fabs(fp16_to_fp32(q[b].d));
      for (int j = 0; j < 32; ++j) {
        const float s = x[b * 32 + j] / fp16_to_fp32(q[b].d);  // in [-8, 8]
        CHECK(std::fabs(back[b * 32 + j] - x[b * 32 + j]) <= d * (s > 7.5f ? 1.0f : 0.5f) + 1e-3f);
      }
    }
  }
  SECTION("q8_K: bsums and scale") {
    std::vector<block_q8_k> q(2);
    quantize_row_q8_k(x.data(), q.data(), 512);
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += q[b].qs[g * 16 + j];
        CHECK(q[b].bsums[g] == s);
      }
      for (int j = 0; j < 256; ++j)
        CHECK(std::fabs(q[b].d * q[b].qs[j] - x[b * 256 + j]) <= std::fabs(q[b].d) * 0.5f + 1e-6f);
    }
  }
}

TEST_CASE("types: byte swapping converts every multi-byte field", "[kernels][types]") {
  block_q6_k b{};
  b.d = 0x1234;
  b.ql[0] = 0x56;
  swap_rows(dtype::q6_k, &b, 1, 256);
  CHECK(b.d == 0x3412);
  CHECK(b.ql[0] == 0x56);
  block_q4_k k{};
  k.d = 0x0102;
  k.dmin = 0x0304;
  swap_rows(dtype::q4_k, &k, 1, 256);
  CHECK((k.d == 0x0201 && k.dmin == 0x0403));
  float f[2] = {1.0f, 2.0f};
  swap_rows(dtype::f32, f, 1, 2);
  swap_rows(dtype::f32, f, 1, 2);
  CHECK((f[0] == 1.0f && f[1] == 2.0f));
}

namespace {

// Random rows of type t: f16/bf16/q8_0/q4_0 by quantizing random floats;
// q4_K/q6_K as random blocks with small scales.
std::vector<uint8_t> random_rows(dtype t, int rows, int cols, test::rng& r) {
  std::vector<uint8_t> out(row_bytes(t, cols) * rows);
  std::vector<float> x(cols);
  for (int i = 0; i < rows; ++i) {
    uint8_t* row = out.data() + row_bytes(t, cols) * i;
    if (t == dtype::q4_1 || t == dtype::q5_0 || t == dtype::q5_1 || t == dtype::q5_k) {
      // No quantizer for these: random quants, small scales (and mins).
      for (size_t j = 0; j < row_bytes(t, cols); ++j) row[j] = static_cast<uint8_t>(r.next());
      for (int b = 0; b < cols / block_elems(t); ++b) {
        uint8_t* blk = row + static_cast<size_t>(b) * block_bytes(t);
        const uint16_t d = fp32_to_fp16(r.uniform(0.001f, 0.01f));
        const uint16_t m = fp32_to_fp16(t == dtype::q5_k ? r.uniform(0.001f, 0.01f) : r.uniform(-0.1f, 0.0f));
        std::memcpy(blk, &d, 2);
        if (t != dtype::q5_0) std::memcpy(blk + 2, &m, 2);  // m (q4_1, q5_1) or dmin (q5_K)
      }
    } else if (t == dtype::q4_k || t == dtype::q6_k) {
      for (size_t j = 0; j < row_bytes(t, cols); ++j) row[j] = static_cast<uint8_t>(r.next());
      for (int b = 0; b < cols / qk_k; ++b) {
        if (t == dtype::q4_k) {
          auto* k = reinterpret_cast<block_q4_k*>(row) + b;
          k->d = fp32_to_fp16(r.uniform(0.001f, 0.01f));
          k->dmin = fp32_to_fp16(r.uniform(0.001f, 0.01f));
        } else {
          reinterpret_cast<block_q6_k*>(row)[b].d = fp32_to_fp16(r.uniform(-0.001f, 0.001f));
        }
      }
    } else {
      test::fill(r, x.data(), cols);
      REQUIRE(quantize_row(t, x.data(), row, cols));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("matvec_typed conforms on every backend for every type and mode",
          "[kernels][conformance][types]") {
  test::register_cell_backends();
  struct shape {
    int rows, cols, pad_blocks;  // pad_blocks: extra blocks per row (a column slice)
  };
  const shape shapes[] = {{1, 256, 0}, {7, 512, 1}, {33, 256, 2}, {172, 512, 0}, {64, 768, 3}};
  for (int ti = 0; ti < static_cast<int>(dtype::count); ++ti) {
    const dtype t = static_cast<dtype>(ti);
    for (const shape& sh : shapes) {
      test::rng r(100u + ti * 7 + sh.rows);
      const int full_cols = sh.cols + sh.pad_blocks * block_elems(t);
      const auto W = random_rows(t, sh.rows, full_cols, r);
      const size_t stride = row_bytes(t, full_cols);
      // The slice starts `pad_blocks` blocks into each row.
      const uint8_t* slice = W.data() + static_cast<size_t>(sh.pad_blocks) * block_bytes(t);
      std::vector<float> x(sh.cols);
      test::fill(r, x.data(), x.size());
      // Independent: double sums over dequantized rows.
      std::vector<float> wrow(full_cols);
      // scale[i] = sum of |w x| over row i: the size of the products, the
      // yardstick of a dot product's rounding error (a single row whose sum
      // cancels, as random q5_0 quants can, is no worse summed for it).
      std::vector<double> exact(sh.rows), scale(sh.rows);
      for (int i = 0; i < sh.rows; ++i) {
        dequantize_row(t, W.data() + stride * i, wrow.data(), full_cols);
        double s = 0, a = 0;
        for (int c = 0; c < sh.cols; ++c) {
          const double p = static_cast<double>(wrow[sh.pad_blocks * block_elems(t) + c]) * x[c];
          s += p;
          a += std::fabs(p);
        }
        exact[i] = s;
        scale[i] = a;
      }
      for (auto mode : {matmul_mode::exact, matmul_mode::ggml}) {
        std::vector<float> want(sh.rows);
        ref::matvec_typed(want.data(), slice, t, stride, x.data(), sh.rows, sh.cols, mode);
        // Against double math: exact mode only sums in f32; ggml mode also
        // rounds the activations (q8 blocks: ~1e-5 relative error).
        double num = 0, den = 0;
        for (int i = 0; i < sh.rows; ++i) {
          num += (want[i] - exact[i]) * (want[i] - exact[i]);
          den += scale[i] * scale[i];
        }
        const bool rounded = mode == matmul_mode::ggml && t != dtype::f32;
        INFO(to_string(t) << " " << to_string(mode) << " " << sh.rows << "x" << sh.cols);
        CHECK(num / den <= (rounded ? 1e-3 : 1e-10));
        for (const auto& name : backend_names()) {
          const backend* be = find_backend(name);
          if (!be->matvec_typed) continue;  // a backend registered without the slot
          // native: at every vector level this CPU has (its typed kernels
          // differ per level), then back at the best.
          std::vector<native::isa> isas = {native::active_isa()};
          if (name == "native") isas.assign(std::begin(native::all_isas), std::end(native::all_isas));
          const native::isa best = native::active_isa();
          for (native::isa lv : isas) {
            if (name == "native" && !native::set_isa(lv)) continue;
            std::vector<float> got(sh.rows, NAN);
            be->matvec_typed(got.data(), slice, t, stride, x.data(), sh.rows, sh.cols, mode);
            INFO(name << " " << native::to_string(lv));
            // Measured against the size of the products (scale), as above: a
            // single row whose sum cancels (random q5_0 quants on ppc64's
            // portable path, 1x256) made a plain NMSE of got vs want exceed
            // 1e-10 while every product agreed.
            double dn = 0;
            for (int i = 0; i < sh.rows; ++i) dn += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
            CHECK(dn / den <= (name == "spu-host" ? 1e-9 : 1e-10));
          }
          native::set_isa(best);
        }
      }
    }
  }
}

// ggml's reference K-quantizers (kernels/quantize_k.cpp) on inputs whose
// exact blocks follow from the algorithm's description: every value already
// on its sub-block's grid, the grids' steps powers of two, so each fit is
// exact and the 6-bit / int8 scale quantization loses nothing.
TEST_CASE("types: q4_K and q6_K quantizers give the exact blocks of on-grid input",
          "[kernels][types][quantize]") {
  SECTION("q6_K: sub-block j is 2^-4 * 2^-(j mod 8) * q, q in -32..31 with a -32") {
    int8_t sc[16];
    int q[256];
    std::vector<float> x(256);
    for (int j = 0; j < 16; ++j) {
      const int k = 128 >> (j % 8);                 // |scale| 128, 64, ..., 1
      sc[j] = static_cast<int8_t>(-k);              // d < 0: the largest fit is -2^-4 / 128 x -128
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * j + l;
        const int v = l == 0 ? -32 : (e * 13 + j * 5) % 63 - 31;  // -32 is the largest magnitude
        q[e] = v + 32;
        x[e] = std::ldexp(static_cast<float>(v), -4 - (j % 8));
      }
    }
    const block_q6_k want = pack_q6_k(-std::ldexp(1.0f, -4) / 128, sc, q);
    block_q6_k got;
    REQUIRE(quantize_row(dtype::q6_k, x.data(), &got, 256));
    CHECK(got.d == want.d);
    CHECK(std::memcmp(got.scales, want.scales, 16) == 0);
    CHECK(std::memcmp(got.ql, want.ql, sizeof want.ql) == 0);
    CHECK(std::memcmp(got.qh, want.qh, sizeof want.qh) == 0);
    std::vector<float> back(256);
    dequantize_row(dtype::q6_k, &got, back.data(), 256);
    CHECK(back == x);
  }
  SECTION("q4_K: sub-block j is (sc_j L - m_j / 2) / 64, L in 0..15 with a 0 and a 15") {
    int sc[8], m[8], q[256];
    std::vector<float> x(256);
    for (int j = 0; j < 8; ++j) {
      sc[j] = 63 - 5 * j;  // max 63: d = (63/64) / 63 = 2^-6
      m[j] = 63 - 4 * j;   // max 63: dmin = (63/128) / 63 = 2^-7 (mins > 0: values below 0)
      for (int l = 0; l < 32; ++l) {
        const int e = 32 * j + l;
        q[e] = l == 0 ? 0 : l == 1 ? 15 : (e * 7 + j) % 16;
        x[e] = (sc[j] * q[e]) / 64.0f - m[j] / 128.0f;
      }
    }
    const block_q4_k want = pack_q4_k(1.0f / 64, 1.0f / 128, sc, m, q);
    block_q4_k got;
    REQUIRE(quantize_row(dtype::q4_k, x.data(), &got, 256));
    CHECK(got.d == want.d);
    CHECK(got.dmin == want.dmin);
    CHECK(std::memcmp(got.scales, want.scales, 12) == 0);
    CHECK(std::memcmp(got.qs, want.qs, 128) == 0);
    std::vector<float> back(256);
    dequantize_row(dtype::q4_k, &got, back.data(), 256);
    CHECK(back == x);
  }
  SECTION("all-zero blocks quantize to zero blocks") {
    std::vector<float> z(256, 0.0f), back(256, 1.0f);
    block_q6_k b6;
    block_q4_k b4;
    quantize_row(dtype::q6_k, z.data(), &b6, 256);
    quantize_row(dtype::q4_k, z.data(), &b4, 256);
    dequantize_row(dtype::q6_k, &b6, back.data(), 256);
    CHECK(back == z);
    dequantize_row(dtype::q4_k, &b4, back.data(), 256);
    CHECK(back == z);
  }
}

// Round trips of random rows against what rounding to the stored grid
// guarantees: a value not clamped is within half a step of its sub-block's
// rounded scale; and the whole row's NMSE within the bits' budget.
TEST_CASE("types: q4_K and q6_K quantizers round-trip within their step", "[kernels][types][quantize]") {
  test::rng r(11);
  const int n = 1024;
  std::vector<float> x(n), back(n);
  test::fill(r, x.data(), x.size());
  for (int i = 0; i < n; i += 97) x[i] *= 6.0f;  // outliers, as real weights have
  auto nmse = [&] {
    double e = 0, s = 0;
    for (int i = 0; i < n; ++i) {
      e += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
      s += static_cast<double>(x[i]) * x[i];
    }
    return e / s;
  };
  SECTION("q6_K") {
    std::vector<block_q6_k> q(n / 256);
    quantize_row(dtype::q6_k, x.data(), q.data(), n);
    dequantize_row(dtype::q6_k, q.data(), back.data(), n);
    int clamped = 0;
    for (int i = 0; i < n; ++i) {
      const block_q6_k& b = q[i / 256];
      const float step = fp16_to_fp32(b.d) * b.scales[(i % 256) / 16];
      INFO("element " << i << " x " << x[i] << " back " << back[i] << " step " << step);
      REQUIRE(step != 0.0f);
      const float s = x[i] / step;
      if (s < -32.5f || s > 31.5f) {
        ++clamped;
        continue;
      }
      CHECK(std::fabs(back[i] - x[i]) <= 0.5f * std::fabs(step) * (1 + 1e-5f));
    }
    CHECK(clamped <= n / 64);
    const double e = nmse();
    WARN("q6_K round trip NMSE " << e);
    CHECK(e < 1e-3);
  }
  SECTION("q4_K") {
    std::vector<block_q4_k> q(n / 256);
    quantize_row(dtype::q4_k, x.data(), q.data(), n);
    dequantize_row(dtype::q4_k, q.data(), back.data(), n);
    int clamped = 0;
    for (int i = 0; i < n; ++i) {
      const block_q4_k& b = q[i / 256];
      const int j = (i % 256) / 32;
      int sc, m;
      if (j < 4) {
        sc = b.scales[j] & 63;
        m = b.scales[j + 4] & 63;
      } else {
        sc = (b.scales[j + 4] & 0x0F) | ((b.scales[j - 4] >> 6) << 4);
        m = (b.scales[j + 4] >> 4) | ((b.scales[j] >> 6) << 4);
      }
      const float step = fp16_to_fp32(b.d) * sc, off = fp16_to_fp32(b.dmin) * m;
      REQUIRE(step > 0.0f);
      const float s = (x[i] + off) / step;
      if (s < -0.5f || s > 15.5f) {
        ++clamped;
        continue;
      }
      INFO("element " << i << " x " << x[i] << " back " << back[i] << " step " << step);
      CHECK(std::fabs(back[i] - x[i]) <= 0.5f * step * (1 + 1e-5f) + 1e-6f);
    }
    CHECK(clamped <= n / 32);
    const double e = nmse();
    WARN("q4_K round trip NMSE " << e);
    CHECK(e < 1e-2);
  }
}
