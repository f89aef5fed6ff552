// kernels/spe.hpp: the Cell-style backends.
//
// "spe": every kernel runs as the SPU program kernels/spu/spu_kernels.c,
// written against the Cell SDK's spu_mfcio.h / spu_intrinsics.h and compiled
// for the host through kernels/spu/host/. Each SPE worker is a thread of the
// backend's own pool with its own 256 KiB local store and a checked MFC model
// (kernels/dma.hpp): operands come in and results go out only by DMA obeying
// the MFC's rules, the data region is 192 KiB (64 KiB are reserved for the
// program's code, statics and stack), weight rows stream through two 32 KiB
// tile buffers (double buffering), arithmetic is on 4-wide float vectors.
// matvec rows (split at multiples of 4) and attention heads are divided among
// the workers; the O(n) kernels run on one worker. Results do not depend on
// the number of workers.
//
// "spu-host": the same program and driver with SPU arithmetic emulated
// (fused multiply-add, rounding toward zero, denormals flushed): what a Cell
// would compute, as far as a host can tell. Test/diagnostic backend.
//
// The PPE side (this driver) hands each worker a job block
// (kernels/spu/spu_job.h); on a Cell the same blocks would go to SPE contexts
// (libspe2), which is not written: no Cell is at hand.
//
// Errors: the backend table's slots return void, so a failed kernel (DMA
// rule violated, shape beyond the local store) fills its outputs with NaN,
// counts the error in stats() and keeps the message in last_error(). The
// functions in namespace spe return the status as a value.
//
// Thread safety: all kernels are re-entrant. One call at a time uses the
// worker pool; a call made while the pool is busy runs its jobs one after
// another on the calling thread (same results). set_spe_workers() and
// spe::set_options() are for start-up and tests.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.hpp"
#include "kernels/dma.hpp"

struct spu_job;

namespace cellshard::kernels {

const backend& spe_backend();
const backend& spu_host_backend();

/// SPE workers used by the spe and spu-host backends (1..spe::max_workers;
/// default 1; a PS3 gives a program 6 SPEs).
void set_spe_workers(int n);
int spe_workers();

}  // namespace cellshard::kernels

namespace cellshard::kernels::spe {

constexpr int max_workers = 16;

/// Which arithmetic the SPU program runs with.
enum class arithmetic { host, spu };

struct options {
  int workers = 1;                 // SPE workers, clamped to 1..max_workers
  uint32_t tile_bytes = 0;         // streaming tile bytes, 0 = 32 KiB (tests shrink it)
  uint32_t chunk_floats = 0;       // chunk of the O(n) kernels, 0 = 8192 floats
  int min_rows_per_worker = 64;    // a matvec gives no worker fewer rows than this
  dma::completion completion = dma::completion::deferred;
  bool poison_ls = false;          // fill each worker's LS with NaN before a job (tests)
};
void set_options(const options& o);
options get_options();

/// Outcome of one kernel call. `spu` is the SPU program's spu_status (0 = ok),
/// `fault` the first DMA fault of any worker.
struct status {
  uint32_t spu = 0;
  dma::fault fault = dma::fault::none;
  uint32_t ls_need = 0;  // with spu == SPU_ERR_LS_BUDGET: bytes the shape needed
  std::string message;   // "" when ok
  bool ok() const { return spu == 0 && fault == dma::fault::none; }
  explicit operator bool() const { return ok(); }
};

/// Totals since reset_stats() over every spe/spu-host call (all workers).
struct stats {
  uint64_t kernel_calls = 0;
  uint64_t jobs = 0;
  uint64_t errors = 0;            // calls that failed
  dma::counters dma;              // commands, lists, transfers, bytes
  uint32_t ls_high_water = 0;     // most data-region bytes one job used
};
stats get_stats();
void reset_stats();
/// Message of the most recent failed call ("" if none).
std::string last_error();

// Kernels with their status as a value (shapes: kernels/backend.hpp).
status matvec(float* out, const float* W, const float* x, int rows, int cols, int ld,
              arithmetic a = arithmetic::host);
status matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols,
                 arithmetic a = arithmetic::host);
status rmsnorm(float* out, const float* x, const float* weight, int n,
               arithmetic a = arithmetic::host);
status rope(float* q, int nq, float* k, int nk, int pos, int head_size,
            arithmetic a = arithmetic::host);
status softmax(float* x, int n, arithmetic a = arithmetic::host);
status attention(float* out, const float* q, const float* k_cache, const float* v_cache,
                 float* att, int n_heads, int kv_mul, int head_size, int kv_stride, int pos,
                 arithmetic a = arithmetic::host);
status swiglu(float* hb, const float* hb2, int n, arithmetic a = arithmetic::host);

/// An EA range a raw job may touch.
struct window {
  const void* p;
  std::size_t bytes;
  bool writable;
};
/// Runs one prepared job block (128-byte aligned) on one worker with exactly
/// the given operand windows (tests use it to show that a DMA the MFC would
/// refuse is refused, reported, and never performed).
status run_raw_job(spu_job* job, const window* windows, int n_windows,
                   arithmetic a = arithmetic::host);

}  // namespace cellshard::kernels::spe
