// tests/model/gguf_swap.hpp: a GGUF image rewritten in the other byte order
// (every metadata number and every tensor's elements), for tests of the
// big-endian load path on either host: what a big-endian exporter writes.
#pragma once

#include "kernels/types.hpp"
#include "model/gguf.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace cellshard::test {

/// The bytes of `g` in the other byte order (GGUF version 3). REQUIREs that
/// every tensor type has a kernels dtype.
inline std::vector<uint8_t> gguf_swapped(const model::gguf::file& g) {
  model::gguf::writer w;
  for (const auto& k : g.keys()) w.copy_value(k, *g.find(k));
  for (const auto& t : g.tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.bytes);
    kernels::dtype dt;
    REQUIRE(kernels::dtype_from_ggml(t.type, &dt));
    kernels::swap_rows(dt, data.data(), static_cast<int>(t.rows()), static_cast<int>(t.ne[0]));
    w.add_tensor(t.name, t.ne, t.type, std::move(data));
  }
  return w.bytes(3, true);
}

}  // namespace cellshard::test
