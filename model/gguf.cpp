#include "model/gguf.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cellshard::model::gguf {

namespace {

bool host_big_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 0;
}

// Sanity limits that keep a corrupt count from allocating the machine away;
// real files are far below them (Llama 3: 128,256 tokens, 280,147 merges).
constexpr uint64_t max_string_bytes = 1ull << 30;
constexpr uint64_t max_array_count = 1ull << 32;
constexpr uint32_t max_dims = 4;  // GGML_MAX_DIMS
constexpr uint64_t max_entries = 1ull << 24;

// Byte cursor over the header with bounds checks and optional byte swapping.
class cursor {
public:
  cursor(const uint8_t* p, uint64_t n, bool swap, const std::string& name)
      : p_(p), n_(n), swap_(swap), name_(name) {}

  uint64_t pos() const { return at_; }

  // what = the item being read, for the "truncated" message.
  bool read(void* out, uint64_t bytes, const std::string& what) {
    if (bytes > n_ - at_) {
      std::ostringstream os;
      os << name_ << ": truncated file: " << what << " needs " << bytes << " bytes at offset "
         << at_ << ", the file is " << n_ << " bytes";
      err_ = os.str();
      return false;
    }
    std::memcpy(out, p_ + at_, bytes);
    at_ += bytes;
    return true;
  }
  template <class T>
  bool num(T& v, const std::string& what) {
    if (!read(&v, sizeof(T), what)) return false;
    if (swap_ && sizeof(T) > 1) {
      uint8_t b[sizeof(T)];
      std::memcpy(b, &v, sizeof(T));
      for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
      std::memcpy(&v, b, sizeof(T));
    }
    return true;
  }
  bool str(std::string& s, const std::string& what) {
    uint64_t len = 0;
    if (!num(len, what + " (length)")) return false;
    if (len > max_string_bytes) {
      err_ = name_ + ": " + what + " has length " + std::to_string(len) +
             " at offset " + std::to_string(at_ - 8) + ", expected at most " +
             std::to_string(max_string_bytes) + " bytes (corrupt file?)";
      return false;
    }
    if (len > n_ - at_) {  // before allocating: a short file must not cost len bytes (found by fuzz/gguf.cpp)
      err_ = name_ + ": " + what + " has length " + std::to_string(len) + " at offset " + std::to_string(at_ - 8) +
             " but only " + std::to_string(n_ - at_) + " bytes follow (truncated file?)";
      return false;
    }
    s.resize(len);
    return read(&s[0], len, what);
  }
  const std::string& error_text() const { return err_; }
  void fail(std::string e) { err_ = std::move(e); }

private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t at_ = 0;
  bool swap_;
  const std::string& name_;
  std::string err_;
};

bool read_scalar(cursor& c, value_type t, value& v, const std::string& what) {
  switch (t) {
    case value_type::u8: { uint8_t x; if (!c.num(x, what)) return false; v.u = x; return true; }
    case value_type::i8: { int8_t x; if (!c.num(x, what)) return false; v.i = x; return true; }
    case value_type::u16: { uint16_t x; if (!c.num(x, what)) return false; v.u = x; return true; }
    case value_type::i16: { int16_t x; if (!c.num(x, what)) return false; v.i = x; return true; }
    case value_type::u32: { uint32_t x; if (!c.num(x, what)) return false; v.u = x; return true; }
    case value_type::i32: { int32_t x; if (!c.num(x, what)) return false; v.i = x; return true; }
    case value_type::u64: { uint64_t x; if (!c.num(x, what)) return false; v.u = x; return true; }
    case value_type::i64: { int64_t x; if (!c.num(x, what)) return false; v.i = x; return true; }
    case value_type::f32: { float x; if (!c.num(x, what)) return false; v.f = x; return true; }
    case value_type::f64: { double x; if (!c.num(x, what)) return false; v.f = x; return true; }
    case value_type::boolean: {
      uint8_t x;
      if (!c.num(x, what)) return false;
      v.b = x != 0;
      return true;
    }
    case value_type::string: return c.str(v.s, what);
    default: return false;
  }
}

