// supervision/checkpoint.hpp: checksummed checkpoint archives, full snapshots
// and delta chains, in memory or in files. CAF-free.
//
// Positions: a checkpoint's `end` is exclusive -- the state covers positions
// [0, end) (a snapshot) or [begin, end) (a delta); replay resumes at `end`.
//
// Archive format (version 1; all integers little-endian, independent of the
// host, so a big-endian PPE reads what an x86 host wrote):
//   off  0  magic "CSCK"                      4 bytes
//   off  4  format version                     u16 = 1
//   off  6  kind                               u8: 1 snapshot, 2 delta
//   off  7  reserved                           u8 = 0
//   off  8  body length L                      u64
//   off 16  body: cereal PortableBinaryOutputArchive of
//           (key: string, begin: u64, end: u64, payload: vector<u8>)
//   off 16+L  XXH64 (seed 0) of bytes [0, 16+L)  u64
// The checksum is verified before cereal sees any byte; a flipped byte
// anywhere is reported as "checksum mismatch" (or a bad magic/length). The
// key and range inside the body must match the archive's name.
//
// Storage: a blob_store maps names to byte blobs. Names are
//   <key>/full/<end, 20 digits>  and  <key>/delta/<begin, 20 digits>-<end, 20 digits>
// with '%' and '/' in the key percent-escaped, so names sort numerically.
// memory_blob_store keeps them in a map (the owner keeps the store off the
// node whose state it protects); file_blob_store keeps one file per name in a
// directory (written to a temporary file and renamed, so a crash mid-write
// leaves the previous archive intact).
//
// Thread safety: the blob stores lock internally; checkpoint_store holds no
// mutable state of its own besides the backend, so it is as thread-safe as its
// backend (prune/append_delta are read-modify-write: one writer per key).
// Errors: every fallible call returns cellshard::result; messages name the key,
// position and cause. cereal exceptions are caught and turned into errors.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <cellshard/result.hpp>

namespace cellshard::supervision {

using bytes = std::vector<std::uint8_t>;

/// Maps names to blobs.
class blob_store {
public:
  virtual ~blob_store() = default;
  virtual result<void> put(const std::string& name, const bytes& data) = 0;
  virtual result<bytes> get(const std::string& name) const = 0;
  /// Names starting with `prefix`, sorted ascending.
  virtual result<std::vector<std::string>> list(const std::string& prefix) const = 0;
  /// Removing a missing name is not an error.
  virtual result<void> erase(const std::string& name) = 0;
};

class memory_blob_store final : public blob_store {
public:
  result<void> put(const std::string& name, const bytes& data) override;
  result<bytes> get(const std::string& name) const override;
  result<std::vector<std::string>> list(const std::string& prefix) const override;
  result<void> erase(const std::string& name) override;
  /// Total payload bytes held.
  std::size_t bytes_held() const;

private:
  mutable std::mutex mu_;
  std::map<std::string, bytes> blobs_;
};

class file_blob_store final : public blob_store {
public:
  /// Creates `dir` (and parents) if needed.
  static result<std::shared_ptr<file_blob_store>> open(const std::string& dir);

  result<void> put(const std::string& name, const bytes& data) override;
  result<bytes> get(const std::string& name) const override;
  result<std::vector<std::string>> list(const std::string& prefix) const override;
  result<void> erase(const std::string& name) override;
  /// The file that holds `name`.
  std::string path_of(const std::string& name) const;

private:
  explicit file_blob_store(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  mutable std::mutex mu_;
};

/// A restored snapshot.
struct checkpoint {
  std::string key;
  std::uint64_t end = 0;        ///< state covers [0, end)
  bytes payload;
  /// Newer archives that failed verification and were skipped, newest first,
  /// each "<name>: <cause>". Empty when the newest archive was good.
  std::vector<std::string> skipped;
};

/// One delta of a chain.
struct delta {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;        ///< covers [begin, end)
  bytes payload;
};

/// The consistent prefix of a key's delta chain.
struct delta_chain {
  std::string key;
  std::uint64_t begin = 0;      ///< where the chain starts (the `from` asked for)
  std::uint64_t end = 0;        ///< highest consistent position c: [begin, c) is covered
  std::vector<delta> parts;     ///< contiguous, in order
  /// Why the chain stops before the newest stored delta ("" = it does not):
  /// a corrupt archive (checksum mismatch...), a gap, or the `up_to` limit.
  std::string stopped;
  /// The payloads of `parts` concatenated.
  bytes concatenated() const;
};

struct checkpoint_options {
  /// Snapshots kept per key after each save (oldest dropped first); 0 = keep
  /// all. 2 = the newest plus one to fall back to if the newest is corrupt.
  std::size_t keep_snapshots = 2;
};

class checkpoint_store {
public:
  /// Defaults to a fresh memory_blob_store.
  explicit checkpoint_store(std::shared_ptr<blob_store> backend = nullptr,
                            checkpoint_options opts = {});

  // -- snapshots ------------------------------------------------------------

