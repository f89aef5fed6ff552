#include "model/manifest.hpp"

#include "base/parse.hpp"

#include "model/gguf.hpp"
#include "model/large_buffer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

namespace cellshard::model {

bool manifest_entry::operator==(const manifest_entry& o) const {
  return name == o.name && type == o.type && offset == o.offset && length == o.length && stride == o.stride &&
         count == o.count && digest == o.digest;
}

uint64_t manifest::bytes() const {
  uint64_t n = 0;
  for (const auto& e : entries) n += e.bytes();
  return n;
}

uint64_t manifest::digest() const {
  XXH3_state_t* st = XXH3_createState();
  if (!st) return 0;
  XXH3_64bits_reset(st);
  auto put = [&](uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));  // little-endian on every host
    XXH3_64bits_update(st, b, 8);
  };
  put(file_bytes);
  for (const auto& e : entries) {
    put(e.offset);
    put(e.length);
    put(e.stride);
    put(e.count);
    put(e.digest);
  }
  const uint64_t d = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return d;
}

std::string manifest::key() const { return format_digest(digest()); }

std::string manifest::encode() const {
  std::ostringstream os;
  os << "cellshard-manifest 1\n";
  os << "file " << file_bytes << " " << format << " " << model_name << "\n";
  for (const auto& e : entries)
    os << "entry " << e.name << " " << e.type << " " << e.offset << " " << e.length << " " << e.stride << " "
       << e.count << " " << format_digest(e.digest) << "\n";
  return os.str();
}

result<manifest> manifest::decode(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  manifest m;
  int n = 0;
  auto bad = [&](const std::string& what) {
    return make_error("weight manifest line " + std::to_string(n) + ": " + what + " ('" + line + "')");
  };
  while (std::getline(in, line)) {
    ++n;
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (n == 1) {
      int version = 0;
      if (kind != "cellshard-manifest" || !(ls >> version) || version != 1)
        return bad("expected 'cellshard-manifest 1'");
      continue;
    }
    if (kind == "file") {
      if (!(ls >> m.file_bytes >> m.format)) return bad("expected 'file BYTES FORMAT NAME'");
      std::getline(ls >> std::ws, m.model_name);
    } else if (kind == "entry") {
      manifest_entry e;
      std::string dg;
      if (!(ls >> e.name >> e.type >> e.offset >> e.length >> e.stride >> e.count >> dg) || dg.size() != 18 ||
          dg.compare(0, 2, "0x") != 0)
        return bad("expected 'entry NAME TYPE OFFSET LENGTH STRIDE COUNT 0xDIGEST'");
      const auto digest = parse_uint<uint64_t>(std::string_view(dg).substr(2), 16);  // base/parse.hpp
      if (!digest) return bad("digest is not hexadecimal");
      e.digest = *digest;
      if (e.count == 0 || (e.count > 1 && e.stride < e.length)) return bad("segments overlap or count is 0");
      const uint64_t last = e.offset + (e.count - 1) * e.stride + e.length;
      if (m.file_bytes == 0 || last > m.file_bytes || last < e.offset)
        return bad("range ends at " + std::to_string(last) + ", beyond the file's " +
                   std::to_string(m.file_bytes) + " bytes");
      m.entries.push_back(std::move(e));
    } else if (!kind.empty()) {
      return bad("unknown line kind '" + kind + "'");
    }
  }
  if (n == 0) return make_error("weight manifest: empty");
  if (m.entries.empty()) return make_error("weight manifest of " + m.model_name + ": no entries");
  return m;
}

namespace {

uint64_t digest_segments(const uint8_t* base, uint64_t offset, uint64_t length, uint64_t stride, uint64_t count) {
  if (count == 1) return XXH3_64bits(base + offset, length);
  XXH3_state_t* st = XXH3_createState();
  if (!st) return 0;
  XXH3_64bits_reset(st);
  for (uint64_t i = 0; i < count; ++i) XXH3_64bits_update(st, base + offset + i * stride, length);
  const uint64_t d = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return d;
}

/// Collects entries from byte ranges of the file's image.
struct builder {
  const uint8_t* base;
  uint64_t size;
  std::vector<manifest_entry> out;
  std::string error;