bool valid_type(uint32_t t) { return t < static_cast<uint32_t>(value_type::count); }

bool read_array_body(cursor& c, value& v, const std::string& key, const std::string& name,
                     int depth);

bool read_value(cursor& c, value& v, const std::string& key, const std::string& name,
                int depth) {
  uint32_t raw = 0;
  if (!c.num(raw, "type of key " + key)) return false;
  if (!valid_type(raw)) {
    c.fail(name + ": key " + key + " has value type " + std::to_string(raw) +
           ", expected 0..12 (GGUF metadata value types)");
    return false;
  }
  v.type = static_cast<value_type>(raw);
  if (v.type != value_type::array) return read_scalar(c, v.type, v, "value of key " + key);
  return read_array_body(c, v, key, name, depth);
}

// Element type, count and elements of an array value.
bool read_array_body(cursor& c, value& v, const std::string& key, const std::string& name,
                     int depth) {
  v.type = value_type::array;
  uint32_t et = 0;
  if (!c.num(et, "array element type of key " + key)) return false;
  if (!valid_type(et)) {
    c.fail(name + ": key " + key + " is an array of value type " + std::to_string(et) +
           ", expected 0..12");
    return false;
  }
  v.elem = static_cast<value_type>(et);
  if (!c.num(v.count, "array length of key " + key)) return false;
  if (v.count > max_array_count) {
    c.fail(name + ": key " + key + " is an array of " + std::to_string(v.count) +
           " elements, expected at most " + std::to_string(max_array_count) +
           " (corrupt file?)");
    return false;
  }
  const std::string what = "array element of key " + key;
  if (v.elem == value_type::array) {
    // An array of arrays: each element repeats element type and count. Only
    // the outer count is kept; the elements are checked and skipped.
    for (uint64_t i = 0; i < v.count; ++i) {
      value inner;
      if (depth >= 3) {
        c.fail(name + ": key " + key + " nests arrays more than 3 levels deep");
        return false;
      }
      if (!read_array_body(c, inner, key, name, depth + 1)) return false;
    }
    return true;
  }
  switch (v.elem) {
    case value_type::string:
      v.strs.reserve(static_cast<size_t>(std::min<uint64_t>(v.count, 1u << 20)));
      for (uint64_t i = 0; i < v.count; ++i) {
        std::string s;
        if (!c.str(s, what)) return false;
        v.strs.push_back(std::move(s));
      }
      return true;
    default: break;
  }
  value e;
  for (uint64_t i = 0; i < v.count; ++i) {
    if (!read_scalar(c, v.elem, e, what)) return false;
    switch (v.elem) {
      case value_type::u8: case value_type::u16: case value_type::u32: case value_type::u64:
        v.uints.push_back(e.u);
        break;
      case value_type::i8: case value_type::i16: case value_type::i32: case value_type::i64:
        v.ints.push_back(e.i);
        break;
      case value_type::f32: case value_type::f64: v.floats.push_back(e.f); break;
      case value_type::boolean: v.bools.push_back(e.b ? 1 : 0); break;
      default: break;
    }
  }
  return true;
}

bool is_unsigned(value_type t) {
  return t == value_type::u8 || t == value_type::u16 || t == value_type::u32 ||
         t == value_type::u64;
}
bool is_signed(value_type t) {
  return t == value_type::i8 || t == value_type::i16 || t == value_type::i32 ||
         t == value_type::i64;
}

}  // namespace

const char* to_string(value_type t) {
  switch (t) {
    case value_type::u8: return "u8";
    case value_type::i8: return "i8";
    case value_type::u16: return "u16";
    case value_type::i16: return "i16";
    case value_type::u32: return "u32";
    case value_type::i32: return "i32";
    case value_type::f32: return "f32";
    case value_type::boolean: return "bool";
    case value_type::string: return "string";
    case value_type::array: return "array";
    case value_type::u64: return "u64";
    case value_type::i64: return "i64";
    case value_type::f64: return "f64";
    default: return "unknown";
  }
}

