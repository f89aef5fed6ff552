// model/gguf.hpp: reader (and a small writer) for GGUF files, the model format of
// ggml/llama.cpp, versions 2 and 3 (facts from ggml's docs/gguf.md).
//
// Layout of a GGUF file (all numbers in the file's byte order, little-endian
// unless the file was written for a big-endian host):
//   u32 magic "GGUF" (bytes 47 47 55 46), u32 version, u64 tensor_count,
//   u64 metadata_kv_count, then metadata_kv_count pairs
//     string key, u32 value_type, value
//   (string = u64 length + bytes, no terminator; array = u32 element type,
//   u64 count, elements), then tensor_count tensor infos
//     string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset
//   then padding to `general.alignment` (default 32), then the data section;
//   a tensor's offset is relative to the data section and a multiple of the
//   alignment. ne[0] is the number of elements of one row (ggml order: a
//   weight matrix [rows x cols] has ne = {cols, rows}).
//
// Byte order: numbers are converted to host order while parsing when the host
// is big-endian or open_options::force_swap is set (the two cancel). Tensor
// data is NOT converted here: tensor_info::data points into the mapping as
// stored; file::swapped() tells loaders to convert (kernels/types.hpp).
//
// Ownership and threads: a file owns its mapping (read-only, shared page cache)
// and is immutable after open(); share std::shared_ptr<const file> freely
// between threads. Pointers it hands out live as long as the file.
//
// Errors: every failure is a result<> whose message names the file, the key or
// tensor, and what was expected (truncated, bad magic, unsupported version,
// unknown tensor type, tensor outside the file, missing key, wrong type).
#pragma once

#include "model/result.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::model::gguf {

/// GGUF metadata value types (docs/gguf.md gguf_metadata_value_type).
enum class value_type : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
  count
};
const char* to_string(value_type t);

/// ggml tensor type ids as stored in GGUF tensor infos (ggml.h enum ggml_type).
/// Only the ids cellshard computes with are named; the reader knows the block
/// size of every ggml type (ggml_type_info) so it can check any file's bounds.
namespace ggml_type {
constexpr uint32_t f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8,
                   q8_1 = 9, q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14,
                   q8_k = 15, bf16 = 30;
}

/// Name, elements per block and bytes per block of a ggml type, or nullptr
/// for an id ggml does not define (or has removed).
struct ggml_type_traits {
  const char* name;
  uint32_t block_elems;
  uint32_t block_bytes;
};
const ggml_type_traits* ggml_type_info(uint32_t type);
/// "Q8_0", or "unknown type N".
std::string ggml_type_name(uint32_t type);

/// One metadata value. Scalars: the matching field (i for signed integers, u
/// for unsigned ones, f for floats, b, s). Arrays: elem is the element type,
/// count its length, and strs / ints / uints / floats / bools hold the
/// elements when they are scalars or strings (an array of arrays keeps only
/// its count).
struct value {
  value_type type = value_type::u8;
  value_type elem = value_type::u8;
  uint64_t count = 0;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<std::string> strs;
  std::vector<int64_t> ints;
  std::vector<uint64_t> uints;
  std::vector<double> floats;
  std::vector<uint8_t> bools;

  bool is_integer() const;
  bool is_float() const { return type == value_type::f32 || type == value_type::f64; }
  /// "u32", "array of string", ...
  std::string type_name() const;
};

/// One tensor of the file. Shapes in ggml order (ne[0] = row length).
struct tensor_info {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;      // ggml_type id
  uint64_t offset = 0;    // from the start of the data section
  uint64_t bytes = 0;     // size of the data in the file
  const uint8_t* data = nullptr;  // into the mapping (file byte order)

  uint64_t elements() const;
  uint64_t row_elems() const { return ne.empty() ? 1 : ne[0]; }
  /// Number of rows: the product of ne[1..] (1 for a vector).
  uint64_t rows() const;
  /// "[64, 512]" (ggml order).
  std::string shape_string() const;
};

struct open_options {
  /// Treat the file as having the opposite byte order of the host. Used to
  /// test the big-endian path on little-endian hosts (as load_options).
  bool force_swap = false;
};

