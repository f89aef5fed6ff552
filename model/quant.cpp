#include "model/quant.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <xxhash.h>

namespace cellshard::model {

namespace {

using kernels::q8_block;
using kernels::q8_blocks_per_row;

uint64_t align_up(uint64_t n) { return (n + q8_alignment - 1) / q8_alignment * q8_alignment; }

uint32_t get_u32(const uint8_t* p, bool swap) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return swap ? __builtin_bswap32(v) : v;
}
uint64_t get_u64(const uint8_t* p, bool swap) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return swap ? __builtin_bswap64(v) : v;
}
void put_u32(uint8_t* p, uint32_t v, bool swap) {
  if (swap) v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
}
void put_u64(uint8_t* p, uint64_t v, bool swap) {
  if (swap) v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}

// Reverses the byte order of every multi-byte field of an image in place:
// header words (bytes 4..44), f32 norms, block scales. The trailer is left
// to the caller. An involution.
void swap_arrays(uint8_t* base, const config& c) {
  for (int i = 1; i < 11; ++i) {
    uint8_t* p = base + 4 * i;
    std::swap(p[0], p[3]);
    std::swap(p[1], p[2]);
  }
  for (const q8_array& a : q8_layout(c)) {
    uint8_t* p = base + a.offset;
    if (a.q8) {
      const uint64_t n = static_cast<uint64_t>(a.rows) * q8_blocks_per_row(a.cols);
      for (uint64_t b = 0; b < n; ++b, p += sizeof(q8_block)) std::swap(p[0], p[1]);
    } else {
      for (int i = 0; i < a.cols; ++i, p += 4) {
        std::swap(p[0], p[3]);
        std::swap(p[1], p[2]);
      }
    }
  }
}

// The f32 rows of array `a` of an f32 model file ([rows x cols], contiguous).
const float* f32_source(const model_file& m, const q8_array& a) {
  switch (a.kind) {
    case q8_array::embedding: return m.token_embedding();
    case q8_array::classifier: return m.classifier();
    case q8_array::rms_final: return m.rms_final();
    default: break;
  }
  const layer_view v = m.layer(a.layer);
  switch (a.kind) {
    case q8_array::rms_att: return v.rms_att;
    case q8_array::wq: return v.wq;
    case q8_array::wk: return v.wk;
    case q8_array::wv: return v.wv;
    case q8_array::wo: return v.wo;
    case q8_array::rms_ffn: return v.rms_ffn;
    case q8_array::w1: return v.w1;
    case q8_array::w2: return v.w2;
    case q8_array::w3: return v.w3;
    default: return nullptr;
  }
}

// Writes the image of `in` to `sink` in order, one array at a time, with the
// digest computed on the way. `sink` returns false on failure.
result<uint64_t> write_image(const model_file& in, const std::string& out_name,
                             const std::function<bool(const uint8_t*, size_t)>& sink) {
  if (in.quantized())
    return make_error(in.path() + ": already a q8_0 file; quantize reads an f32 llama2.c checkpoint");
  const config& c = in.cfg();
  const bool swap = host_is_big_endian();  // the file is little-endian
  XXH64_state_t* st = XXH64_createState();
  if (!st) return make_error("quantize: out of memory for the digest state");
  XXH64_reset(st, 0);
  uint64_t written = 0;
  auto emit = [&](const uint8_t* p, size_t n) {
    XXH64_update(st, p, n);
    written += n;
    return sink(p, n);
  };
  auto fail = [&]() {
    XXH64_freeState(st);
    return make_error(out_name + ": write failed after " + std::to_string(written) + " bytes: " +
                      std::strerror(errno));
  };

  uint8_t header[q8_header_bytes] = {};
  std::memcpy(header, q8_magic, 4);
  put_u32(header + 4, q8_version, swap);
  const int32_t raw[7] = {c.dim,        c.hidden_dim,
                          c.n_layers,   c.n_heads,
                          c.n_kv_heads, c.shared_classifier ? c.vocab_size : -c.vocab_size,
                          c.seq_len};
  for (int i = 0; i < 7; ++i) put_u32(header + 8 + 4 * i, static_cast<uint32_t>(raw[i]), swap);
  put_u32(header + 36, kernels::q8_block_size, swap);
  put_u32(header + 40, q8_alignment, swap);
  if (!emit(header, sizeof header)) return fail();

  const uint8_t zeros[q8_alignment] = {};
  std::vector<uint8_t> buf;
  for (const q8_array& a : q8_layout(c)) {
    if (a.offset > written && !emit(zeros, a.offset - written)) return fail();
    const float* src = f32_source(in, a);
    buf.resize(a.bytes);
    if (a.q8) {
      const int nb = q8_blocks_per_row(a.cols);
      q8_block* out = reinterpret_cast<q8_block*>(buf.data());
      for (int r = 0; r < a.rows; ++r)
        kernels::quantize_row_q8(src + static_cast<size_t>(r) * a.cols, out + static_cast<size_t>(r) * nb,
                                 a.cols);
      if (swap)
        for (size_t b = 0; b < static_cast<size_t>(a.rows) * nb; ++b) out[b].d = __builtin_bswap16(out[b].d);
    } else {
      std::memcpy(buf.data(), src, a.bytes);
      if (swap)
        for (size_t i = 0; i < a.bytes; i += 4) std::swap(buf[i], buf[i + 3]), std::swap(buf[i + 1], buf[i + 2]);
    }
    if (!emit(buf.data(), buf.size())) return fail();
  }
  const uint64_t end = align_up(written);
  if (end > written && !emit(zeros, end - written)) return fail();
  uint8_t trailer[8];
  put_u64(trailer, XXH64_digest(st), swap);
  XXH64_freeState(st);
  if (!sink(trailer, sizeof trailer)) return fail();
  written += sizeof trailer;
  return written;
}

}  // namespace