bool value::is_integer() const { return is_unsigned(type) || is_signed(type); }

std::string value::type_name() const {
  if (type != value_type::array) return to_string(type);
  return std::string("array of ") + to_string(elem);
}

const ggml_type_traits* ggml_type_info(uint32_t type) {
  // ggml.c type_traits: block elements and bytes per block of each type.
  static const ggml_type_traits table[] = {
      {"F32", 1, 4},        // 0
      {"F16", 1, 2},        // 1
      {"Q4_0", 32, 18},     // 2
      {"Q4_1", 32, 20},     // 3
      {nullptr, 0, 0},      // 4 (removed Q4_2)
      {nullptr, 0, 0},      // 5 (removed Q4_3)
      {"Q5_0", 32, 22},     // 6
      {"Q5_1", 32, 24},     // 7
      {"Q8_0", 32, 34},     // 8
      {"Q8_1", 32, 36},     // 9
      {"Q2_K", 256, 84},    // 10
      {"Q3_K", 256, 110},   // 11
      {"Q4_K", 256, 144},   // 12
      {"Q5_K", 256, 176},   // 13
      {"Q6_K", 256, 210},   // 14
      {"Q8_K", 256, 292},   // 15
      {"IQ2_XXS", 256, 66}, // 16
      {"IQ2_XS", 256, 74},  // 17
      {"IQ3_XXS", 256, 98}, // 18
      {"IQ1_S", 256, 50},   // 19
      {"IQ4_NL", 32, 18},   // 20
      {"IQ3_S", 256, 110},  // 21
      {"IQ2_S", 256, 82},   // 22
      {"IQ4_XS", 256, 136}, // 23
      {"I8", 1, 1},         // 24
      {"I16", 1, 2},        // 25
      {"I32", 1, 4},        // 26
      {"I64", 1, 8},        // 27
      {"F64", 1, 8},        // 28
      {"IQ1_M", 256, 56},   // 29
      {"BF16", 1, 2},       // 30
  };
  if (type >= sizeof table / sizeof table[0] || !table[type].name) return nullptr;
  return &table[type];
}

std::string ggml_type_name(uint32_t type) {
  const auto* t = ggml_type_info(type);
  return t ? t->name : "unknown type " + std::to_string(type);
}

