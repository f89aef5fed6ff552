// actors/weight_server.hpp: the front end's side of weight shipping (issue
// #17). A weight_store holds the front end's model file and the manifests
// (model/manifest.hpp) of the slices it asked daemons to spawn; the weight
// server actor answers a daemon's slice_fetch with the bytes of a slice
// image (read from the file's image through the manifest's offsets) and
// their XXH3-64 digest. A daemon that lacks a slice pulls it chunk by chunk
// over the same CAF connection (TLS when the cluster uses it) while the
// front end's spawn waits (actors/remote.cpp).
//
// Ownership: the store refers to the model_file it was made with, which must
// outlive the store and the server (the cluster holds both; remote_host
// stops the server in shutdown()). Thread safety: weight_store's functions
// may be called from any thread (a mutex guards the manifests).
#pragma once

#include "actors/messages.hpp"
#include "model/manifest.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace cellshard::actors {

/// Bytes per shipped chunk (the last chunk of a slice may be shorter); the
/// daemon's daemon_options::chunk_bytes must be the same.
constexpr uint64_t slice_chunk_bytes = 1u << 20;

class weight_store {
public:
  /// `name`: the file name manifests carry (no folder).
  weight_store(const model::model_file& file, std::string name);
  /// The manifest of a slice (made once per slice and remembered, so a
  /// recovery spawn does not digest the slice again). Errors as
  /// model::make_manifest.
  result<model::manifest> manifest_for(const model::slice_spec& spec);
  /// A slice_fetch's answer (an error in slice_chunk::error for an unknown
  /// key or a range outside the slice).
  slice_chunk read(const slice_fetch& f);
  /// Test hook: the next `n` chunks go out with a wrong digest.
  void corrupt_next_chunks(int n) { corrupt_.store(n); }
  /// Steady-clock ns of the last chunk served (0: none): a spawn that waits
  /// for a daemon which is still fetching extends its deadline by it.
  int64_t last_activity_ns() const { return last_.load(); }
  uint64_t served_bytes() const { return served_.load(); }

private:
  const model::model_file& file_;
  std::string name_;
  std::mutex mu_;
  std::map<std::string, model::manifest> by_spec_;
  std::map<uint64_t, model::manifest> by_key_;
  std::atomic<int> corrupt_{0};
  std::atomic<int64_t> last_{0};
  std::atomic<uint64_t> served_{0};
};

/// The server actor (hidden) answering slice_fetch from `store`.
caf::actor spawn_weight_server(caf::actor_system& sys, std::shared_ptr<weight_store> store);

}  // namespace cellshard::actors
