// Shared by the actor tests: run a fixture case through a cluster.
#pragma once

#include "actors/cluster.hpp"
#include "tests/support.hpp"

namespace cellshard::test {

inline model::generation_params params_of(const fixture_case& fc) {
  model::generation_params gp;
  gp.prompt = fc.prompt;
  gp.steps = fc.steps;
  gp.sampling = {fc.temperature, fc.topp, fc.seed ? fc.seed : 1};
  return gp;
}

inline actors::cluster_options stories_options(int nodes, const std::string& topology) {
  actors::cluster_options o;
  o.model = shared_file("models/stories260K.bin");
  o.tokenizer = shared_file("models/tok512.bin");
  o.nodes = nodes;
  o.topology = topology;
  o.step_timeout = std::chrono::seconds(60);
  return o;
}

}  // namespace cellshard::test