class file {
public:
  /// Maps `path` read-only and parses header, metadata and tensor infos.
  static result<std::shared_ptr<const file>> open(const std::string& path,
                                                  open_options opts = {});
  /// Parses an in-memory image (tests, tools); the file owns the bytes.
  static result<std::shared_ptr<const file>> from_bytes(std::vector<uint8_t> bytes,
                                                        std::string name,
                                                        open_options opts = {});
  /// Parses `size` bytes at `bytes` without copying them: the caller keeps
  /// them alive and unchanged as long as the file (a model_file's sparse
  /// image, model/manifest.hpp).
  static result<std::shared_ptr<const file>> from_view(const uint8_t* bytes, uint64_t size, std::string name,
                                                       open_options opts = {});
  /// True when `bytes` (at least 4) start with the GGUF magic.
  static bool has_magic(const uint8_t* bytes, uint64_t size);
  /// True when the file name `path` ends in ".gguf" (any case). The format is
  /// told by the magic; the name only chooses which error a file that is
  /// neither format gets (the GGUF one for a name that says GGUF).
  static bool named_gguf(const std::string& path);
  /// "NAME: bad magic: expected "GGUF" (47 47 55 46) at offset 0, found ..."
  /// for the first `size` bytes at `bytes` (fewer than 4 are named as such).
  static std::string bad_magic(const std::string& name, const uint8_t* bytes, uint64_t size);

  ~file();
  file(const file&) = delete;
  file& operator=(const file&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  bool swapped() const { return swap_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_bytes() const { return size_; }
  const uint8_t* bytes() const { return base_; }

  /// Metadata keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  /// The value of `key`, or nullptr.
  const value* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters. Errors: "FILE: missing key K" or "FILE: key K is a T,
  // expected E". Integers of any width convert when the value fits.
  result<std::string> get_string(const std::string& key) const;
  result<int64_t> get_int(const std::string& key) const;
  result<uint32_t> get_u32(const std::string& key) const;
  result<uint64_t> get_u64(const std::string& key) const;
  result<int32_t> get_i32(const std::string& key) const;
  result<float> get_f32(const std::string& key) const;  // f32 or f64
  result<bool> get_bool(const std::string& key) const;
  result<std::vector<std::string>> get_string_array(const std::string& key) const;
  result<std::vector<float>> get_f32_array(const std::string& key) const;
  /// Any integer element type whose values fit in int32.
  result<std::vector<int32_t>> get_i32_array(const std::string& key) const;
  /// Number of elements of an array value.
  result<uint64_t> get_array_count(const std::string& key) const;

  const std::vector<tensor_info>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const tensor_info* find_tensor(const std::string& name) const;
  /// The tensor named `name`, or "FILE: missing tensor NAME".
  result<const tensor_info*> tensor(const std::string& name) const;

private:
  file() = default;
  result<void> parse(open_options opts);
  error key_error(const std::string& key, const value* v, const char* expected) const;

  std::string path_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  uint32_t version_ = 0;
  bool swap_ = false;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, value> kv_;
  std::vector<tensor_info> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

/// Builds a GGUF image in memory (version 3, little-endian unless `swap`):
/// quantize writes models with it and tests craft files. Values keep the order
/// they are added in; tensors are laid out in order at `alignment`.
class writer {
public:
  void set_u32(const std::string& key, uint32_t v);
  void set_i32(const std::string& key, int32_t v);
  void set_u64(const std::string& key, uint64_t v);
  void set_f32(const std::string& key, float v);
  void set_bool(const std::string& key, bool v);
  void set_string(const std::string& key, const std::string& v);
  void set_string_array(const std::string& key, const std::vector<std::string>& v);
  void set_f32_array(const std::string& key, const std::vector<float>& v);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& v);
  /// Copies a metadata value from another file (any type, arrays included).
  void copy_value(const std::string& key, const value& v);
  /// Adds a tensor: ne in ggml order, `data` in the file's byte order already
  /// (the writer does not convert tensor data).
  void add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                  std::vector<uint8_t> data);

  /// The image. `version` 2 or 3; `swap` writes every number byte-swapped.
  std::vector<uint8_t> bytes(uint32_t version = 3, bool swap = false,
                             uint64_t alignment = 32) const;

private:
  struct entry {
    std::string key;
    value v;
  };
  struct tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  void put(const std::string& key, value v);
  std::vector<entry> kv_;
  std::vector<tensor> tensors_;
};

}  // namespace cellshard::model::gguf
