// examples/embed/embed_faults.cpp: four in-process nodes run the model as a
// pipeline; the shard at placement index 1 is crashed at position 20, the
// supervisor restarts it from its checkpoint, and the output is the same as
// without the fault. Shows: topology, injected faults, recovery reports.
//
//   embed_faults MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]
//
// Prints the placement, the ids, and one line per fault and recovery.
#include <cellshard/cluster.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL.bin TOKENIZER.bin [PROMPT] [STEPS]\n", argv[0]);
    return 2;
  }
  cellshard::cluster_options opts;
  opts.model_path = argv[1];
  opts.tokenizer_path = argv[2];
  opts.layout = cellshard::topology::pipeline();
  cellshard::fault crash;
  crash.kind = cellshard::fault_kind::crash;
  crash.node = 1;   // placement index
  crash.step = 20;  // token position
  opts.faults.push_back(crash);
  auto c = cellshard::cluster::start(opts, cellshard::hosts::in_process(4));
  if (!c) {
    std::fprintf(stderr, "error (%s): %s\n", cellshard::error_code_name(c.code()), c.message().c_str());
    return 1;
  }
  std::printf("placement: %s\n", (*c)->describe_placement().c_str());
  cellshard::generation_request req;
  req.prompt = argc > 3 ? argv[3] : "";
  req.steps = argc > 4 ? std::atoi(argv[4]) : 64;
  req.temperature = 0.0f;
  auto g = (*c)->generate(req);
  if (!g) {
    std::fprintf(stderr, "error (%s) after %zu tokens: %s\n", cellshard::error_code_name(g.code()),
                 g.err().partial.ids.size(), g.message().c_str());
    return 1;
  }
  std::printf("ids: ");
  for (size_t i = 0; i < g->ids.size(); ++i) std::printf(i ? ",%d" : "%d", g->ids[i]);
  std::printf("\n");
  for (const auto& f : (*c)->faults())
    std::printf("fault: %s on placement index %d (node %d), detected in %.1f ms\n", f.kind.c_str(), f.index,
                f.node, f.detect_ms);
  for (const auto& r : g->recoveries)
    std::printf("recovery: at position %d, restored to %d, %d positions replayed, %.1f ms\n", r.position,
                r.restored_to, r.replayed_positions, r.recover_ms);
  std::printf("recoveries: %zu\n", g->recoveries.size());
  return 0;
}
