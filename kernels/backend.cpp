#include "kernels/backend.hpp"

#include "kernels/native.hpp"
#include "kernels/spe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

namespace cellshard::kernels {

const char* to_string(op o) {
  static const char* names[] = {"matvec",  "matvec_q8", "rmsnorm",      "rope",     "softmax",
                                "attention", "swiglu", "matvec_typed", "matvec_q4"};
  static_assert(sizeof(names) / sizeof(names[0]) == static_cast<int>(op::count),
                "one name per op");
  const int i = static_cast<int>(o);
  return i >= 0 && i < static_cast<int>(op::count) ? names[i] : "?";
}

const char* to_string(matmul_mode m) {
  switch (m) {
    case matmul_mode::exact: return "exact";
    case matmul_mode::ggml: return "ggml";
    default: return "?";
  }
}

namespace {
std::vector<const backend*>& registry() {
  static std::vector<const backend*> r{&reference_backend(),
#ifndef CELLSHARD_NO_BLAS
                                       &blas_backend(),
#endif
                                       &native_backend(),
                                       &spe_backend(), &spu_host_backend()};
  return r;
}
}  // namespace

void register_backend(const backend* b) {
  for (auto* x : registry())
    if (std::strcmp(x->name, b->name) == 0) return;
  registry().push_back(b);
}

const backend* find_backend(const std::string& name) {
  for (auto* b : registry())
    if (name == b->name) return b;
  return nullptr;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (auto* b : registry()) out.emplace_back(b->name);
  return out;
}

backend_choice choose_backend(const std::string& name) {
  backend_choice c;
  c.be = find_backend(name);
  if (c.be) return c;
  if (name == "blas" || name == "native") {
    c.be = find_backend("native");
    if (!c.be) c.be = &reference_backend();
    c.note = "backend '" + name + "' is not in this build (" +
             (name == "blas" ? std::string("built without OpenBLAS") : std::string("not compiled in")) +
             "); using '" + c.be->name + "', which conforms to the reference";
    return c;
  }
  std::string names;
  for (auto& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
  c.note = "unknown backend '" + name + "', expected one of " + names;
  return c;
}

#ifdef CELLSHARD_NO_BLAS
void set_blas_threads(int) {}
#endif

// IEEE binary16 conversions (round to nearest even; subnormals, inf and NaN
// handled), written from the IEEE 754-2008 bit layouts.
uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu;
  uint32_t man = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (man ? 0x200u : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (man >> 13);
  const uint32_t rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exp: fine
  return static_cast<uint16_t>(sign | half);
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (man << 13);
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void quantize_row_q8(const float* x, q8_block* out, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int b = 0; b < nb; ++b) {
    const int base = b * q8_block_size;
    float amax = 0.0f;
    for (int i = 0; i < q8_block_size; ++i) {
      const float v = base + i < cols ? x[base + i] : 0.0f;
      amax = std::fmax(amax, std::fabs(v));
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    for (int i = 0; i < q8_block_size; ++i) {
      const float v = base + i < cols ? x[base + i] : 0.0f;
      out[b].qs[i] = static_cast<int8_t>(std::lround(v * id));
    }
  }
}

void round_to_q8(float* x, size_t n) {
  q8_block b;
  for (size_t at = 0; at < n; at += q8_block_size) {
    const int cols = static_cast<int>(std::min<size_t>(q8_block_size, n - at));
    quantize_row_q8(x + at, &b, cols);
    dequantize_row_q8(&b, x + at, cols);
  }
}

void dequantize_row_q8(const q8_block* in, float* out, int cols) {
  for (int c = 0; c < cols; ++c) {
    const q8_block& b = in[c / q8_block_size];
    out[c] = fp16_to_fp32(b.d) * static_cast<float>(b.qs[c % q8_block_size]);
  }
}

// q4_0 format helpers (ggml's reference quantizer, from its published layout).

void quantize_row_q4(const float* x, q4_block* out, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int b = 0; b < nb; ++b) {
    const int base = b * q8_block_size;
    auto at = [&](int i) { return base + i < cols ? x[base + i] : 0.0f; };
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < q8_block_size; ++i) {
      const float v = at(i);
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(at(j) * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(at(j + 16) * id + 8.5f)));
      out[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4(const q4_block* in, float* out, int cols) {
  for (int c = 0; c < cols; ++c) {
    const q4_block& b = in[c / q8_block_size];
    const int j = c % q8_block_size;
    const int q = j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4);
    out[c] = fp16_to_fp32(b.d) * static_cast<float>(q - 8);
  }
}

}  // namespace cellshard::kernels
