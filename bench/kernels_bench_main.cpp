// cellshard_kernels_bench: runs `bench kernels` on its own (the cellshard CLI
// offers the same as `cellshard bench kernels`).
#include "bench/kernels_bench.hpp"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  cellshard::bench::kernels_bench_options o;
  std::string json;
  CLI::App app{"matvec f32/q8_0 per kernel backend beside OpenBLAS sgemv and a read-bandwidth probe"};
  app.add_option("--rows", o.rows, "rows of one custom shape (with --cols)");
  app.add_option("--cols", o.cols, "columns of one custom shape (with --rows)");
  app.add_option("--workers", o.workers, "threads for blas/spe/sgemv/probe (0 = hardware)")
      ->capture_default_str();
  app.add_option("--backends", o.backends, "backends to measure")->delimiter(',')->capture_default_str();
  app.add_option("--min-seconds", o.min_seconds, "time per measurement")->capture_default_str();
  app.add_option("--probe-mib", o.probe_mib, "bandwidth probe buffer")->capture_default_str();
  app.add_option("--isa", o.isa, "native level: portable|avx2|avx512|avx512vnni|neon (default: the best here)");
  app.add_flag("--cpu-time", o.cpu_time,
               "time with thread CPU clocks instead of wall time (a shared machine; use with --workers 1)");
  app.add_option("--json", json, "rows as JSON to FILE (- = stdout)");
  CLI11_PARSE(app, argc, argv);
  std::string text;
  const int st = cellshard::bench::run_kernels_bench(o, std::cout, json.empty() ? nullptr : &text);
  if (json == "-") {
    std::cout << text;
  } else if (!json.empty()) {
    std::ofstream f(json);
    f << text;
    if (!f) {
      std::cerr << "cannot write " << json << "\n";
      return 1;
    }
  }
  return st;
}
