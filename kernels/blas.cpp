// The blas backend: OpenBLAS sgemv for the f32 matvec; every other operation
// delegates to the reference loops (they are O(n) and memory-trivial next to
// the matvecs, which read every weight once per token).
#include "kernels/backend.hpp"
#include "kernels/reference.hpp"

#include <cblas.h>

namespace cellshard::kernels {
namespace {

void blas_matvec(float* out, const float* W, const float* x, int rows, int cols, int ld) {
  cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, W, ld, x, 1, 0.0f, out, 1);
}

bool blas_supports(op o) { return o == op::matvec; }

}  // namespace

const backend& blas_backend() {
  static const backend b{"blas",       blas_matvec,    ref::matvec_q8, ref::rmsnorm,
                         ref::rope,    ref::softmax,   ref::attention, ref::swiglu,
                         blas_supports};
  return b;
}

void set_blas_threads(int n) {
  if (n > 0) openblas_set_num_threads(n);
}

}  // namespace cellshard::kernels