uint64_t tensor_info::elements() const {
  uint64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

uint64_t tensor_info::rows() const {
  uint64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

std::string tensor_info::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

bool file::has_magic(const uint8_t* b, uint64_t n) {
  return n >= 4 && b[0] == 'G' && b[1] == 'G' && b[2] == 'U' && b[3] == 'F';
}

bool file::named_gguf(const std::string& path) {
  const std::string ext = ".gguf";
  if (path.size() < ext.size()) return false;
  for (size_t i = 0; i < ext.size(); ++i) {
    const char c = path[path.size() - ext.size() + i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != ext[i]) return false;
  }
  return true;
}

std::string file::bad_magic(const std::string& name, const uint8_t* bytes, uint64_t size) {
  std::ostringstream os;
  os << name << ": bad magic: expected \"GGUF\" (47 47 55 46) at offset 0, found";
  if (size < 4) os << " only " << size << " bytes";
  for (uint64_t i = 0; i < 4 && i < size; ++i) {
    char b[4];
    std::snprintf(b, sizeof b, " %02x", bytes[i]);
    os << b;
  }
  return os.str();
}

result<void> file::parse(open_options opts) {
  const std::string& name = path_;
  if (size_ < 4 || !has_magic(base_, size_)) return make_error(bad_magic(name, base_, size_));
  swap_ = host_big_endian() != opts.force_swap;
  cursor c(base_, size_, swap_, name);
  uint32_t magic;
  c.read(&magic, 4, "magic");
  if (!c.num(version_, "version")) return make_error(c.error_text());
  if (version_ != 2 && version_ != 3) {
    std::string hint;
    if (version_ == 1) hint = " (version 1 used 32-bit counts; convert the file again)";
    else if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3)
      hint = " (the file has the other byte order)";
    return make_error(name + ": unsupported GGUF version " + std::to_string(version_) +
                      ", expected 2 or 3" + hint);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.num(n_tensors, "tensor count") || !c.num(n_kv, "metadata count"))
    return make_error(c.error_text());
  if (n_tensors > max_entries || n_kv > max_entries)
    return make_error(name + ": header says " + std::to_string(n_tensors) + " tensors and " +
                      std::to_string(n_kv) + " metadata keys, expected at most " +
                      std::to_string(max_entries) + " each (corrupt file?)");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    if (!c.str(key, "key of metadata entry " + std::to_string(i)))
      return make_error(c.error_text());
    value v;
    if (!read_value(c, v, key, name, 0)) return make_error(c.error_text());
    if (kv_.count(key)) return make_error(name + ": key " + key + " appears twice");
    keys_.push_back(key);
    kv_.emplace(key, std::move(v));
  }
  if (const value* a = find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 30))
      return make_error(name + ": key general.alignment is " +
                        (a->is_integer() ? std::to_string(a->u) : a->type_name()) +
                        ", expected a power of two (u32)");
    alignment_ = a->u;
  }
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    tensor_info t;
    if (!c.str(t.name, "name of tensor " + std::to_string(i))) return make_error(c.error_text());
    uint32_t nd = 0;
    if (!c.num(nd, "dimension count of tensor " + t.name)) return make_error(c.error_text());
    if (nd == 0 || nd > max_dims)
      return make_error(name + ": tensor " + t.name + " has " + std::to_string(nd) +
                        " dimensions, expected 1 to " + std::to_string(max_dims));
    t.ne.resize(nd);
    for (auto& d : t.ne)
      if (!c.num(d, "shape of tensor " + t.name)) return make_error(c.error_text());
    if (!c.num(t.type, "type of tensor " + t.name) ||
        !c.num(t.offset, "offset of tensor " + t.name))
      return make_error(c.error_text());
    const auto* ti = ggml_type_info(t.type);
    if (!ti)
      return make_error(name + ": tensor " + t.name + " has unknown tensor type " +
                        std::to_string(t.type) + " (not a ggml type this reader knows)");
    // Overflow-safe element count.
    uint64_t n = 1;
    for (auto d : t.ne) {
      if (d == 0 || n > (std::numeric_limits<uint64_t>::max() >> 8) / d)
        return make_error(name + ": tensor " + t.name + " has shape " + t.shape_string() +
                          ", expected positive dimensions of a sane size");
      n *= d;
    }
    if (t.ne[0] % ti->block_elems != 0)
      return make_error(name + ": tensor " + t.name + " of type " + ti->name + " has rows of " +
                        std::to_string(t.ne[0]) + " elements, expected a multiple of its block size " +
                        std::to_string(ti->block_elems));
    t.bytes = n / ti->block_elems * ti->block_bytes;
    if (t.offset % alignment_ != 0)
      return make_error(name + ": tensor " + t.name + " has offset " + std::to_string(t.offset) +
                        ", expected a multiple of the alignment " + std::to_string(alignment_));
    if (tensor_index_.count(t.name))
      return make_error(name + ": tensor " + t.name + " appears twice");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  const uint64_t end_infos = c.pos();
  data_offset_ = (end_infos + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    const uint64_t start = data_offset_ + t.offset;
    if (start < t.offset || start > size_ || t.bytes > size_ - start) {
      std::ostringstream os;
      os << name << ": tensor " << t.name << " (" << ggml_type_name(t.type) << " "
         << t.shape_string() << ", " << t.bytes << " bytes at data offset " << t.offset
         << ") lies outside the file: it ends at byte " << start + t.bytes
         << ", the file is " << size_ << " bytes (truncated?)";
      return make_error(os.str());
    }
    t.data = base_ + start;
  }
  return {};
}

