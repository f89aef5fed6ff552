// The SPU program (kernels/spu/spu_kernels.c) compiled for the host with host
// arithmetic: the compute of the `spe` backend. The C source is included in a
// namespace so that its file-local functions stay private and the two host
// builds (this one and kernels/spu/host/spu_program.cpp) do not collide.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define SPU_HOST_FUSED_MADD 0
#include <spu_intrinsics.h>  // kernels/spu/host/ (include path set in kernels/spe.cmake)
#include <spu_mfcio.h>

#include "kernels/spu/host/spu_host.hpp"
#include "kernels/spu/spu_job.h"

namespace cellshard::kernels::spe_program {
#include "kernels/spu/spu_kernels.c"
}  // namespace cellshard::kernels::spe_program