const char* to_string(q8_array::kind_t k) {
  static const char* names[] = {"token_embedding", "rms_att", "wq", "wk", "wv", "wo",
                                "rms_ffn", "w1", "w2", "w3", "rms_final", "wcls"};
  return names[k];
}

std::vector<q8_array> q8_layout(const config& c) {
  std::vector<q8_array> out;
  uint64_t at = q8_header_bytes;
  auto add = [&](q8_array::kind_t k, int layer, bool q8, int rows, int cols) {
    q8_array a{k, layer, q8, rows, cols, at, 0};
    a.bytes = q8 ? static_cast<uint64_t>(rows) * q8_blocks_per_row(cols) * sizeof(q8_block)
                 : static_cast<uint64_t>(rows) * cols * sizeof(float);
    at = align_up(at + a.bytes);
    out.push_back(a);
  };
  const int d = c.dim, kv = c.kv_dim(), h = c.hidden_dim, L = c.n_layers;
  add(q8_array::embedding, -1, true, c.vocab_size, d);
  for (int l = 0; l < L; ++l) add(q8_array::rms_att, l, false, 1, d);
  for (int l = 0; l < L; ++l) add(q8_array::wq, l, true, d, d);
  for (int l = 0; l < L; ++l) add(q8_array::wk, l, true, kv, d);
  for (int l = 0; l < L; ++l) add(q8_array::wv, l, true, kv, d);
  for (int l = 0; l < L; ++l) add(q8_array::wo, l, true, d, d);
  for (int l = 0; l < L; ++l) add(q8_array::rms_ffn, l, false, 1, d);
  for (int l = 0; l < L; ++l) add(q8_array::w1, l, true, h, d);
  for (int l = 0; l < L; ++l) add(q8_array::w2, l, true, d, h);
  for (int l = 0; l < L; ++l) add(q8_array::w3, l, true, h, d);
  add(q8_array::rms_final, -1, false, 1, d);
  if (!c.shared_classifier) add(q8_array::classifier, -1, true, c.vocab_size, d);
  return out;
}

uint64_t q8_file_bytes(const config& c) {
  const auto arrays = q8_layout(c);
  return align_up(arrays.back().offset + arrays.back().bytes) + q8_trailer_bytes;
}

bool is_q8_image(const uint8_t* p, uint64_t n) {
  return n >= 4 && std::memcmp(p, q8_magic, 4) == 0;
}

result<std::vector<uint8_t>> quantize_to_bytes(const model_file& in) {
  std::vector<uint8_t> out;
  if (!in.quantized()) out.reserve(q8_file_bytes(in.cfg()));
  auto r = write_image(in, "memory", [&](const uint8_t* p, size_t n) {
    out.insert(out.end(), p, p + n);
    return true;
  });
  if (!r) return r.err();
  return out;
}

