// tests/kernels/common.hpp: seeded inputs, buffers with chosen misalignment,
// and the error measures the kernel tests share.
#pragma once

#include "kernels/backend.hpp"
#include "kernels/spe.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace cellshard::test {

/// Uniform floats in [lo, hi) from the top 24 bits of a 32-bit draw (exact in
/// a float; never the integer-division trap of rand()/RAND_MAX).
class rng {
public:
  explicit rng(uint32_t seed) : g_(seed) {}
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    const float u = static_cast<float>(g_() >> 8) * (1.0f / 16777216.0f);  // [0,1)
    return lo + (hi - lo) * u;
  }
  uint32_t next() { return g_(); }

private:
  std::mt19937 g_;
};

/// `n` elements of T starting `offset_bytes` past a 128-byte boundary, with
/// guard bytes around (checked by intact()). Lets a test choose exactly how
/// an operand is misaligned.
template <class T>
class buffer {
public:
  buffer(std::size_t n, std::size_t offset_bytes = 0)
      : n_(n), off_(offset_bytes), raw_(static_cast<uint8_t*>(std::aligned_alloc(128, total()))) {
    std::memset(raw_.get(), guard_byte, total());
  }
  T* data() { return reinterpret_cast<T*>(raw_.get() + 128 + off_); }
  const T* data() const { return reinterpret_cast<const T*>(raw_.get() + 128 + off_); }
  T& operator[](std::size_t i) { return data()[i]; }
  std::size_t size() const { return n_; }
  /// Guard bytes before and after the elements untouched.
  bool intact() const {
    const uint8_t* p = raw_.get();
    const std::size_t begin = 128 + off_, end = begin + n_ * sizeof(T);
    for (std::size_t i = 0; i < begin; ++i)
      if (p[i] != guard_byte) return false;
    for (std::size_t i = end; i < total(); ++i)
      if (p[i] != guard_byte) return false;
    return true;
  }

private:
  static constexpr uint8_t guard_byte = 0xff;  // NaN as float: neighbours must never be used
  std::size_t total() const {
    const std::size_t t = 128 + off_ + n_ * sizeof(T) + 256;
    return (t + 127) / 128 * 128;
  }
  struct free_deleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::size_t n_, off_;
  std::unique_ptr<uint8_t, free_deleter> raw_;
};

inline void fill(rng& r, float* p, std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  for (std::size_t i = 0; i < n; ++i) p[i] = r.uniform(lo, hi);
}

/// Normalised mean squared error sum((a-b)^2) / sum(b^2), in double
/// (llama.cpp test-backend-ops' measure). NaN anywhere gives infinity.
inline double nmse(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? num / den : num;
}

/// Registers spe and spu-host (idempotent) so find_backend() knows them.
inline void register_cell_backends() {
  kernels::register_backend(&kernels::spe_backend());
  kernels::register_backend(&kernels::spu_host_backend());
}

}  // namespace cellshard::test
