#include "model/checkpoint.hpp"
#include "model/gguf.hpp"

#include "model/quant.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

namespace cellshard::model {

bool host_is_big_endian() {
  const uint16_t one = 1;
  uint8_t b;
  std::memcpy(&b, &one, 1);
  return b == 0;
}

std::string config::to_string() const {
  std::ostringstream os;
  os << "dim " << dim << ", hidden " << hidden_dim << ", layers " << n_layers << ", heads "
     << n_heads << ", kv heads " << n_kv_heads << ", vocab " << vocab_size << ", seq_len "
     << seq_len << (shared_classifier ? ", shared classifier" : ", unshared classifier");
  if (moe()) {
    os << ", " << arch << " experts " << n_experts << " used " << n_experts_used;
    if (shared_hidden) os << " shared hidden " << shared_hidden;
  }
  return os.str();
}

uint64_t checkpoint_bytes(const config& c) {
  const uint64_t rope = 2ull * c.seq_len * (c.head_size() / 2);
  const uint64_t emb = static_cast<uint64_t>(c.vocab_size) * c.dim;
  uint64_t floats = emb + c.layer_params() * c.n_layers + c.dim + rope;
  if (!c.shared_classifier) floats += emb;
  return 7 * sizeof(int32_t) + floats * sizeof(float);
}

result<config> model_file::parse_fields(const int32_t raw[7], const std::string& name) {
  static const char* fields[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                  "n_kv_heads", "vocab_size", "seq_len"};
  // An upper bound keeps size arithmetic far from overflow; real models are
  // far below it (Llama 3 70B: dim 8192, hidden 28672, 80 layers).
  constexpr int32_t limit = 1 << 24;
  for (int i = 0; i < 7; ++i) {
    const int64_t v = i == 5 ? (raw[i] < 0 ? -static_cast<int64_t>(raw[i]) : raw[i]) : raw[i];
    if (v <= 0 || v > limit) {
      std::ostringstream os;
      os << name << ": corrupt header: field " << fields[i] << " is " << raw[i]
         << ", expected a positive value"
         << (i == 5 ? " (negative means an unshared classifier)" : "") << " below " << limit;
      return make_error(os.str());
    }
  }
  config c;
  c.dim = raw[0];
  c.hidden_dim = raw[1];
  c.n_layers = raw[2];
  c.n_heads = raw[3];
  c.n_kv_heads = raw[4];
  c.shared_classifier = raw[5] > 0;
  c.vocab_size = raw[5] > 0 ? raw[5] : -raw[5];
  c.seq_len = raw[6];
  auto bad = [&](const std::string& what) {
    return make_error(name + ": corrupt header: " + what + " (" + c.to_string() + ")");
  };
  if (c.dim % c.n_heads != 0)
    return bad("dim " + std::to_string(c.dim) + " is not divisible by n_heads " +
               std::to_string(c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    return bad("n_heads " + std::to_string(c.n_heads) + " is not divisible by n_kv_heads " +
               std::to_string(c.n_kv_heads));
  if (c.head_size() % 2 != 0)
    return bad("head size dim/n_heads = " + std::to_string(c.head_size()) +
               " is odd; RoPE rotates pairs");
  // Each field is below 2^24, but products of them overflow 64 bits (dim^2 x
  // n_layers reaches 2^72): bound the file size in 128-bit arithmetic first,
  // so checkpoint_bytes() and every offset computed from the header are exact.
  {
    using u128 = unsigned __int128;
    const u128 d = static_cast<u128>(c.dim), h = static_cast<u128>(c.hidden_dim),
               kv = static_cast<u128>(c.n_kv_heads) * static_cast<u128>(c.head_size());
    const u128 layer = d + d * d + 2 * d * kv + d * d + d + 3 * d * h;
    const u128 emb = static_cast<u128>(c.vocab_size) * d;
    const u128 rope = 2 * static_cast<u128>(c.seq_len) * static_cast<u128>(c.head_size() / 2);
    const u128 bytes = 28 + 4 * (emb * (c.shared_classifier ? 1 : 2) + layer * static_cast<u128>(c.n_layers) + d + rope);
    if (bytes > (static_cast<u128>(1) << max_checkpoint_log2)) {
      std::ostringstream os;
      os << "these fields describe a file of " << static_cast<long double>(bytes) / 1099511627776.0L
         << " TiB, expected at most 2^" << max_checkpoint_log2 << " bytes";
      return bad(os.str());
    }
  }
  return c;
}

result<config> model_file::parse_header(const int32_t raw[7], uint64_t file_size,
                                        const std::string& name) {
  auto parsed = parse_fields(raw, name);
  if (!parsed) return parsed;
  const config& c = *parsed;
  const uint64_t want = checkpoint_bytes(c);
  if (file_size != want) {
    std::ostringstream os;
    os << name << ": file size is " << file_size << " bytes, expected " << want
       << " bytes for a llama2.c checkpoint of " << c.to_string();
    if (file_size < want) os << " (truncated by " << (want - file_size) << " bytes)";
    else os << " (" << (file_size - want) << " extra bytes: not a version-0 fp32 file?)";
    return make_error(os.str());
  }
  return c;
}

static uint32_t bswap32(uint32_t x) { return __builtin_bswap32(x); }

// A file named *.gguf that is no GGUF file (nor loads as another format) gets
// GGUF's bad-magic error first: "too short for the llama2.c header" alone
// would not tell a user who gave a truncated or empty download what is wrong.
static result<void> explain_gguf_name(result<void> r, const std::string& name, const uint8_t* base,
                                      uint64_t size) {
  if (r || !gguf::file::named_gguf(name) || gguf::file::has_magic(base, size)) return r;
  return make_error(gguf::file::bad_magic(name, base, size) + " (as a llama2.c checkpoint: " +
                    r.message() + ")");
}

result<void> model_file::init(const std::string& name, load_options opts) {
  if (is_q8_image(base_, size_)) return q8_reader::init(*this, name, opts);
  // The format is told by the magic, not the file name.
  if (size_ >= 4 && std::memcmp(base_, "GGUF", 4) == 0) return init_gguf(name, opts);
  if (size_ < 7 * sizeof(int32_t))
    return make_error(name + ": file is " + std::to_string(size_) +
                      " bytes, too short for the 28-byte llama2.c header");
  const bool swap = opts.force_swap != host_is_big_endian();
  int32_t raw[7];
  std::memcpy(raw, base_, sizeof raw);
  if (swap)
    for (auto& v : raw) v = static_cast<int32_t>(bswap32(static_cast<uint32_t>(v)));
  auto c = parse_header(raw, size_, name);
  if (!c) {
    // A file whose header is valid in the other byte order, with exactly the
    // size that header implies, is a byte-swapped checkpoint, not a corrupt one.
    int32_t other[7];
    for (int i = 0; i < 7; ++i) other[i] = static_cast<int32_t>(bswap32(static_cast<uint32_t>(raw[i])));
    auto o = parse_header(other, size_, name);
    if (o)
      return make_error(name + ": byte-swapped llama2.c checkpoint: its header is valid only with the bytes of "
                        "each field in the other order (" + o->to_string() +
                        "); expected the little-endian layout llama2.c's export.py writes (swap every 4-byte "
                        "word to convert it)");
    return c.err();
  }
  cfg_ = *c;
  if (swap) {  // whole file is 4-byte words: swap every word in place
    digest_ = XXH64(base_, size_, 0);  // the digest is of the file's own bytes
    have_digest_ = true;
    swapped_ = true;
    keep_original();
    // A zero word is its own swap: not writing it keeps a sparse image's
    // untouched pages (a slice's, from_sparse) unallocated.
    uint32_t* w = reinterpret_cast<uint32_t*>(base_);
    for (uint64_t i = 0; i < size_ / 4; ++i)
      if (w[i] != 0) w[i] = bswap32(w[i]);
  }
  const float* p = reinterpret_cast<const float*>(base_ + 7 * sizeof(int32_t));
  emb_ = p;
  p += static_cast<uint64_t>(cfg_.vocab_size) * cfg_.dim;
  layers_ = p;
  p += cfg_.layer_params() * cfg_.n_layers;
  rms_final_ = p;
  p += cfg_.dim;
  p += 2ull * cfg_.seq_len * (cfg_.head_size() / 2);  // unused RoPE tables
  wcls_ = cfg_.shared_classifier ? emb_ : p;
  return {};
}

layer_view model_file::layer(int l) const {
  if (quantized_) return q8_norms_[l];
  if (gguf_) return g_layers_[l];
  // run.c stores each weight kind for all layers together:
  // rms_att[L][dim], wq[L][dim][dim], wk[L][kv][dim], wv[L][kv][dim],
  // wo[L][dim][dim], rms_ffn[L][dim], w1[L][h][dim], w2[L][dim][h], w3[L][h][dim].
  const uint64_t L = cfg_.n_layers, d = cfg_.dim, kv = cfg_.kv_dim(), h = cfg_.hidden_dim;
  const float* p = layers_;
  layer_view v;
  v.rms_att = p + l * d;            p += L * d;
  v.wq = p + l * d * d;             p += L * d * d;
  v.wk = p + l * kv * d;            p += L * kv * d;
  v.wv = p + l * kv * d;            p += L * kv * d;
  v.wo = p + l * d * d;             p += L * d * d;
  v.rms_ffn = p + l * d;            p += L * d;
  v.w1 = p + l * h * d;             p += L * h * d;
  v.w2 = p + l * d * h;             p += L * d * h;
  v.w3 = p + l * h * d;
  return v;
}

result<std::shared_ptr<const model_file>> model_file::open(const std::string& path,
                                                          load_options opts) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return make_error(path + ": cannot open model file: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + ": not a regular file");
  }
  std::shared_ptr<model_file> m(new model_file());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    // Every format is little-endian on disk; a big-endian host converts the
    // tensors in place (llama2.c, CSQ8: the whole image; GGUF: each tensor
    // the loader uses).
    const bool swap = opts.force_swap != host_is_big_endian();
    // A private writable mapping lets the swap path convert in place
    // (copy-on-write); the usual path maps read-only and shares the page cache.
    void* p = ::mmap(nullptr, m->size_, swap ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return make_error(path + ": mmap failed: " + std::strerror(errno));
    }
    m->base_ = static_cast<uint8_t*>(p);
    m->mapped_ = true;
    if (swap) {  // the file's own bytes beside the converted image (file_image())
      void* o = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (o == MAP_FAILED) {
        ::close(fd);
        return make_error(path + ": mmap failed: " + std::strerror(errno));
      }
      m->original_map_ = static_cast<uint8_t*>(o);
    }
  }
  ::close(fd);
  auto r = explain_gguf_name(m->init(path, opts), path, m->base_, m->size_);
  if (!r) return r.err();
  return std::shared_ptr<const model_file>(std::move(m));
}

result<std::shared_ptr<const model_file>> model_file::from_bytes(std::vector<uint8_t> bytes,
                                                                std::string name,
                                                                load_options opts) {
  std::shared_ptr<model_file> m(new model_file());
  m->owned_ = std::move(bytes);
  m->base_ = m->owned_.data();
  m->size_ = m->owned_.size();
  m->path_ = name;
  auto r = explain_gguf_name(m->init(name, opts), name, m->base_, m->size_);
  if (!r) return r.err();
  return std::shared_ptr<const model_file>(std::move(m));
}

result<std::shared_ptr<const model_file>> model_file::from_sparse(uint64_t size,
                                                                 const std::function<void(uint8_t*)>& fill,
                                                                 std::string name, load_options opts) {
  if (size == 0) return make_error(name + ": empty image");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return make_error(name + ": cannot reserve " + std::to_string(size) + " bytes of address space: " +
                      std::strerror(errno));
  std::shared_ptr<model_file> m(new model_file());
  m->base_ = static_cast<uint8_t*>(p);
  m->size_ = size;
  m->mapped_ = true;
  m->sparse_ = true;
  m->path_ = name;
  fill(m->base_);
  auto r = explain_gguf_name(m->init(name, opts), name, m->base_, m->size_);
  if (!r) return r.err();
  return std::shared_ptr<const model_file>(std::move(m));
}

model_file::~model_file() {
  if (mapped_ && base_) ::munmap(base_, size_);
  if (original_map_) ::munmap(original_map_, size_);
}

void model_file::keep_original() {
  in_place_ = true;
  if (original_map_) {
    original_ = original_map_;
  } else if (!sparse_ && !mapped_) {
    original_copy_.assign(base_, base_ + size_);
    original_ = original_copy_.data();
  }  // else a sparse image: no file bytes (file_image() is null)
}

std::string format_digest(uint64_t v) {
  char b[19];
  std::snprintf(b, sizeof b, "0x%016llx", static_cast<unsigned long long>(v));
  return b;
}

uint64_t model_file::digest() const {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!have_digest_) {
    digest_ = XXH64(base_, size_, 0);
    have_digest_ = true;
  }
  return digest_;
}

}  // namespace cellshard::model
