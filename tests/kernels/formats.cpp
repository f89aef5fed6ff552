// fp16 conversion and q8_0 quantization (kernels/backend.cpp) against
// independent math: binary16 values computed with ldexp/nearbyint in double,
// not bit manipulation.
#include "kernels/backend.hpp"
#include "tests/kernels/common.hpp"

#include <catch2/catch.hpp>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <vector>

using namespace cellshard::kernels;

namespace {

// The value of a binary16 bit pattern (IEEE 754: sign, 5-bit exponent with
// bias 15, 10-bit fraction; exponent 0 = subnormal, 31 = Inf/NaN).
double half_value(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

// Nearest binary16 (ties to even) of x, as bits, by arithmetic: the spacing
// of binary16 numbers at |x| is 2^(max(e,-14) - 10).
uint16_t half_bits(float xf) {
  const double x = xf;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7e00;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp rounds up to Inf
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, -14);
  const double quantum = std::ldexp(1.0, exp - 10);
  const double n = std::nearbyint(a / quantum);  // current mode: to nearest, ties to even
  const double v = n * quantum;
  if (v == 0) return sign;
  if (v < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(v / std::ldexp(1.0, -24));
  int ve;
  std::frexp(v, &ve);
  const int biased = ve - 1 + 15;
  const double frac = v / std::ldexp(1.0, ve - 1) - 1.0;  // [0,1)
  return sign | static_cast<uint16_t>(biased << 10) | static_cast<uint16_t>(frac * 1024.0);
}

}  // namespace

TEST_CASE("fp16_to_fp32 decodes every binary16 pattern", "[kernels][formats]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = fp16_to_fp32(static_cast<uint16_t>(h));
    const double want = half_value(static_cast<uint16_t>(h));
    INFO("half 0x" << std::hex << h);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(static_cast<double>(got) == want);
      CHECK(std::signbit(got) == ((h & 0x8000) != 0));
    }
  }
}

TEST_CASE("fp32_to_fp16 rounds to nearest even", "[kernels][formats]") {
  REQUIRE(std::fegetround() == FE_TONEAREST);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 1e6f,
                           -1e6f, INFINITY, -INFINITY, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-10f,
                           6.1035156e-05f, 6.1e-05f, 0.1f, 0.333333f, 3.14159265f};
  // every binary16 value, and the midpoint to its successor (a tie)
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = half_value(static_cast<uint16_t>(h));
    xs.push_back(static_cast<float>(v));
    xs.push_back(static_cast<float>(-v));
    const double mid = (v + half_value(static_cast<uint16_t>(h + 1))) / 2;
    if (static_cast<double>(static_cast<float>(mid)) == mid) xs.push_back(static_cast<float>(mid));
  }
  cellshard::test::rng r(77);
  for (int i = 0; i < 100000; ++i) {
    const float m = r.uniform(-1.0f, 1.0f);
    xs.push_back(std::ldexp(m, static_cast<int>(r.next() % 44) - 28));
  }
  for (float x : xs) {
    INFO("x = " << x);
    CHECK(fp32_to_fp16(x) == half_bits(x));
  }
  CHECK(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
}

TEST_CASE("q8_0 quantize/dequantize follow the block definition", "[kernels][formats]") {
  cellshard::test::rng r(5);
  for (int cols : {1, 7, 32, 33, 64, 172, 4097}) {
    std::vector<float> x(cols);
    cellshard::test::fill(r, x.data(), cols, -3.0f, 3.0f);
    if (cols > 5) x[5] = 0.0f;
    const int nb = q8_blocks_per_row(cols);
    std::vector<q8_block> q(nb);
    quantize_row_q8(x.data(), q.data(), cols);
    std::vector<float> back(cols);
    dequantize_row_q8(q.data(), back.data(), cols);
    for (int b = 0; b < nb; ++b) {
      float amax = 0;
      for (int i = b * 32; i < std::min(cols, b * 32 + 32); ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;  // IEEE division: correctly rounded
      INFO("cols " << cols << " block " << b);
      CHECK(q[b].d == half_bits(d));  // the scale is max|x|/127 in binary16
      for (int i = 0; i < 32; ++i) {
        const int c = b * 32 + i;
        if (c >= cols) {
          CHECK(q[b].qs[i] == 0);  // padding
          continue;
        }
        // q = x/d rounded: within half a step (plus float slack), |q| <= 127
        CHECK(std::abs(q[b].qs[i]) <= 127);
        if (d > 0) CHECK(std::fabs(q[b].qs[i] - x[c] / static_cast<double>(d)) <= 0.5 + 1e-4);
        if (std::fabs(x[c]) == amax && d > 0) CHECK(std::abs(q[b].qs[i]) == 127);
        CHECK(back[c] == static_cast<float>(half_value(q[b].d)) * q[b].qs[i]);
      }
    }
  }
}

TEST_CASE("round_to_q8 puts floats on the q8_0 grid, once and for all", "[kernels][formats]") {
  // By hand: max |x| = 127 gives the scale 1 (exact in binary16), so each
  // value becomes its nearest integer (halves away from zero).
  std::vector<float> hand = {127.0f, -63.5f, 1.25f, -0.5f, 2.75f};
  round_to_q8(hand.data(), hand.size());
  CHECK(hand == std::vector<float>{127.0f, -64.0f, 1.0f, -1.0f, 3.0f});

  cellshard::test::rng r(11);
  for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{75}, size_t{768}}) {
    std::vector<float> x(n);
    cellshard::test::fill(r, x.data(), static_cast<int>(n), -40.0f, 40.0f);
    std::vector<float> y = x;
    round_to_q8(y.data(), n);
    // Independent math: per 32 consecutive floats, the binary16 scale of
    // max|x| / 127 (half_bits) times x / (max|x| / 127) rounded, in double.
    for (size_t b = 0; b < n; b += 32) {
      const size_t e = std::min(n, b + 32);
      float amax = 0;
      for (size_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      const double scale = half_value(half_bits(d));
      for (size_t i = b; i < e; ++i) {
        INFO("n " << n << " i " << i);
        const double q = std::round(static_cast<double>(x[i]) / d);
        CHECK(std::fabs(q) <= 127);
        CHECK(y[i] == static_cast<float>(scale * q));
      }
    }
    // A second rounding changes no bit (what the receiver of --sync q8_0 relies on).
    std::vector<float> z = y;
    round_to_q8(z.data(), n);
    CHECK(std::memcmp(z.data(), y.data(), n * sizeof(float)) == 0);
  }
}
