// model/manifest.hpp: which bytes of a model file one shard needs (issue #17).
//
// A weight manifest lists, for one slice_spec of one model file, every byte
// range the shard reads: the file's header and, per tensor, the rows (or, for
// a column slice such as wo and w2 under tensor parallelism, the run of
// columns in every row) that model::shard_weights::make views or copies.
// Each entry carries an XXH3-64 digest of its bytes, so a node verifies only
// what it holds, and reads only those bytes: a daemon holding 1/8 of the
// layers reads about 1/8 of the file.
//
// The slice image: the entries' bytes concatenated in manifest order (an
// entry's segments in order). That is what a node keeps in its cache and
// what the front end ships. open_slice() turns it back into a model_file
// without the whole file: a sparse image of the file's full size
// (model_file::from_sparse: anonymous memory, only the pages the slice writes
// become resident) with the header and the slice's bytes at their file
// offsets, so the ordinary loaders (llama2.c, GGUF) parse it unchanged and
// shard_weights::make views it as it views a mapped file. Reading outside the
// manifest yields zeros; shard_weights::make never does for this slice_spec
// (the entries mirror its slicing; tests/model/test_manifest.cpp checks that
// every slice gives the same logits from the slice image as from the file).
//
// Formats: llama2.c f32 files and GGUF files are sliced; a CSQ8 file (whose
// loader checks a digest of the whole file) is one entry holding the whole
// file.
//
// Byte order: a manifest and a slice image are of the file's own bytes
// (model_file::file_image()), never of a host's converted image, so a
// big-endian host (the PS3's PPE, s390x) makes the same manifest, key and
// slice as a little-endian one, and open_slice() converts the slice as
// model_file::open() converts the file.
//
// Units: offsets, lengths and strides in bytes of the file. Ownership:
// manifests are plain values. Thread safety: the functions are pure (they
// read the model_file, which is immutable). Errors name the file, the entry
// and what was expected.
#pragma once

#include "model/checkpoint.hpp"
#include "model/result.hpp"
#include "model/transformer.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::model {

/// One tensor slice: `count` segments of `length` bytes, segment i at file
/// offset `offset + i * stride` (count 1: one contiguous range).
struct manifest_entry {
  std::string name;   // "header", a GGUF tensor name, or a llama2.c field with its layer ("wq[3]")
  std::string type;   // element type ("f32", "q8_0", ...; "bytes" for the header / whole file)
  uint64_t offset = 0, length = 0, stride = 0, count = 1;
  uint64_t digest = 0;  // XXH3-64 of the segments' bytes in order
  uint64_t bytes() const { return length * count; }
  bool operator==(const manifest_entry& o) const;
};

struct manifest {
  std::string model_name;  // the model file's name (no folder), for messages
  std::string format;      // model_file::format_name()
  uint64_t file_bytes = 0; // size of the whole file
  std::vector<manifest_entry> entries;

  /// Bytes of the slice image (sum of the entries' bytes).
  uint64_t bytes() const;
  /// XXH3-64 over file_bytes and every entry's ranges and digest (not the
  /// names): the slice's identity, the key of a node's cache.
  uint64_t digest() const;
  /// "0x0123..." of digest(): a cache file name.
  std::string key() const;
  /// A line-based text form (decode() reads it back exactly).
  std::string encode() const;
  static result<manifest> decode(const std::string& text);
};

/// The manifest of `spec` over `file` (an opened model file; `name` is the
/// file name the manifest carries). Reads the slice's bytes to digest them
/// (file.file_image()). Errors: a spec outside the model (as
/// shard_weights::make), a tensor name with white space, a converted slice
/// image (file_image() null).
result<manifest> make_manifest(const model_file& file, const slice_spec& spec, const std::string& name);

/// Copies `n` bytes of the slice image, starting at byte `at` of it, from the
/// whole file's own bytes `file` (file_bytes long: model_file::file_image(),
/// not image(), which a big-endian host converts) into `out`. Errors when
/// [at, at + n) is outside the slice image.
result<void> copy_slice_bytes(const manifest& m, const uint8_t* file, uint64_t at, uint64_t n, uint8_t* out);

/// Reads the slice image from a local copy of the file at `path` with pread
/// (only the manifest's ranges); `bytes_read` (optional) gets the bytes read.
/// Errors: the file missing or of another size, a short read. The bytes are
/// not verified here (verify_slice).
result<std::vector<uint8_t>> read_slice_file(const manifest& m, const std::string& path, uint64_t* bytes_read = nullptr);

/// Checks a slice image against the manifest: its size, then every entry's
/// digest. `where` names the image in errors ("cache file X", "node's copy
/// of F"); the error names the first entry that differs with both digests.
result<void> verify_slice(const manifest& m, const uint8_t* slice, uint64_t n, const std::string& where);

/// What open_slice_file() found wrong (failure::none when it succeeded).
enum class slice_file_failure { none, read, digest, model };

/// The slice straight from a local copy of the file at `path` into the
/// sparse model image: each of the manifest's ranges is read with pread to
/// its own file offset (no slice image in between: one copy of each byte,
/// huge pages where the slice covers whole 2 MiB runs, model/large_buffer.hpp),
/// then every entry's digest is checked in place before the model is built.
/// Gives what read_slice_file + verify_slice + open_slice give, with the same
/// errors: `where` names the file in them ("its F in DIR"); `failure`
/// (optional) says which step failed; `bytes_read` (optional) the bytes read.
result<std::shared_ptr<const model_file>> open_slice_file(const manifest& m, const std::string& path,
                                                          const std::string& where, load_options opts = {},
                                                          uint64_t* bytes_read = nullptr,
                                                          slice_file_failure* failure = nullptr);

/// A model_file built from a verified slice image alone (see the top of this
/// file); `opts` as model_file::open (ctx). Its digest() is of the sparse
/// image, not of the file: compare manifests instead.
result<std::shared_ptr<const model_file>> open_slice(const manifest& m, const uint8_t* slice, uint64_t n,
                                                     load_options opts = {});

}  // namespace cellshard::model
