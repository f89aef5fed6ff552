// Uses the public API from an outside project: start on a missing model file
// must fail with error_code::io or invalid_argument and a message naming it.
#include <cellshard/cluster.hpp>
#include <cellshard/daemons.hpp>

#include <cstdio>
#include <string>

int main() {
  cellshard::cluster_options o;
  o.model_path = "/nonexistent/model.bin";
  auto c = cellshard::cluster::start(o, cellshard::hosts::in_process(1));
  if (c) return 1;
  std::printf("%s: %s\n", cellshard::error_code_name(c.code()), c.message().c_str());
  return c.message().find("/nonexistent/model.bin") != std::string::npos ? 0 : 1;
}
