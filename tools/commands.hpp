// tools/commands.hpp: each subcommand registers itself on the CLI11 app; its
// callback runs the command and sets `status` (or throws cli_error).
#pragma once

#include <CLI/CLI.hpp>

namespace cellshard::tools {
void add_commands(CLI::App& app, int& status);
void add_run(CLI::App& app, int& status);
void add_synth(CLI::App& app, int& status);
void add_bench(CLI::App& app, int& status);
void add_chaos(CLI::App& app, int& status);
void add_sweep(CLI::App& app, int& status);
void add_node(CLI::App& app, int& status);
/// `bench net` (tools/bench_net.cpp); call after add_bench.
void add_bench_net(CLI::App& app, int& status);
void add_plan(CLI::App& app, int& status);
void add_quantize(CLI::App& app, int& status);
void add_certs(CLI::App& app, int& status);
void add_status(CLI::App& app, int& status);
void add_tokenize(CLI::App& app, int& status);
void add_inspect(CLI::App& app, int& status);
void add_serve(CLI::App& app, int& status);
/// `bench serve` (tools/bench_serve.cpp); call after add_bench.
void add_bench_serve(CLI::App& app, int& status);
}  // namespace cellshard::tools
