// examples/embed/embed_daemons.cpp: a cluster of two node daemons (separate
// `cellshard node` processes on loopback) started by this program, the model
// split over them as a pipeline; then one daemon is killed and the cluster,
// with a third daemon held as a spare, carries on. Shows: daemon_set, hosts
// from daemons, recovery across processes.
//
//   embed_daemons CELLSHARD_BINARY MODELS_DIR MODEL_FILE TOKENIZER_FILE [PROMPT] [STEPS]
//
// MODELS_DIR holds both files (each daemon opens its own copy by file name).
// Prints the ids, then the faults the cluster saw.
#include <cellshard/cluster.hpp>
#include <cellshard/daemons.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s CELLSHARD_BINARY MODELS_DIR MODEL_FILE TOKENIZER_FILE [PROMPT] [STEPS]\n",
                 argv[0]);
    return 2;
  }
  cellshard::daemon_set::options dopts;
  dopts.binary = argv[1];
  dopts.models_dir = argv[2];
  auto daemons = cellshard::daemon_set::start(2, 1, dopts);  // 2 working, 1 spare
  if (!daemons) {
    std::fprintf(stderr, "error (%s): %s\n", cellshard::error_code_name(daemons.code()), daemons.message().c_str());
    return 1;
  }
  auto where = (*daemons)->hosts();
  if (!where) {
    std::fprintf(stderr, "error: %s\n", where.message().c_str());
    return 1;
  }
  cellshard::cluster_options opts;
  opts.model_path = std::string(argv[2]) + "/" + argv[3];
  opts.tokenizer_path = std::string(argv[2]) + "/" + argv[4];
  auto c = cellshard::cluster::start(opts, *where);
  if (!c) {
    std::fprintf(stderr, "error (%s): %s\n", cellshard::error_code_name(c.code()), c.message().c_str());
    return 1;
  }
  std::printf("placement: %s\n", (*c)->describe_placement().c_str());
  cellshard::generation_request req;
  req.prompt = argc > 5 ? argv[5] : "";
  req.steps = argc > 6 ? std::atoi(argv[6]) : 64;
  req.temperature = 0.0f;
  // Kill the daemon of stage 1 once 10 tokens came out (kill() only sends the
  // signal: allowed from the token callback).
  std::atomic<int> seen{0};
  auto* d = daemons->get();
  auto g = (*c)->generate(req, [&](int, std::string_view) {
    if (++seen == 10) d->kill(1);
    return true;
  });
  if (!g) {
    std::fprintf(stderr, "error (%s) after %zu tokens: %s\n", cellshard::error_code_name(g.code()),
                 g.err().partial.ids.size(), g.message().c_str());
    return 1;
  }
  std::printf("ids: ");
  for (size_t i = 0; i < g->ids.size(); ++i) std::printf(i ? ",%d" : "%d", g->ids[i]);
  std::printf("\n");
  for (const auto& f : (*c)->faults())
    std::printf("fault: %s on placement index %d (node %d), now on node %d\n", f.kind.c_str(), f.index, f.node,
                f.moved_to_node);
  std::printf("faults: %zu\n", (*c)->faults().size());
  return 0;
}
