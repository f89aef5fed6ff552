// tools/bench.hpp: `cellshard bench` rows and the cluster benchmark.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cellshard::tools {

/// One measured row: name, parameters, value with unit, and the baseline
/// measured in the same run with the ratio value / baseline (CLI.md "bench").
struct bench_row {
  std::string name;
  std::map<std::string, std::string> params;
  double value = 0;
  std::string unit;
  double baseline = -1;  // < 0: none
  std::string baseline_name;
  double ratio = 0;
};

struct cluster_bench_options {
  std::string model, tokenizer;
  std::vector<int> nodes = {1, 2, 4, 8};
  int steps = 128;        // stories260K
  int large_steps = 12;   // synthetic stories110m
  int reps = 3;
  bool skip_large = false;
  std::string kernels = "blas";
  int caf_threads = 2;
};

int run_cluster_bench(const cluster_bench_options& o, std::vector<bench_row>& rows);

struct recovery_bench_options {
  std::string model, tokenizer;
  int nodes = 3;                                  // + 1 spare
  std::vector<int> checkpoint_every = {4, 16, 64};
  std::vector<int> contexts = {37, 133, 301};     // positions at which the fault fires (greedy
                                                  // stories260K reaches 346 before BOS)
};

int run_recovery_bench(const recovery_bench_options& o, std::vector<bench_row>& rows);

/// Prints rows as a table and returns them as JSON text.
std::string print_rows(const std::vector<bench_row>& rows);

}  // namespace cellshard::tools