  void add(const std::string& name, const std::string& type, uint64_t offset, uint64_t length,
           uint64_t stride = 0, uint64_t count = 1) {
    if (length == 0 || count == 0) return;
    if (count > 1 && stride == length) {  // whole rows: one range
      length *= count;
      count = 1;
    }
    if (count == 1) stride = length;
    const uint64_t last = offset + (count - 1) * stride + length;
    if (last > size && error.empty())
      error = "tensor " + name + " ends at byte " + std::to_string(last) + ", beyond the file's " +
              std::to_string(size);
    if (!error.empty()) return;
    manifest_entry e;
    e.name = name;
    e.type = type;
    e.offset = offset;
    e.length = length;
    e.stride = stride;
    e.count = count;
    out.push_back(std::move(e));
  }
  /// Rows [r0, r0 + n) of a matrix of `row_bytes` per row starting at `offset`.
  void rows(const std::string& name, const std::string& type, uint64_t offset, uint64_t row_bytes, uint64_t r0,
            uint64_t n) {
    add(name, type, offset + r0 * row_bytes, n * row_bytes);
  }
  /// Columns [c0, c0 + n) of every one of `rows` rows (`cols` per row, of a
  /// type with `be` elements in `bb` bytes per block): the blocks holding
  /// them, or whole rows when the range is off block boundaries (the loader
  /// then dequantizes whole rows, model/transformer.cpp cols_of).
  void cols(const std::string& name, const std::string& type, uint64_t offset, uint64_t rows, uint64_t cols,
            uint64_t be, uint64_t bb, uint64_t c0, uint64_t n) {
    const uint64_t rb = cols / be * bb;
    if (c0 % be != 0 || n % be != 0) {
      add(name, type, offset, rows * rb);
      return;
    }
    add(name, type, offset + c0 / be * bb, n / be * bb, rb, rows);
  }
};

std::string layer_name(const char* field, int l) { return std::string(field) + "[" + std::to_string(l) + "]"; }

result<void> check_spec(const config& c, const slice_spec& spec) {
  auto bad = [&](const std::string& what) {
    return make_error("manifest of slice " + spec.to_string() + ": " + what + " (model: " + c.to_string() + ")");
  };
  if (spec.layer_begin < 0 || spec.layer_end > c.n_layers || spec.layer_begin >= spec.layer_end)
    return bad("layer range outside [0," + std::to_string(c.n_layers) + ")");
  if (spec.kv_head_begin < 0 || spec.kv_head_end > c.n_kv_heads || spec.kv_head_begin >= spec.kv_head_end)
    return bad("kv head range outside [0," + std::to_string(c.n_kv_heads) + ")");
  if (spec.ffn_begin < 0 || spec.ffn_end > c.hidden_dim || spec.ffn_begin >= spec.ffn_end)
    return bad("ffn range outside [0," + std::to_string(c.hidden_dim) + ")");
  if (spec.classifier && spec.vocab_end != 0 &&
      (spec.vocab_begin < 0 || spec.vocab_end > c.vocab_size || spec.vocab_begin >= spec.vocab_end))
    return bad("classifier rows outside [0," + std::to_string(c.vocab_size) + ")");
  for (int e : spec.experts)
    if (e < 0 || e >= c.n_experts) return bad("expert " + std::to_string(e) + " outside the model's");
  return {};
}

// llama2.c version-0 file (model/checkpoint.hpp): field offsets from layer_view pointers.
void llama2c_entries(const model_file& f, const slice_spec& spec, builder& b) {
  const config& c = f.cfg();
  const uint64_t d = c.dim, h = c.hidden_dim, hs = c.head_size();
  const uint64_t q0 = spec.kv_head_begin * c.kv_mul() * hs, nq = spec.n_kv_heads() * c.kv_mul() * hs;
  const uint64_t k0 = spec.kv_head_begin * hs, nk = spec.n_kv_heads() * hs;
  const uint64_t f0 = spec.ffn_begin, nf = spec.ffn_units();
  const uint8_t* base = f.image();
  auto off = [&](const float* p) { return static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(p) - base); };
  const uint64_t F = sizeof(float);
  b.add("header", "bytes", 0, 7 * sizeof(int32_t));
  if (spec.embedding) b.add("token_embedding", "f32", off(f.token_embedding()), c.vocab_size * d * F);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    const layer_view v = f.layer(l);
    b.add(layer_name("rms_att", l), "f32", off(v.rms_att), d * F);
    b.rows(layer_name("wq", l), "f32", off(v.wq), d * F, q0, nq);
    b.rows(layer_name("wk", l), "f32", off(v.wk), d * F, k0, nk);
    b.rows(layer_name("wv", l), "f32", off(v.wv), d * F, k0, nk);
    b.cols(layer_name("wo", l), "f32", off(v.wo), d, d, 1, F, q0, nq);
    b.add(layer_name("rms_ffn", l), "f32", off(v.rms_ffn), d * F);
    b.rows(layer_name("w1", l), "f32", off(v.w1), d * F, f0, nf);
    b.cols(layer_name("w2", l), "f32", off(v.w2), d, h, 1, F, f0, nf);
    b.rows(layer_name("w3", l), "f32", off(v.w3), d * F, f0, nf);
  }
  if (spec.classifier) {
    b.add("rms_final", "f32", off(f.rms_final()), d * F);
    const bool covered = c.shared_classifier && spec.embedding;
    if (!covered)
      b.rows(c.shared_classifier ? "token_embedding" : "classifier", "f32", off(f.classifier()), d * F,
             spec.vocab_first(), spec.vocab_rows(c.vocab_size));
  }
}

