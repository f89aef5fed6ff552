// The SPU program (kernels/spu/spu_kernels.c) compiled for the host with SPU
// arithmetic: spu_madd fused (see spu_intrinsics.h); the driver runs it
// inside spu_host::spu_arithmetic (round toward zero, flush to zero). This is
// the `spu-host` backend's compute.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define SPU_HOST_FUSED_MADD 1
#include <spu_intrinsics.h>  // kernels/spu/host/ (include path set in kernels/spe.cmake)
#include <spu_mfcio.h>

#include "kernels/spu/host/spu_host.hpp"
#include "kernels/spu/spu_job.h"

namespace cellshard::kernels::spu_program {
#include "kernels/spu/spu_kernels.c"
}  // namespace cellshard::kernels::spu_program
