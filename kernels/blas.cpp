// The blas backend: OpenBLAS sgemv for the f32 matvec; every other operation
// delegates to the reference loops (they are O(n) and memory-trivial next to
// the matvecs, which read every weight once per token).
#include "kernels/backend.hpp"
#include "kernels/reference.hpp"
#include "kernels/types.hpp"

#include <cblas.h>

namespace cellshard::kernels {
namespace {

void blas_matvec(float* out, const float* W, const float* x, int rows, int cols, int ld) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, W, ld, x, 1, 0.0f, out, 1);
}

// f32 weights (either mode: ggml does not round f32 products) go to sgemv;
// other types use the reference loops.
void blas_matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride,
                       const float* x, int rows, int cols, matmul_mode mode) {
  if (t == dtype::f32) {
    blas_matvec(out, static_cast<const float*>(W), x, rows, cols,
                static_cast<int>(row_stride / sizeof(float)));
    return;
  }
  ref::matvec_typed(out, W, t, row_stride, x, rows, cols, mode);
}

bool blas_supports(op o) { return o == op::matvec; }

}  // namespace

const backend& blas_backend() {
  static const backend b{"blas",       blas_matvec,    ref::matvec_q8, ref::rmsnorm,
                         ref::rope,    ref::softmax,   ref::attention, ref::swiglu,
                         blas_supports, blas_matvec_typed, ref::matvec_q4};
  return b;
}

void set_blas_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}

}  // namespace cellshard::kernels
