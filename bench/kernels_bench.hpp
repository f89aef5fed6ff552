// bench/kernels_bench.hpp: `cellshard bench kernels`, the matvec benchmark.
//
// For matvec f32, q8_0 and q4_0 on each backend (same thread count for all:
// the spe backend's SPE workers, OpenBLAS threads, native's kernels::pool;
// native's quantized kernels in exact and ggml precision), on a matrix that fits the
// last-level cache and on ones of 256 MiB and more: time per call, GFLOP/s
// and effective GB/s (weight + x + out bytes per second). Beside them, in
// the same run: OpenBLAS cblas_sgemv on the same shape (the speed baseline)
// and a read-bandwidth probe (W threads summing a buffer of 256 MiB with
// 4-wide vector loads: the memory baseline), with the ratios. For spe it
// also reports the DMA bytes per call against the weight bytes.
//
// The reference backend is single-threaded by design (it is the oracle);
// spu-host is left out by default: its time measures the host's emulation of
// SPU arithmetic, not anything a Cell would do.
//
// Not thread-safe (it sets the spe options and OpenBLAS threads, restoring
// them at the end). Allocates up to ~600 MiB during the run.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <vector>

namespace cellshard::bench {

struct kernels_bench_options {
  int rows = 0;          // with cols: one custom shape instead of the default set
  int cols = 0;
  int workers = 0;       // threads for every multi-threaded backend; 0 = hardware threads
  double min_seconds = 0.25;  // per measurement (at least 2 and at most 50 calls)
  int probe_mib = 256;        // size of the read-bandwidth probe's buffer
  std::vector<std::string> backends = {"reference", "blas", "native", "spe"};
  /// Time with the calling thread's CPU clock instead of wall time (and the
  /// probe with its threads' CPU clocks): for a machine shared with other
  /// work. Only meaningful with workers == 1 (other threads' time is not seen).
  bool cpu_time = false;
  /// native's level for the run ("portable", "avx2", "avx512", "avx512vnni",
  /// "neon"; empty = the best this CPU runs), as native::set_isa: a lower
  /// level than the CPU's measures that level's kernels (e.g. AVX2 on an
  /// AVX-512 machine). An unknown or unsupported level is an error (1).
  std::string isa;
};

/// One measured row (the shape of CLI.md's bench JSON): value with unit, and
/// the same-run baseline with ratio = value / baseline when there is one.
struct kernels_bench_row {
  std::string name;
  std::map<std::string, std::string> params;
  double value = 0;
  std::string unit;
  double baseline = -1;  // < 0: none
  std::string baseline_name;
  double ratio = 0;
};

/// Runs the benchmark, prints a table to `out`, fills `rows`. Returns 0, or
/// 1 after printing an error to `out` (unknown backend, allocation failure,
/// a kernel error).
int run_kernels_bench(const kernels_bench_options& o, std::ostream& out,
                      std::vector<kernels_bench_row>& rows);

/// Same, and `json_out` (if not null) receives the rows as a JSON array.
int run_kernels_bench(const kernels_bench_options& o, std::ostream& out, std::string* json_out);

/// Rows as JSON text (an array of objects: name, params, value, unit,
/// baseline, baseline_name, ratio).
std::string kernels_bench_json(const std::vector<kernels_bench_row>& rows);

}  // namespace cellshard::bench
