// model/synth.hpp: seeded random llama2.c checkpoints, for benchmarks and for
// tests bigger than any real model at hand. The layout is exactly a real
// file's (header, weights in run.c's order, the RoPE tables export.py writes,
// the classifier when unshared), so the loader's exact-size check applies.
//
// Weights are uniform in [-a, a] with a = sqrt(3 / fan_in) (variance 1/fan_in,
// the classic Xavier/LeCun scaling) so activations stay O(1) through the
// layers; norm weights are 1. The generator is splitmix64 (Steele et al.,
// "Fast splittable pseudorandom number generators", 2014), so the bytes depend
// only on the config and the seed, on every platform.
#pragma once

#include "model/config.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cellshard::model {

/// Presets: stories260k, stories15m, stories42m, stories110m (HARDWARE.md,
/// from llama2.c's README model table and doc/stories260K.md).
result<config> synth_preset(const std::string& name);

/// Streams a checkpoint to `sink` (called with chunks of bytes, little-endian).
void synth_write(const config& c, uint64_t seed,
                 const std::function<void(const void*, size_t)>& sink);
/// Writes a checkpoint file; errors name the file.
result<void> synth_file(const config& c, uint64_t seed, const std::string& path);
/// The checkpoint as bytes in memory.
std::vector<uint8_t> synth_bytes(const config& c, uint64_t seed);

/// A GGUF image (version 3, little-endian, every tensor F32) of seeded random
/// weights, for mixture-of-experts models (llama2.c has no MoE format; dense
/// configs work too). Architecture "llama" (Mixtral-style: router, 3-D expert
/// tensors, renormalised top-k) when c.shared_hidden is 0, else "qwen2moe"
/// (a shared expert of c.shared_hidden units with its sigmoid gate, Q/K/V
/// biases, NEOX RoPE, no renormalisation); a dense config (no experts) with
/// c.arch "qwen2" gives architecture "qwen2" (Q/K/V biases, NEOX RoPE).
/// The RMSNorm epsilon and RoPE base are c.rms_eps and c.rope_theta. Tensor
/// names and shapes as
/// model/gguf_model.cpp reads them, output.weight only when
/// !c.shared_classifier. Matrices uniform in [-a, a], a = sqrt(3 / fan_in);
/// the embedding's rows at 1/dim variance as synth_write's; norm weights
/// 1 + 0.1 u and biases 0.1 u (u uniform in [-1, 1)) so that they matter.
/// No tokenizer keys: pass a tokenizer of c.vocab_size tokens with -z.
/// Requires c.n_experts_used <= c.n_experts (checked by the loader).
std::vector<uint8_t> synth_gguf(const config& c, uint64_t seed);
/// Writes synth_gguf(c, seed) to `path`; errors name the file.
result<void> synth_gguf_file(const config& c, uint64_t seed, const std::string& path);

}  // namespace cellshard::model