result<std::shared_ptr<const file>> file::open(const std::string& path, open_options opts) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return make_error(path + ": cannot open GGUF file: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + ": not a regular file");
  }
  std::shared_ptr<file> f(new file());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return make_error(path + ": mmap failed: " + std::strerror(errno));
    }
    f->base_ = static_cast<uint8_t*>(p);
    f->mapped_ = true;
  }
  ::close(fd);
  auto r = f->parse(opts);
  if (!r) return r.err();
  return std::shared_ptr<const file>(std::move(f));
}

result<std::shared_ptr<const file>> file::from_bytes(std::vector<uint8_t> bytes,
                                                     std::string name, open_options opts) {
  std::shared_ptr<file> f(new file());
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->path_ = std::move(name);
  auto r = f->parse(opts);
  if (!r) return r.err();
  return std::shared_ptr<const file>(std::move(f));
}

result<std::shared_ptr<const file>> file::from_view(const uint8_t* bytes, uint64_t size, std::string name,
                                                    open_options opts) {
  std::shared_ptr<file> f(new file());
  f->base_ = const_cast<uint8_t*>(bytes);  // never written: parse() only reads
  f->size_ = size;
  f->path_ = std::move(name);
  auto r = f->parse(opts);
  if (!r) return r.err();
  return std::shared_ptr<const file>(std::move(f));
}

file::~file() {
  if (mapped_ && base_) ::munmap(base_, size_);
}

const value* file::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

error file::key_error(const std::string& key, const value* v, const char* expected) const {
  if (!v) return make_error(path_ + ": missing key " + key + " (expected " + expected + ")");
  return make_error(path_ + ": key " + key + " is " + v->type_name() + ", expected " + expected);
}

result<std::string> file::get_string(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::string) return key_error(key, v, "a string");
  return v->s;
}

result<int64_t> file::get_int(const std::string& key) const {
  const value* v = find(key);
  if (!v || !v->is_integer()) return key_error(key, v, "an integer");
  if (is_unsigned(v->type)) {
    if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return make_error(path_ + ": key " + key + " is " + std::to_string(v->u) +
                        ", expected a value below 2^63");
    return static_cast<int64_t>(v->u);
  }
  return v->i;
}

result<uint32_t> file::get_u32(const std::string& key) const {
  auto r = get_int(key);
  if (!r) return r.err();
  if (*r < 0 || *r > static_cast<int64_t>(std::numeric_limits<uint32_t>::max()))
    return make_error(path_ + ": key " + key + " is " + std::to_string(*r) +
                      ", expected a value in 0..4294967295");
  return static_cast<uint32_t>(*r);
}

result<uint64_t> file::get_u64(const std::string& key) const {
  const value* v = find(key);
  if (!v || !v->is_integer()) return key_error(key, v, "an integer");
  if (is_unsigned(v->type)) return v->u;
  if (v->i < 0)
    return make_error(path_ + ": key " + key + " is " + std::to_string(v->i) +
                      ", expected a non-negative value");
  return static_cast<uint64_t>(v->i);
}

result<int32_t> file::get_i32(const std::string& key) const {
  auto r = get_int(key);
  if (!r) return r.err();
  if (*r < std::numeric_limits<int32_t>::min() || *r > std::numeric_limits<int32_t>::max())
    return make_error(path_ + ": key " + key + " is " + std::to_string(*r) +
                      ", expected a 32-bit signed value");
  return static_cast<int32_t>(*r);
}

result<float> file::get_f32(const std::string& key) const {
  const value* v = find(key);
  if (!v || !v->is_float()) return key_error(key, v, "a float (f32 or f64)");
  return static_cast<float>(v->f);
}

result<bool> file::get_bool(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::boolean) return key_error(key, v, "a bool");
  return v->b;
}

