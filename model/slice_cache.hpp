// model/slice_cache.hpp: a node's cache of slice images (`cellshard node
// --cache DIR --cache-max BYTES`, issue #17).
//
// One file per slice, named by its manifest key (model::manifest::key(),
// "0x<16 hex>.slice"), holding the slice image (model/manifest.hpp). get()
// verifies every entry's digest before it hands the bytes out: a corrupt or
// truncated file is removed and reported as a miss (with the reason), so the
// caller fetches it again. put() writes to a temporary file and renames it
// (a crash leaves no half file under a key), evicting the least recently
// used slices (by modification time, which get() refreshes) until the new
// one fits under max_bytes; a slice larger than max_bytes is refused with an
// error saying so. max_bytes 0: unbounded.
//
// Ownership: a value; it keeps no file open. Thread safety: none (the
// daemon actor is its only user). Errors name the folder or file and the
// sizes involved.
#pragma once

#include "model/manifest.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::model {

class slice_cache {
public:
  /// Creates `dir` when missing. Errors: not a folder, not writable.
  static result<slice_cache> open(const std::string& dir, uint64_t max_bytes);

  struct lookup {
    bool found = false;
    std::vector<uint8_t> bytes;  // the verified slice image when found
    std::string dropped;         // when a file was there but corrupt: why it was removed
  };
  /// The slice of `m` when cached and intact (refreshes its LRU time).
  result<lookup> get(const manifest& m);
  /// Stores a verified slice image, evicting least recently used slices.
  /// Errors: larger than max_bytes ("no room"), a failed write.
  result<void> put(const manifest& m, const uint8_t* bytes, uint64_t n);
  /// True when a slice of n bytes can be stored (n <= max_bytes or unbounded).
  bool fits(uint64_t n) const { return max_ == 0 || n <= max_; }
  /// Bytes of the slice files in the folder now.
  uint64_t used() const;
  struct usage_figures {
    uint64_t bytes = 0;    // of the slice files
    uint64_t entries = 0;  // slice files
  };
  /// Bytes and number of the slice files in the folder now (one listing).
  usage_figures usage() const;
  /// True when a file for the slice of manifest key `key` (manifest::digest())
  /// is in the folder (not verified: get() does that).
  bool holds(uint64_t key) const;
  const std::string& dir() const { return dir_; }
  uint64_t max_bytes() const { return max_; }
  /// The file of a key (for tests and messages).
  std::string path_of(const manifest& m) const;

private:
  std::string dir_;
  uint64_t max_ = 0;
};

}  // namespace cellshard::model
