// cellshard: the command line (../shared/docs/CLI.md is the contract).
// Exit status: 0 success; 1 error (message on stderr naming what and where);
// 2 usage; 3 output differs from --expect-ids.
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  CLI::App app{"cellshard: a Llama-family model split across many weak nodes as CAF actors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "cellshard 0.1.0");
  int status = 0;
  cellshard::tools::add_commands(app, status);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const cellshard::tools::cli_error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cellshard: error: %s\n", e.what());
    return e.code;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cellshard: error: %s\n", e.what());
    return 1;
  }
  return status;
}
