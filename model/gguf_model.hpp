// model/gguf_model.hpp: writing GGUF models (the reading side is
// model_file::open, model/checkpoint.hpp, on top of model/gguf.hpp).
#pragma once

#include "kernels/types.hpp"
#include "model/checkpoint.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <vector>

namespace cellshard::model {

/// A GGUF image of `in` (a GGUF model) with every 2-D weight matrix and 3-D
/// expert tensor whose rows are whole 32-blocks re-quantized to `type` (q8_0
/// or q4_0; any supported source type is dequantized first); other tensors
/// (norms, MoE routers `ffn_gate_inp*`, rows not a multiple of 32) and every
/// metadata key are copied, general.file_type set.
/// Errors: input not GGUF, byte-swapped input, target type not q8_0/q4_0.
result<std::vector<uint8_t>> quantize_gguf(const model_file& in, kernels::dtype type);


}  // namespace cellshard::model