  /// Stores a snapshot of `key` covering [0, end); replaces one with the same end.
  result<void> save(const std::string& key, std::uint64_t end, const bytes& payload);

  /// The newest snapshot with end <= at_most that verifies; corrupt newer
  /// ones are skipped (listed in checkpoint::skipped). Error when none is
  /// stored ("no checkpoint") or none verifies (every cause listed).
  result<checkpoint> restore(const std::string& key,
                             std::uint64_t at_most = std::numeric_limits<std::uint64_t>::max()) const;

  /// Exactly the snapshot ending at `end`; a corrupt one is an error
  /// ("checkpoint 'k' end 40: checksum mismatch (stored 0x..., computed 0x...)").
  result<checkpoint> restore_exact(const std::string& key, std::uint64_t end) const;

  /// Ends of the stored snapshots of `key`, ascending (not verified).
  result<std::vector<std::uint64_t>> snapshots(const std::string& key) const;

  /// Keeps the newest `keep` snapshots of `key`.
  result<void> prune(const std::string& key, std::size_t keep);

  // -- deltas ---------------------------------------------------------------

  /// Stores the delta [begin, end) of `key` (begin < end). Deltas of `key`
  /// that reach past `begin` (end > begin) are removed first: a new chain
  /// written after a recovery at `begin` supersedes the old future.
  result<void> append_delta(const std::string& key, std::uint64_t begin, std::uint64_t end,
                            const bytes& payload);

  /// Walks the deltas from `from`: each must begin where the previous ended
  /// and verify; stops at the first gap or corrupt archive, and before any
  /// delta ending past `up_to`. Never an error for a corrupt delta (the
  /// chain just ends there, with `stopped` saying why); an error only when
  /// the backend cannot list.
  result<delta_chain> restore_deltas(
      const std::string& key, std::uint64_t from = 0,
      std::uint64_t up_to = std::numeric_limits<std::uint64_t>::max()) const;

  /// Removes deltas of `key` with end <= before (e.g. after a snapshot at `before`).
  result<void> drop_deltas_before(const std::string& key, std::uint64_t before);

  // -- both -----------------------------------------------------------------

  /// Removes every archive of `key`.
  result<void> erase(const std::string& key);

  blob_store& backend() { return *backend_; }
  const blob_store& backend() const { return *backend_; }

  /// Archive names (for tests and tooling).
  static std::string snapshot_name(const std::string& key, std::uint64_t end);
  static std::string delta_name(const std::string& key, std::uint64_t begin, std::uint64_t end);

  // -- typed payloads (any cereal-serialisable T) ------------------------------

  template <class T>
  result<void> save_object(const std::string& key, std::uint64_t end, const T& value) {
    auto b = to_bytes(value);
    if (!b) return b.err();
    return save(key, end, *b);
  }

  template <class T>
  result<std::pair<std::uint64_t, T>> restore_object(
      const std::string& key,
      std::uint64_t at_most = std::numeric_limits<std::uint64_t>::max()) const {
    auto c = restore(key, at_most);
    if (!c) return c.err();
    auto v = from_bytes<T>(c->payload);
    if (!v) return cellshard::make_error("checkpoint '" + key + "' end " + std::to_string(c->end) + ": " +
                                         v.message());
    return std::make_pair(c->end, std::move(*v));
  }

  /// cereal portable-binary encoding of `value`.
  template <class T>
  static result<bytes> to_bytes(const T& value) {
    try {
      std::ostringstream os(std::ios::binary);
      {
        // Little-endian whatever the host: cereal's default is the host's order,
        // which made a big-endian node's archives (and their XXH64) differ.
        cereal::PortableBinaryOutputArchive ar(os, cereal::PortableBinaryOutputArchive::Options::LittleEndian());
        ar(value);
      }
      auto s = os.str();
      return bytes(s.begin(), s.end());
    } catch (const std::exception& e) {
      return cellshard::make_error(std::string("cannot serialise payload: ") + e.what());
    }
  }

  template <class T>
  static result<T> from_bytes(const bytes& data) {
    try {
      std::istringstream is(std::string(data.begin(), data.end()), std::ios::binary);
      cereal::PortableBinaryInputArchive ar(is);
      T value{};
      ar(value);
      return value;
    } catch (const std::exception& e) {
      return cellshard::make_error(std::string("cannot deserialise payload: ") + e.what());
    }
  }

private:
  std::shared_ptr<blob_store> backend_;
  checkpoint_options opts_;
};

/// Encodes one archive (format above). kind: 1 snapshot, 2 delta.
bytes encode_archive(std::uint8_t kind, const std::string& key, std::uint64_t begin,
                     std::uint64_t end, const bytes& payload);

struct decoded_archive {
  std::uint8_t kind = 0;
  std::string key;
  std::uint64_t begin = 0, end = 0;
  bytes payload;
};

/// Verifies and decodes one archive; the error says what is wrong.
result<decoded_archive> decode_archive(const bytes& archive);

}  // namespace cellshard::supervision
