// actors/weight_server.hpp: the front end's side of weight shipping (issue
// #17). A weight_store holds the front end's model file and the manifests
// (model/manifest.hpp) of the slices it asked daemons to spawn, and reads a
// chunk of a slice image (from the file's image through the manifest's
// offsets) with its XXH3-64 digest. A slice_shipment is one slice on its way
// to one daemon that answered a spawn with "need": remote_host::spawn sends
// the chunks it hands out, over the same CAF connection (TLS when the
// cluster uses it), keeping up to `window` of them in flight: each
// slice_ack of the daemon lets the next one go, and a chunk that failed the
// daemon's check goes again (at most max_tries times). A window rather than
// every chunk at once: CAF's BASP broker serialises a whole mailbox of 1 MiB
// chunks into one growing buffer before it writes any, and the broker's
// thread then serves no heartbeat (docs/distributed.md, "Shipping speed");
// rather than one chunk per round trip: the link and both sides' copies and
// digests overlap. The shipment runs on the thread of the spawn that waits
// for it (no actor of its own: a spawn blocks a scheduler thread, and with
// every scheduler thread so blocked an actor would never run).
//
// The weight server actor answers a slice_fetch with that chunk (a pull
// endpoint); its handle in shard_spawn tells a daemon that this front end
// ships slices.
//
// Ownership: the store refers to the model_file it was made with, which must
// outlive the store, the server and every shipment (the cluster holds them;
// remote_host stops the server in shutdown()). Thread safety: weight_store's
// functions may be called from any thread (a mutex guards the manifests); a
// slice_shipment belongs to one thread.
#pragma once

#include "actors/messages.hpp"
#include "model/manifest.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

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
  /// A chunk of slice `f.key` (an error in slice_chunk::error for an unknown
  /// key or a range outside the slice).
  slice_chunk read(const slice_fetch& f);
  /// Test hook: the next `n` chunks go out with a wrong digest.
  void corrupt_next_chunks(int n) { corrupt_.store(n); }
  /// Steady-clock ns of the last chunk served or acknowledged (0: none): a
  /// spawn that waits for a daemon which is still receiving its slice
  /// extends its deadline by it.
  int64_t last_activity_ns() const { return last_.load(); }
  void touch();
  uint64_t served_bytes() const { return served_.load(); }
  const std::string& name() const { return name_; }
  uint64_t file_bytes() const;

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

/// One slice being shipped to one daemon (see the top of this file).
class slice_shipment {
public:
  /// `total`: the slice image's bytes (model::manifest::bytes()).
  slice_shipment(std::shared_ptr<weight_store> store, uint64_t key, uint64_t total, int window = 2,
                 int max_tries = 4);
  /// The chunks to send now (header and body), keeping `window` in flight.
  std::vector<std::pair<slice_fetch, slice_chunk>> next();
  /// A daemon's answer to one of the chunks. An answer for another slice is
  /// ignored (returns false).
  bool ack(const slice_ack& a);
  /// Every chunk stored, or the shipment gave up (a chunk failed max_tries
  /// times, or the daemon expects no such slice): send the spawn again.
  bool done() const;
  bool gave_up() const { return give_up_; }
  uint64_t key() const { return key_; }
  int in_flight() const { return in_flight_; }

private:
  std::shared_ptr<weight_store> store_;
  uint64_t key_ = 0, total_ = 0;
  int window_ = 2, max_tries_ = 4;
  uint64_t next_ = 0;              // first offset not shipped yet
  std::deque<uint64_t> again_;     // offsets that failed the daemon's check
  std::map<uint64_t, int> tries_;  // shipments per offset
  int in_flight_ = 0;
  bool give_up_ = false;
};

/// The server actor (hidden) answering slice_fetch from `store`.
caf::actor spawn_weight_server(caf::actor_system& sys, std::shared_ptr<weight_store> store);

}  // namespace cellshard::actors