// GGUF (model/gguf_model.cpp's tensor names), by the tensors' file offsets.
result<void> gguf_entries(const model_file& f, const slice_spec& spec, builder& b) {
  const gguf::file& g = *f.gguf();
  const config& c = f.cfg();
  const uint64_t hs = c.head_size();
  const uint64_t q0 = spec.kv_head_begin * c.kv_mul() * hs, nq = spec.n_kv_heads() * c.kv_mul() * hs;
  const uint64_t k0 = spec.kv_head_begin * hs, nk = spec.n_kv_heads() * hs;
  const uint64_t f0 = spec.ffn_begin, nf = spec.ffn_units();
  struct info {
    const gguf::tensor_info* t = nullptr;
    uint64_t offset = 0, cols = 0, rows = 0, rb = 0, be = 1, bb = 4;
    std::string type;
  };
  std::string error;
  auto find = [&](const std::string& name, bool required) -> info {
    info i;
    i.t = g.find_tensor(name);
    if (!i.t) {
      if (required && error.empty()) error = f.path() + ": tensor " + name + " missing (manifest)";
      return i;
    }
    kernels::dtype dt;
    if (!kernels::dtype_from_ggml(i.t->type, &dt)) {
      if (error.empty()) error = f.path() + ": tensor " + name + " has an unsupported type (manifest)";
      i.t = nullptr;
      return i;
    }
    i.offset = g.data_offset() + i.t->offset;
    i.cols = i.t->row_elems();
    i.rows = i.t->rows();
    i.be = kernels::block_elems(dt);
    i.bb = kernels::block_bytes(dt);
    i.rb = i.cols / i.be * i.bb;
    i.type = kernels::to_string(dt);
    return i;
  };
  auto whole = [&](const std::string& name, bool required) {
    info i = find(name, required);
    if (i.t) b.add(name, i.type, i.offset, i.t->bytes);
  };
  auto rows = [&](const std::string& name, uint64_t r0, uint64_t n) {
    info i = find(name, true);
    if (i.t) b.rows(name, i.type, i.offset, i.rb, r0, n);
  };
  auto cols = [&](const std::string& name, uint64_t c0, uint64_t n) {
    info i = find(name, true);
    if (i.t) b.cols(name, i.type, i.offset, i.rows, i.cols, i.be, i.bb, c0, n);
  };
  // Expert e of a 3-D tensor {cols, rows, E}: rows [r0, r0+n) or columns [c0, c0+n) of its matrix.
  auto expert_rows = [&](const std::string& name, int e, uint64_t r0, uint64_t n) {
    info i = find(name, true);
    if (!i.t) return;
    const uint64_t mrows = i.t->ne.size() == 3 ? i.t->ne[1] : i.rows;
    b.rows(name + "#" + std::to_string(e), i.type, i.offset + e * mrows * i.rb, i.rb, r0, n);
  };
  auto expert_cols = [&](const std::string& name, int e, uint64_t c0, uint64_t n) {
    info i = find(name, true);
    if (!i.t) return;
    const uint64_t mrows = i.t->ne.size() == 3 ? i.t->ne[1] : i.rows;
    b.cols(name + "#" + std::to_string(e), i.type, i.offset + e * mrows * i.rb, mrows, i.cols, i.be, i.bb, c0, n);
  };
  b.add("header", "bytes", 0, g.data_offset());
  // Small vectors the loader reads for every file (model/gguf_model.cpp).
  whole("output_norm.weight", true);
  whole("rope_freqs.weight", false);
  if (spec.embedding) whole("token_embd.weight", true);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    whole(p + "attn_norm.weight", true);
    whole(p + "ffn_norm.weight", true);
    if (spec.expert_only()) {
      for (int e : spec.experts) {
        expert_rows(p + "ffn_gate_exps.weight", e, 0, c.hidden_dim);
        expert_rows(p + "ffn_up_exps.weight", e, 0, c.hidden_dim);
        expert_cols(p + "ffn_down_exps.weight", e, 0, c.hidden_dim);
      }
      continue;
    }
    rows(p + "attn_q.weight", q0, nq);
    rows(p + "attn_k.weight", k0, nk);
    rows(p + "attn_v.weight", k0, nk);
    cols(p + "attn_output.weight", q0, nq);
    // Q/K/V biases (qwen2, qwen2moe): the loader reads every layer's whole.
    for (auto bias : {"attn_q.bias", "attn_k.bias", "attn_v.bias"}) whole(p + bias, false);
    if (!c.moe()) {
      rows(p + "ffn_gate.weight", f0, nf);
      rows(p + "ffn_up.weight", f0, nf);
      cols(p + "ffn_down.weight", f0, nf);
      continue;
    }
    whole(p + "ffn_gate_inp.weight", true);
    if (spec.routed)
      for (int e = 0; e < c.n_experts; ++e) {
        expert_rows(p + "ffn_gate_exps.weight", e, f0, nf);
        expert_rows(p + "ffn_up_exps.weight", e, f0, nf);
        expert_cols(p + "ffn_down_exps.weight", e, f0, nf);
      }
    if (c.shared_hidden) {
      // The shared gate is read (converted) by the loader for every layer; the
      // shared expert's matrices only by the slice starting at unit 0.
      whole(p + "ffn_gate_inp_shexp.weight", true);
      if (f0 == 0)
        for (auto t : {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
          whole(p + t, true);
    }
  }
  if (spec.classifier) {
    const bool tied = c.shared_classifier;
    if (!(tied && spec.embedding))
      rows(tied ? "token_embd.weight" : "output.weight", spec.vocab_first(), spec.vocab_rows(c.vocab_size));
  }
  if (!error.empty()) return make_error(error);
  return {};
}

}  // namespace

