// The reference backend: llama2.c run.c's loops, summed in its order. It is the
// oracle every other backend is checked against (tests/kernels).
#include "kernels/backend.hpp"
#include "kernels/reference.hpp"

#include <cmath>
#include <cstring>

namespace cellshard::kernels::ref {

void matvec(float* out, const float* W, const float* x, int rows, int cols, int ld) {
  for (int r = 0; r < rows; ++r) {
    const float* w = W + static_cast<std::size_t>(r) * ld;
    float val = 0.0f;
    for (int c = 0; c < cols; ++c) val += w[c] * x[c];
    out[r] = val;
  }
}

void matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int r = 0; r < rows; ++r) {
    const q8_block* row = W + static_cast<std::size_t>(r) * nb;
    float val = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const int base = b * q8_block_size;
      const int n = cols - base < q8_block_size ? cols - base : q8_block_size;
      float s = 0.0f;
      for (int i = 0; i < n; ++i) s += static_cast<float>(row[b].qs[i]) * x[base + i];
      val += s * fp16_to_fp32(row[b].d);
    }
    out[r] = val;
  }
}

void matvec_q4(float* out, const q4_block* W, const float* x, int rows, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int r = 0; r < rows; ++r) {
    const q4_block* row = W + static_cast<std::size_t>(r) * nb;
    float val = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const int base = b * q8_block_size;
      const int n = cols - base < q8_block_size ? cols - base : q8_block_size;
      float s = 0.0f;
      for (int i = 0; i < n; ++i) {
        const int q = i < 16 ? (row[b].qs[i] & 0x0f) : (row[b].qs[i - 16] >> 4);
        s += static_cast<float>(q - 8) * x[base + i];
      }
      val += s * fp16_to_fp32(row[b].d);
    }
    out[r] = val;
  }
}

void rmsnorm(float* out, const float* x, const float* weight, int n) { rmsnorm_eps(out, x, weight, n, 1e-5f); }

void rmsnorm_eps(float* out, const float* x, const float* weight, int n, float eps) {
  float ss = 0.0f;
  for (int j = 0; j < n; ++j) ss += x[j] * x[j];
  ss /= n;
  ss += eps;
  ss = 1.0f / sqrtf(ss);
  for (int j = 0; j < n; ++j) out[j] = weight[j] * (ss * x[j]);
}

void rope(float* q, int nq, float* k, int nk, int pos, int head_size) {
  rope_base(q, nq, k, nk, pos, head_size, 10000.0f);
}

void rope_base(float* q, int nq, float* k, int nk, int pos, int head_size, float base,
               const float* factors) {
  const int n = nq > nk ? nq : nk;
  // The rotation of a pair depends only on its place in the head (and pos),
  // so it is computed once per place for the first head and reused by the
  // others: the same expressions, hence the same floats, as computing it for
  // every pair as llama2.c does (powf + sincosf per pair were ~3% of a q4_0
  // decode's samples at 12 heads).
  constexpr int cached = 256;  // places cached (head_size up to 512)
  float cr[cached], ci[cached];
  const int places = head_size % 2 == 0 && head_size / 2 <= cached ? head_size / 2 : 0;
  for (int j = 0; j < places && 2 * j < n; ++j) {
    const int head_dim = 2 * j;
    const float freq = 1.0f / powf(base, head_dim / static_cast<float>(head_size));
    const float val = factors ? pos * freq / factors[head_dim / 2] : pos * freq;
    cr[j] = cosf(val);
    ci[j] = sinf(val);
  }
  for (int i = 0; i < n; i += 2) {
    const int head_dim = i % head_size;
    float fcr, fci;
    if (places) {
      fcr = cr[head_dim / 2];
      fci = ci[head_dim / 2];
    } else {
      const float freq = 1.0f / powf(base, head_dim / static_cast<float>(head_size));
      const float val = factors ? pos * freq / factors[head_dim / 2] : pos * freq;
      fcr = cosf(val);
      fci = sinf(val);
    }
    if (i < nq) {
      const float v0 = q[i], v1 = q[i + 1];
      q[i] = v0 * fcr - v1 * fci;
      q[i + 1] = v0 * fci + v1 * fcr;
    }
    if (i < nk) {
      const float v0 = k[i], v1 = k[i + 1];
      k[i] = v0 * fcr - v1 * fci;
      k[i + 1] = v0 * fci + v1 * fcr;
    }
  }
}

void softmax(float* x, int n) {
  float max_val = x[0];
  for (int i = 1; i < n; ++i)
    if (x[i] > max_val) max_val = x[i];
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] /= sum;
}

void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
               float* att, int n_heads, int kv_mul, int head_size, int kv_stride, int pos) {
  const float scale = sqrtf(static_cast<float>(head_size));
  for (int h = 0; h < n_heads; ++h) {
    const float* qh = q + h * head_size;
    float* a = att + static_cast<std::size_t>(h) * (pos + 1);
    const int kvo = (h / kv_mul) * head_size;
    for (int t = 0; t <= pos; ++t) {
      const float* kt = k_cache + static_cast<std::size_t>(t) * kv_stride + kvo;
      float score = 0.0f;
      for (int i = 0; i < head_size; ++i) score += qh[i] * kt[i];
      a[t] = score / scale;
    }
    softmax(a, pos + 1);
    float* xb = out + h * head_size;
    std::memset(xb, 0, sizeof(float) * head_size);
    for (int t = 0; t <= pos; ++t) {
      const float* vt = v_cache + static_cast<std::size_t>(t) * kv_stride + kvo;
      const float w = a[t];
      for (int i = 0; i < head_size; ++i) xb[i] += w * vt[i];
    }
  }
}

void swiglu(float* hb, const float* hb2, int n) {
  for (int i = 0; i < n; ++i) {
    float val = hb[i];
    val *= (1.0f / (1.0f + expf(-val)));
    val *= hb2[i];
    hb[i] = val;
  }
}

static bool supports(op o) { return o != op::count; }

}  // namespace cellshard::kernels::ref

namespace cellshard::kernels {

const backend& reference_backend() {
  static const backend b{"reference",   ref::matvec,    ref::matvec_q8, ref::rmsnorm,
                         ref::rope,     ref::softmax,   ref::attention, ref::swiglu,
                         ref::supports, ref::matvec_typed, ref::matvec_q4};
  return b;
}

}  // namespace cellshard::kernels
