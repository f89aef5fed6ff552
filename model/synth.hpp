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

}  // namespace cellshard::model