result<manifest> make_manifest(const model_file& file, const slice_spec& spec, const std::string& name) {
  if (auto ok = check_spec(file.cfg(), spec); !ok) return ok.err();
  if (name.find('\n') != std::string::npos)
    return make_error("manifest: model name '" + name + "' has a line break");
  // Digests are of the file's own bytes (the same on every host), offsets
  // those of the loaded image (the same layout: conversions keep offsets).
  const uint8_t* bytes = file.file_image();
  if (!bytes)
    return make_error(file.path() + ": a slice image converted to this host's byte order cannot be sliced "
                      "again (manifest)");
  builder b{file.image(), file.file_bytes(), {}, {}};
  if (file.quantized()) {
    b.add("file", "bytes", 0, file.file_bytes());
  } else if (file.gguf()) {
    if (auto r = gguf_entries(file, spec, b); !r) return r.err();
  } else {
    llama2c_entries(file, spec, b);
  }
  if (!b.error.empty()) return make_error(file.path() + ": " + b.error);
  manifest m;
  m.model_name = name;
  m.format = file.format_name();
  m.file_bytes = file.file_bytes();
  for (auto& e : b.out) {
    if (e.name.find_first_of(" \t\n") != std::string::npos)
      return make_error(file.path() + ": tensor name '" + e.name + "' has white space (manifest)");
    e.digest = digest_segments(bytes, e.offset, e.length, e.stride, e.count);
  }
  m.entries = std::move(b.out);
  return m;
}

