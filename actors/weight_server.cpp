#include "actors/weight_server.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <xxhash.h>

namespace cellshard::actors {

weight_store::weight_store(const model::model_file& file, std::string name) : file_(file), name_(std::move(name)) {}

result<model::manifest> weight_store::manifest_for(const model::slice_spec& spec) {
  const std::string k = spec.to_string();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_spec_.find(k);
    if (it != by_spec_.end()) return it->second;
  }
  auto m = model::make_manifest(file_, spec, name_);
  if (!m) return m;
  std::lock_guard<std::mutex> lock(mu_);
  by_spec_[k] = *m;
  by_key_[m->digest()] = *m;
  return m;
}

slice_chunk weight_store::read(const slice_fetch& f) {
  slice_chunk out;
  out.offset = f.offset;
  constexpr uint64_t max_chunk = 4u << 20;
  model::manifest m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_key_.find(f.key);
    if (it == by_key_.end()) {
      out.error = "the front end has no slice " + model::format_digest(f.key) + " of " + name_;
      return out;
    }
    m = it->second;
  }
  if (f.length > max_chunk) {
    out.error = "chunk of " + std::to_string(f.length) + " bytes asked, at most " + std::to_string(max_chunk);
    return out;
  }
  out.bytes.resize(f.length);
  auto r = model::copy_slice_bytes(m, file_.image(), f.offset, f.length, reinterpret_cast<uint8_t*>(out.bytes.data()));
  if (!r) {
    out.error = r.message();
    out.bytes.clear();
    return out;
  }
  out.digest = XXH3_64bits(out.bytes.data(), out.bytes.size());
  for (int c = corrupt_.load(); c > 0;)
    if (corrupt_.compare_exchange_weak(c, c - 1)) {
      out.digest ^= 1;
      break;
    }
  served_ += f.length;
  last_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return out;
}

caf::actor spawn_weight_server(caf::actor_system& sys, std::shared_ptr<weight_store> store) {
  return sys.spawn<caf::hidden>([store](caf::event_based_actor*) -> caf::behavior {
    return {
        [store](slice_fetch& f) -> slice_chunk { return store->read(f); },
    };
  });
}

}  // namespace cellshard::actors
