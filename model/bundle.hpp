// model/bundle.hpp: a model file with its tokenizer, loaded and checked to
// belong together (same vocabulary size), as every front end needs them.
#pragma once

#include "model/checkpoint.hpp"
#include "model/result.hpp"
#include "model/tokenizer.hpp"

#include <memory>
#include <string>

namespace cellshard::model {

struct bundle {
  std::shared_ptr<const model_file> file;
  std::shared_ptr<const tokenizer> tok;
};

/// Opens `model_path` and `tokenizer_path` ("" = the GGUF's own tokenizer for
/// a GGUF model, else tokenizer.bin in the model's folder, as llama2.c's run;
/// a GGUF file given as the tokenizer works too) and checks that the tokenizer's vocabulary has
/// the model's size; errors name both files.
result<bundle> load_bundle(const std::string& model_path, const std::string& tokenizer_path,
                           load_options opts = {});

/// True when the file at `path` starts with the GGUF magic.
bool is_gguf_path(const std::string& path);

/// Checks an already loaded pair.
result<void> check_pair(const model_file& f, const tokenizer& t);

}  // namespace cellshard::model
