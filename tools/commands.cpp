#include "tools/commands.hpp"

namespace cellshard::tools {
void add_commands(CLI::App& app, int& status) {
  add_run(app, status);
#if defined(CELLSHARD_DAEMON_ONLY)
  // The daemon-only build (CMake option CELLSHARD_DAEMON_ONLY): run and node.
  add_node(app, status);
#else
  add_synth(app, status);
  add_bench(app, status);
  add_chaos(app, status);
  add_sweep(app, status);
  add_node(app, status);
  add_bench_net(app, status);
  add_plan(app, status);
  add_quantize(app, status);
  add_certs(app, status);
  add_status(app, status);
  add_tokenize(app, status);
  add_inspect(app, status);
  add_serve(app, status);
  add_bench_serve(app, status);
#endif
}
}  // namespace cellshard::tools
