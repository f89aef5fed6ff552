// tools/common.hpp: pieces shared by the cellshard subcommands.
#pragma once

#include "model/checkpoint.hpp"
#include "model/tokenizer.hpp"

#include <memory>
#include <stdexcept>
#include <string>

namespace cellshard::tools {

/// A failure that ends the command with exit status `code` and `what()` on stderr.
struct cli_error : std::runtime_error {
  cli_error(const std::string& msg, int code = 1) : std::runtime_error(msg), code(code) {}
  int code;
};

/// Upper bound of --threads (kernel threads per node) on run, serve, node and
/// bench: beyond it a run spends minutes creating threads (5000: 12 s).
constexpr int max_kernel_threads = 1024;

/// The model and tokenizer a command runs, and where they came from.
struct loaded_model {
  std::shared_ptr<const model::model_file> file;
  std::shared_ptr<const model::tokenizer> tok;
  std::string description;  // "stories260K.bin + tok512.bin from ./models" etc.
};

/// -m/-z resolution of CLI.md: with -m, -z defaults to tokenizer.bin in the
/// model's folder; without -m, the default model lookup ($CELLSHARD_MODELS or
/// ./models, else the built-in synthetic model). Checks that the tokenizer's
/// vocabulary matches the model's. Throws cli_error.
/// `ctx` > 0 overrides the model's context length (--ctx).
loaded_model load_model(const std::string& model_path, const std::string& tokenizer_path,
                        bool force_swap = false, int ctx = 0);

/// Writes `text` to `path` ("-" = stdout); throws cli_error naming the file.
void write_text(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);

}  // namespace cellshard::tools