result<std::vector<std::string>> file::get_string_array(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::array || v->elem != value_type::string)
    return key_error(key, v, "an array of string");
  return v->strs;
}

result<std::vector<float>> file::get_f32_array(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::array ||
      (v->elem != value_type::f32 && v->elem != value_type::f64))
    return key_error(key, v, "an array of f32");
  return std::vector<float>(v->floats.begin(), v->floats.end());
}

result<std::vector<int32_t>> file::get_i32_array(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::array || !(is_signed(v->elem) || is_unsigned(v->elem)))
    return key_error(key, v, "an array of integers");
  std::vector<int32_t> out;
  out.reserve(v->count);
  auto bad = [&](const std::string& val, size_t i) {
    return make_error(path_ + ": key " + key + " element " + std::to_string(i) + " is " + val +
                      ", expected a 32-bit signed value");
  };
  for (size_t i = 0; i < v->ints.size(); ++i) {
    if (v->ints[i] < std::numeric_limits<int32_t>::min() ||
        v->ints[i] > std::numeric_limits<int32_t>::max())
      return bad(std::to_string(v->ints[i]), i);
    out.push_back(static_cast<int32_t>(v->ints[i]));
  }
  for (size_t i = 0; i < v->uints.size(); ++i) {
    if (v->uints[i] > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      return bad(std::to_string(v->uints[i]), i);
    out.push_back(static_cast<int32_t>(v->uints[i]));
  }
  return out;
}

result<uint64_t> file::get_array_count(const std::string& key) const {
  const value* v = find(key);
  if (!v || v->type != value_type::array) return key_error(key, v, "an array");
  return v->count;
}

const tensor_info* file::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

result<const tensor_info*> file::tensor(const std::string& name) const {
  const tensor_info* t = find_tensor(name);
  if (!t) return make_error(path_ + ": missing tensor " + name);
  return t;
}

// ---------------------------------------------------------------- writer

void writer::put(const std::string& key, value v) {
  for (auto& e : kv_)
    if (e.key == key) {
      e.v = std::move(v);
      return;
    }
  kv_.push_back({key, std::move(v)});
}

void writer::set_u32(const std::string& key, uint32_t x) {
  value v;
  v.type = value_type::u32;
  v.u = x;
  put(key, v);
}
void writer::set_i32(const std::string& key, int32_t x) {
  value v;
  v.type = value_type::i32;
  v.i = x;
  put(key, v);
}
void writer::set_u64(const std::string& key, uint64_t x) {
  value v;
  v.type = value_type::u64;
  v.u = x;
  put(key, v);
}
void writer::set_f32(const std::string& key, float x) {
  value v;
  v.type = value_type::f32;
  v.f = x;
  put(key, v);
}
void writer::set_bool(const std::string& key, bool x) {
  value v;
  v.type = value_type::boolean;
  v.b = x;
  put(key, v);
}
void writer::set_string(const std::string& key, const std::string& x) {
  value v;
  v.type = value_type::string;
  v.s = x;
  put(key, v);
}
void writer::set_string_array(const std::string& key, const std::vector<std::string>& x) {
  value v;
  v.type = value_type::array;
  v.elem = value_type::string;
  v.count = x.size();
  v.strs = x;
  put(key, v);
}
void writer::set_f32_array(const std::string& key, const std::vector<float>& x) {
  value v;
  v.type = value_type::array;
  v.elem = value_type::f32;
  v.count = x.size();
  v.floats.assign(x.begin(), x.end());
  put(key, v);
}
void writer::set_i32_array(const std::string& key, const std::vector<int32_t>& x) {
  value v;
  v.type = value_type::array;
  v.elem = value_type::i32;
  v.count = x.size();
  v.ints.assign(x.begin(), x.end());
  put(key, v);
}
void writer::copy_value(const std::string& key, const value& v) { put(key, v); }

void writer::add_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                        std::vector<uint8_t> data) {
  tensors_.push_back({name, std::move(ne), type, std::move(data)});
}