result<void> copy_slice_bytes(const manifest& m, const uint8_t* file, uint64_t at, uint64_t n, uint8_t* out) {
  const uint64_t total = m.bytes();
  if (at > total || n > total - at)
    return make_error("slice of " + m.model_name + ": bytes [" + std::to_string(at) + ", " + std::to_string(at + n) +
                      ") requested, the slice has " + std::to_string(total));
  uint64_t pos = 0;  // start of the current segment in the slice image
  for (const auto& e : m.entries) {
    if (pos + e.bytes() <= at) {
      pos += e.bytes();
      continue;
    }
    for (uint64_t i = 0; i < e.count && n > 0; ++i, pos += e.length) {
      if (pos + e.length <= at) continue;
      const uint64_t skip = at > pos ? at - pos : 0;
      const uint64_t take = std::min(e.length - skip, n);
      std::memcpy(out, file + e.offset + i * e.stride + skip, take);
      out += take;
      at += take;
      n -= take;
    }
    if (n == 0) break;
  }
  return {};
}

namespace {

/// Huge pages only where the slice covers whole 2 MiB runs of the sparse
/// image (contiguous entries merged): a strided column slice keeps only its
/// own 4 KiB pages resident (the memory budgets count slice bytes).
void advise_slice_runs(const manifest& m, uint8_t* image) {
  uint64_t run_begin = 0, run_end = 0;
  for (const auto& e : m.entries) {
    const bool contiguous = e.count <= 1 || e.stride == e.length;
    const uint64_t b = e.offset, end = e.offset + (contiguous ? e.count * e.length : e.length);
    if (contiguous && b == run_end && run_end > run_begin) {
      run_end = end;
      continue;
    }
    if (run_end > run_begin) advise_huge_pages(image + run_begin, run_end - run_begin);
    run_begin = b;
    run_end = contiguous ? end : b;  // a strided entry starts no run
  }
  if (run_end > run_begin) advise_huge_pages(image + run_begin, run_end - run_begin);
}

}  // namespace

namespace {

/// The node's copy of the model at `path`, opened (the caller closes the
/// descriptor), after checking its size against the manifest's file.
result<int> open_model_copy(const manifest& m, const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return make_error(path + ": cannot open: " + std::strerror(errno));
  struct stat sb;
  if (::fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) != m.file_bytes) {
    ::close(fd);
    return make_error(path + ": " + std::to_string(static_cast<uint64_t>(sb.st_size)) + " bytes, expected " +
                      std::to_string(m.file_bytes) + " (the front end's " + m.model_name + ")");
  }
  return fd;
}

/// Reads segment `i` of entry `e` (e.length bytes at its file offset) into `dst`.
result<void> pread_segment(int fd, const manifest_entry& e, uint64_t i, uint8_t* dst, const std::string& path) {
  const uint64_t at = e.offset + i * e.stride;
  uint64_t done = 0;
  while (done < e.length) {
    const ssize_t r = ::pread(fd, dst + done, e.length - done, static_cast<off_t>(at + done));
    if (r <= 0)
      return make_error(path + ": short read of " + e.name + " at byte " + std::to_string(at + done) +
                        (r < 0 ? std::string(": ") + std::strerror(errno) : ""));
    done += static_cast<uint64_t>(r);
  }
  return {};
}

/// The error for entry `e` whose bytes hash to `d` instead of e.digest.
std::string digest_mismatch(const manifest& m, const manifest_entry& e, uint64_t d, const std::string& where) {
  return where + ": tensor " + e.name + " of " + m.model_name + " has digest " + format_digest(d) + ", expected " +
         format_digest(e.digest) + " (XXH3 of its " + std::to_string(e.bytes()) + " bytes)";
}

}  // namespace

result<std::vector<uint8_t>> read_slice_file(const manifest& m, const std::string& path, uint64_t* bytes_read) {
  if (bytes_read) *bytes_read = 0;
  auto fd = open_model_copy(m, path);
  if (!fd) return fd.err();
  std::vector<uint8_t> out = large_buffer(m.bytes());
  uint8_t* p = out.data();
  for (const auto& e : m.entries)
    for (uint64_t i = 0; i < e.count; ++i) {
      auto ok = pread_segment(*fd, e, i, p, path);
      if (!ok) {
        ::close(*fd);
        return ok.err();
      }
      p += e.length;
      if (bytes_read) *bytes_read += e.length;
    }
  ::close(*fd);
  return out;
}