result<uint64_t> quantize_to_file(const model_file& in, const std::string& path) {
  if (in.quantized())
    return make_error(in.path() + ": already a q8_0 file; quantize reads an f32 llama2.c checkpoint");
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error(tmp + ": cannot create: " + std::strerror(errno));
  auto r = write_image(in, tmp, [&](const uint8_t* p, size_t n) { return std::fwrite(p, 1, n, f) == n; });
  const bool closed = std::fclose(f) == 0;
  if (!r || !closed) {
    std::remove(tmp.c_str());
    if (!r) return r.err();
    return make_error(tmp + ": close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return make_error(path + ": cannot rename " + tmp + " to it: " + why);
  }
  return r;
}

result<std::vector<uint8_t>> q8_byte_swapped(std::vector<uint8_t> image) {
  auto m = model_file::from_bytes(image, "q8_byte_swapped input");
  if (!m) return m.err();
  if (!(*m)->quantized()) return make_error("q8_byte_swapped: the image is not a q8_0 file");
  swap_arrays(image.data(), (*m)->cfg());
  const uint64_t n = image.size() - q8_trailer_bytes;
  put_u64(image.data() + n, XXH64(image.data(), n, 0), !host_is_big_endian());
  return image;
}

result<void> q8_reader::init(model_file& m, const std::string& name, load_options opts) {
  uint8_t* base = m.base_;
  const uint64_t size = m.size_;
  if (size < q8_header_bytes + q8_trailer_bytes)
    return make_error(name + ": file is " + std::to_string(size) + " bytes, too short for the " +
                      std::to_string(q8_header_bytes) + "-byte CSQ8 header and the " +
                      std::to_string(q8_trailer_bytes) + "-byte digest");
  const bool swap = opts.force_swap != host_is_big_endian();
  auto field = [&](const char* f, uint32_t got, uint32_t want) -> result<void> {
    if (got == want) return {};
    return make_error(name + ": corrupt CSQ8 header: field " + f + " is " + std::to_string(got) +
                      ", expected " + std::to_string(want));
  };
  if (auto r = field("version", get_u32(base + 4, swap), q8_version); !r) return r;
  int32_t raw[7];
  for (int i = 0; i < 7; ++i) raw[i] = static_cast<int32_t>(get_u32(base + 8 + 4 * i, swap));
  auto c = model_file::parse_fields(raw, name);
  if (!c) return c.err();
  if (auto r = field("block_size", get_u32(base + 36, swap), kernels::q8_block_size); !r) return r;
  if (auto r = field("alignment", get_u32(base + 40, swap), q8_alignment); !r) return r;
  for (uint32_t i = 44; i < q8_header_bytes; ++i)
    if (base[i] != 0)
      return make_error(name + ": corrupt CSQ8 header: reserved byte " + std::to_string(i) + " is " +
                        std::to_string(base[i]) + ", expected 0");
  const uint64_t want = q8_file_bytes(*c);
  if (size != want) {
    std::ostringstream os;
    os << name << ": file size is " << size << " bytes, expected " << want
       << " bytes for a CSQ8 q8_0 file of " << c->to_string();
    if (size < want) os << " (truncated by " << (want - size) << " bytes)";
    else os << " (" << (size - want) << " extra bytes)";
    return make_error(os.str());
  }
  const uint64_t n = size - q8_trailer_bytes;
  const uint64_t stored = get_u64(base + n, swap);
  const uint64_t actual = XXH64(base, n, 0);
  if (stored != actual)
    return make_error(name + ": corrupt CSQ8 file: field digest (last 8 bytes) is " + format_digest(stored) +
                      ", expected " + format_digest(actual) + " (XXH64 of the " + std::to_string(n) +
                      " bytes before it): the file is damaged");
  if (swap) {
    m.digest_ = XXH64(base, size, 0);  // the digest is of the file's own bytes
    m.have_digest_ = true;
    m.swapped_ = true;
    m.keep_original();
    swap_arrays(base, *c);
  }

  m.cfg_ = *c;
  m.quantized_ = true;
  m.emb_ = m.layers_ = m.wcls_ = nullptr;
  m.q8_layers_.assign(c->n_layers, q8_layer_view{});
  m.q8_norms_.assign(c->n_layers, layer_view{});
  for (const q8_array& a : q8_layout(*c)) {
    const float* f = reinterpret_cast<const float*>(base + a.offset);
    const q8_matrix q{reinterpret_cast<const q8_block*>(base + a.offset), a.rows, a.cols};
    q8_layer_view* L = a.layer >= 0 ? &m.q8_layers_[a.layer] : nullptr;
    layer_view* N = a.layer >= 0 ? &m.q8_norms_[a.layer] : nullptr;
    switch (a.kind) {
      case q8_array::embedding: m.q8_emb_ = q; break;
      case q8_array::classifier: m.q8_cls_ = q; break;
      case q8_array::rms_final: m.rms_final_ = f; break;
      case q8_array::rms_att: N->rms_att = f; break;
      case q8_array::rms_ffn: N->rms_ffn = f; break;
      case q8_array::wq: L->wq = q; break;
      case q8_array::wk: L->wk = q; break;
      case q8_array::wv: L->wv = q; break;
      case q8_array::wo: L->wo = q; break;
      case q8_array::w1: L->w1 = q; break;
      case q8_array::w2: L->w2 = q; break;
      case q8_array::w3: L->w3 = q; break;
    }
  }
  if (c->shared_classifier) m.q8_cls_ = m.q8_emb_;
  return {};
}

}  // namespace cellshard::model