namespace {
class sink {
public:
  explicit sink(bool swap) : swap_(swap) {}
  template <class T>
  void num(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    if (swap_ != host_big_endian())
      for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(b[i], b[sizeof(T) - 1 - i]);
    out.insert(out.end(), b, b + sizeof(T));
  }
  void str(const std::string& s) {
    num<uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  void scalar(value_type t, const value& v, size_t i, bool element) {
    // element: take the i-th array element instead of the scalar field.
    switch (t) {
      case value_type::u8: num<uint8_t>(static_cast<uint8_t>(element ? v.uints[i] : v.u)); break;
      case value_type::i8: num<int8_t>(static_cast<int8_t>(element ? v.ints[i] : v.i)); break;
      case value_type::u16: num<uint16_t>(static_cast<uint16_t>(element ? v.uints[i] : v.u)); break;
      case value_type::i16: num<int16_t>(static_cast<int16_t>(element ? v.ints[i] : v.i)); break;
      case value_type::u32: num<uint32_t>(static_cast<uint32_t>(element ? v.uints[i] : v.u)); break;
      case value_type::i32: num<int32_t>(static_cast<int32_t>(element ? v.ints[i] : v.i)); break;
      case value_type::u64: num<uint64_t>(element ? v.uints[i] : v.u); break;
      case value_type::i64: num<int64_t>(element ? v.ints[i] : v.i); break;
      case value_type::f32: num<float>(static_cast<float>(element ? v.floats[i] : v.f)); break;
      case value_type::f64: num<double>(element ? v.floats[i] : v.f); break;
      case value_type::boolean: num<uint8_t>((element ? v.bools[i] != 0 : v.b) ? 1 : 0); break;
      case value_type::string: str(element ? v.strs[i] : v.s); break;
      default: break;
    }
  }
  std::vector<uint8_t> out;

private:
  bool swap_;
};
}  // namespace

std::vector<uint8_t> writer::bytes(uint32_t version, bool swap, uint64_t alignment) const {
  // A general.alignment key, when set, wins over the argument.
  for (const auto& e : kv_)
    if (e.key == "general.alignment" && e.v.is_integer() && e.v.u) alignment = e.v.u;
  sink s(swap);
  s.out.insert(s.out.end(), {'G', 'G', 'U', 'F'});
  s.num<uint32_t>(version);
  s.num<uint64_t>(tensors_.size());
  s.num<uint64_t>(kv_.size());
  for (const auto& e : kv_) {
    s.str(e.key);
    s.num<uint32_t>(static_cast<uint32_t>(e.v.type));
    if (e.v.type != value_type::array) {
      s.scalar(e.v.type, e.v, 0, false);
      continue;
    }
    s.num<uint32_t>(static_cast<uint32_t>(e.v.elem));
    // An array of arrays is written empty (its elements are not kept).
    const bool nested = e.v.elem == value_type::array;
    s.num<uint64_t>(nested ? 0 : e.v.count);
    if (!nested)
      for (size_t i = 0; i < e.v.count; ++i) s.scalar(e.v.elem, e.v, i, true);
  }
  uint64_t off = 0;
  std::vector<uint64_t> offsets;
  for (const auto& t : tensors_) {
    s.str(t.name);
    s.num<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) s.num<uint64_t>(d);
    s.num<uint32_t>(t.type);
    s.num<uint64_t>(off);
    offsets.push_back(off);
    off += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  const uint64_t data_start = (s.out.size() + alignment - 1) / alignment * alignment;
  s.out.resize(data_start + off, 0);
  for (size_t i = 0; i < tensors_.size(); ++i)
    std::memcpy(s.out.data() + data_start + offsets[i], tensors_[i].data.data(),
                tensors_[i].data.size());
  // ggml writers do not pad after the last tensor: trim to its end.
  if (!tensors_.empty())
    s.out.resize(data_start + offsets.back() + tensors_.back().data.size());
  return std::move(s.out);
}

}  // namespace cellshard::model::gguf
