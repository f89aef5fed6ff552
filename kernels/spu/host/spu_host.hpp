// kernels/spu/host/spu_host.hpp: running the SPU program (spu_kernels.c) on a
// host thread. The emulated spu_mfcio.h calls go to the dma::engine bound to
// the calling thread; the program itself is compiled twice:
//   spe_program::spu_run_job      host arithmetic (backend "spe")
//   spu_program::spu_run_job      SPU arithmetic: fused multiply-add, run
//                                 inside spu_arithmetic (backend "spu-host")
// Thread safety: binding is per thread; one engine serves one thread at a time.
#pragma once

#include <cstdint>

#include "kernels/dma.hpp"

namespace cellshard::kernels::spu_host {

/// Binds the calling thread to an emulated SPE (nullptr unbinds). While a
/// thread is unbound, mfc_* calls do nothing (the drivers always bind).
void bind(dma::engine* e);
dma::engine* bound();

/// While alive, the calling thread computes floats as an SPU does (as far as
/// the host can): rounding toward zero, denormal inputs and results flushed
/// to zero (x86 MXCSR RC=11, FTZ, DAZ; elsewhere only the rounding mode).
/// Not modelled: the SPU's missing Inf/NaN (it saturates) and its estimate-
/// based division. Restores the previous mode on destruction.
class spu_arithmetic {
public:
  spu_arithmetic();
  ~spu_arithmetic();
  spu_arithmetic(const spu_arithmetic&) = delete;
  spu_arithmetic& operator=(const spu_arithmetic&) = delete;

private:
  unsigned saved_;
};

}  // namespace cellshard::kernels::spu_host

namespace cellshard::kernels::spe_program {
/// The SPU program's entry (spu_kernels.c) with host arithmetic. Runs the job
/// whose 128-byte block is at `job_ea` on the bound engine; returns its
/// spu_status (see kernels/spu/spu_job.h).
uint32_t spu_run_job(uint64_t job_ea);
}  // namespace cellshard::kernels::spe_program

namespace cellshard::kernels::spu_program {
/// The same entry compiled with SPU arithmetic (fused madd).
uint32_t spu_run_job(uint64_t job_ea);
}  // namespace cellshard::kernels::spu_program
