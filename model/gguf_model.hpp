// model/gguf_model.hpp: writing GGUF models (the reading side is
// model_file::open, model/checkpoint.hpp, on top of model/gguf.hpp).
#pragma once

#include "kernels/types.hpp"
#include "model/checkpoint.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <vector>

namespace cellshard::model {

/// What `cellshard quantize` writes from a GGUF model.
struct quantize_options {
  /// Type of the weight matrices: f16, bf16, q8_0, q4_0, q4_k or q6_k.
  kernels::dtype type = kernels::dtype::q8_0;
  /// false: the classifier (output.weight, or token_embd.weight when tied)
  /// follows llama-quantize's default rule: q6_K for q4_0, q4_K and q6_K when
  /// its rows are a multiple of 256, q8_0 otherwise; unchanged type for f16,
  /// bf16 and q8_0. true: every matrix in `type` (llama-quantize --pure).
  bool pure = false;
};

/// The classifier's type under `opt`'s rule for a row length of `cols`.
kernels::dtype classifier_type(kernels::dtype type, int64_t cols, bool pure);

/// A GGUF image of `in` (a GGUF model) with every 2-D weight matrix and 3-D
/// expert tensor re-quantized (any supported source type is dequantized
/// first, then ggml's reference quantizer of the target type runs on each
/// row: kernels::quantize_row). Copied as they are: every metadata key,
/// 1-D tensors (norms, biases, rope_freqs stay F32 as llama.cpp keeps them),
/// MoE routers `ffn_gate_inp*`, and matrices whose rows are not whole 32-blocks
/// for a 32-block type (stories260K's 172-wide ffn_down). general.file_type is
/// set to llama.cpp's llama_ftype (F16 1, Q4_0 2, Q8_0 7, Q4_K_S 14, Q6_K 18,
/// BF16 32), general.quantization_version to 2.
/// Errors (naming the file and tensor): input not GGUF, byte-swapped input,
/// a type without a writer, a K-quant asked of a matrix whose rows are not a
/// multiple of 256 (the message says llama.cpp falls back to q5_0 / q8_0).
result<std::vector<uint8_t>> quantize_gguf(const model_file& in, const quantize_options& opt);
/// quantize_gguf with pure = true (every matrix in `type`).
result<std::vector<uint8_t>> quantize_gguf(const model_file& in, kernels::dtype type);

}  // namespace cellshard::model