result<std::shared_ptr<const model_file>> open_slice_file(const manifest& m, const std::string& path,
                                                          const std::string& where, load_options opts,
                                                          uint64_t* bytes_read, slice_file_failure* failure) {
  if (bytes_read) *bytes_read = 0;
  if (failure) *failure = slice_file_failure::read;
  auto fd = open_model_copy(m, path);
  if (!fd) return make_error(where + ": " + fd.message());
  std::string err;
  slice_file_failure what = slice_file_failure::none;
  uint64_t read_total = 0;
  auto f = model_file::from_sparse(
      m.file_bytes,
      [&](uint8_t* image) {
        advise_slice_runs(m, image);
        for (const auto& e : m.entries)
          for (uint64_t i = 0; i < e.count; ++i) {
            auto ok = pread_segment(*fd, e, i, image + e.offset + i * e.stride, path);
            if (!ok) {
              err = where + ": " + ok.message();
              what = slice_file_failure::read;
              return;
            }
            read_total += e.length;
          }
        // Every entry's digest, over its segments in place (before the
        // loader parses, or a big-endian host converts, the image).
        XXH3_state_t* st = XXH3_createState();
        for (const auto& e : m.entries) {
          XXH3_64bits_reset(st);
          for (uint64_t i = 0; i < e.count; ++i) XXH3_64bits_update(st, image + e.offset + i * e.stride, e.length);
          const uint64_t d = XXH3_64bits_digest(st);
          if (d != e.digest) {
            err = digest_mismatch(m, e, d, where);
            what = slice_file_failure::digest;
            break;
          }
        }
        XXH3_freeState(st);
      },
      m.model_name + " (slice " + m.key() + ")", opts);
  ::close(*fd);
  if (bytes_read) *bytes_read = read_total;
  if (!err.empty()) {
    if (failure) *failure = what;
    return make_error(err);
  }
  if (!f) {
    if (failure) *failure = slice_file_failure::model;
    return f.err();
  }
  if (failure) *failure = slice_file_failure::none;
  return *f;
}

result<void> verify_slice(const manifest& m, const uint8_t* slice, uint64_t n, const std::string& where) {
  if (n != m.bytes())
    return make_error(where + ": " + std::to_string(n) + " bytes, expected " + std::to_string(m.bytes()) +
                      " (the slice of " + m.model_name + " " + m.key() + ")");
  uint64_t pos = 0;
  for (const auto& e : m.entries) {
    const uint64_t d = XXH3_64bits(slice + pos, e.bytes());
    if (d != e.digest) return make_error(digest_mismatch(m, e, d, where));
    pos += e.bytes();
  }
  return {};
}

result<std::shared_ptr<const model_file>> open_slice(const manifest& m, const uint8_t* slice, uint64_t n,
                                                     load_options opts) {
  if (n != m.bytes())
    return make_error("slice of " + m.model_name + ": " + std::to_string(n) + " bytes, expected " +
                      std::to_string(m.bytes()));
  return model_file::from_sparse(
      m.file_bytes,
      [&](uint8_t* image) {
        advise_slice_runs(m, image);
        const uint8_t* p = slice;
        for (const auto& e : m.entries)
          for (uint64_t i = 0; i < e.count; ++i) {
            std::memcpy(image + e.offset + i * e.stride, p, e.length);
            p += e.length;
          }
      },
      m.model_name + " (slice " + m.key() + ")", opts);
}

void advise_huge_pages(void* p, uint64_t n) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t huge = uintptr_t{2} << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) & ~(huge - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)n;
#endif
}

std::vector<uint8_t> large_buffer(uint64_t n) {
  std::vector<uint8_t> v;
  v.reserve(static_cast<size_t>(n));  // allocated, not yet touched
  advise_huge_pages(v.data(), n);
  v.resize(static_cast<size_t>(n));
  return v;
}

}  // namespace cellshard::model
