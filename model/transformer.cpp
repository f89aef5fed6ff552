#include "model/transformer.hpp"

#include "kernels/reference.hpp"
#include "model/moe.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace cellshard::model {

namespace {
// RMSNorm and RoPE with the model's own epsilon and base (GGUF metadata). The
// backends implement run.c's constants (1e-5, 10000), which stay on their
// path bit for bit; other values take the reference kernels' parametric
// versions (both are O(dim) per position, beside matvecs of O(dim^2)).
void norm(const kernels::backend& be, const config& c, float* out, const float* x, const float* w, int n) {
  if (c.rms_eps == 1e-5f) be.rmsnorm(out, x, w, n);
  else kernels::ref::rmsnorm_eps(out, x, w, n, c.rms_eps);
}
// NEOX order to adjacent pairs, per head of hs elements: element 2i takes
// dimension i, element 2i+1 dimension i + hs/2.
void neox_to_pairs(float* v, int n, int hs) {
  float stack[512];
  std::vector<float> heap;
  float* tmp = stack;
  if (hs > 512) {
    heap.resize(static_cast<size_t>(hs));
    tmp = heap.data();
  }
  const int half = hs / 2;
  for (int h0 = 0; h0 < n; h0 += hs) {
    std::memcpy(tmp, v + h0, static_cast<size_t>(hs) * sizeof(float));
    for (int i = 0; i < half; ++i) {
      v[h0 + 2 * i] = tmp[i];
      v[h0 + 2 * i + 1] = tmp[half + i];
    }
  }
}

// NEOX RoPE (qwen2, qwen2moe): a head's dimension i rotates with i + hs/2
// (llama's converted files: 2i with 2i+1). The weights stay in the file's
// order; each position's q and k (after the biases) are reordered into
// adjacent pairs before the pairwise RoPE kernels, the same permutation for
// both, so q.k is unchanged and the KV cache holds k in pair order.
bool neox_rope(const config& c) { return c.arch == "qwen2" || c.arch == "qwen2moe"; }

void rotate(const kernels::backend& be, const shard_weights& w, float* q, int nq, float* k, int nk, int pos) {
  const config& c = w.cfg();
  if (neox_rope(c)) {
    neox_to_pairs(q, nq, c.head_size());
    neox_to_pairs(k, nk, c.head_size());
  }
  const float* factors = w.file().rope_factors();
  if (c.rope_theta == 10000.0f && !factors) be.rope(q, nq, k, nk, pos, c.head_size());
  else kernels::ref::rope_base(q, nq, k, nk, pos, c.head_size(), c.rope_theta, factors);
}
}  // namespace

const char* to_string(weight_format f) {
  return f == weight_format::f32 ? "f32" : f == weight_format::q8_0 ? "q8_0" : "q4_0";
}

result<weight_format> parse_weight_format(const std::string& s) {
  if (s == "f32") return weight_format::f32;
  if (s == "q8_0") return weight_format::q8_0;
  if (s == "q4_0") return weight_format::q4_0;
  return make_error("--weights: unknown format '" + s + "', expected f32, q8_0 or q4_0");
}

result<kernels::matmul_mode> parse_matmul_mode(const std::string& s) {
  if (s == "exact") return kernels::matmul_mode::exact;
  if (s == "ggml") return kernels::matmul_mode::ggml;
  return make_error("--matmul: unknown mode '" + s + "', expected exact or ggml");
}

slice_spec slice_spec::whole(const config& c) {
  slice_spec s;
  s.layer_end = c.n_layers;
  s.kv_head_end = c.n_kv_heads;
  s.ffn_end = c.hidden_dim;
  s.embedding = true;
  s.classifier = true;
  return s;
}

bool slice_spec::holds_expert(int e) const {
  if (expert_only()) return std::find(experts.begin(), experts.end(), e) != experts.end();
  return routed;
}

std::string slice_spec::to_string() const {
  std::ostringstream os;
  os << "layers [" << layer_begin << "," << layer_end << ") kv heads [" << kv_head_begin << ","
     << kv_head_end << ") ffn [" << ffn_begin << "," << ffn_end << ")"
     << (embedding ? " +embedding" : "") << (classifier ? " +classifier" : "");
  if (!routed) os << " no routed experts";
  if (expert_only()) {
    os << " experts {";
    for (size_t i = 0; i < experts.size(); ++i) os << (i ? "," : "") << experts[i];
    os << "} only";
  }
  if (classifier && vocab_end != 0) os << " vocab [" << vocab_begin << "," << vocab_end << ")";
  return os.str();
}

uint64_t matrix::bytes() const {
  if (data) return static_cast<uint64_t>(rows) * kernels::row_bytes(type, cols);
  if (q8) return static_cast<uint64_t>(rows) * kernels::q8_blocks_per_row(cols) *
                 sizeof(kernels::q8_block);
  if (q4) return static_cast<uint64_t>(rows) * kernels::q8_blocks_per_row(cols) *
                 sizeof(kernels::q4_block);
  return static_cast<uint64_t>(rows) * cols * sizeof(float);
}

namespace {

// q8_0/q4_0 matrices quantized at load (--weights) have the GGUF types' block
// layouts, so under ggml precision they go through the typed slot, which is
// the one that carries the mode (the q8/q4 slots always multiply exactly).
bool ggml_quant(const kernels::backend& be, const matrix& m, kernels::matmul_mode mode) {
  return mode == kernels::matmul_mode::ggml && (m.q8 || m.q4) && be.matvec_typed &&
         m.cols % kernels::q8_block_size == 0;
}
const uint8_t* quant_data(const matrix& m) {
  return m.q8 ? reinterpret_cast<const uint8_t*>(m.q8) : reinterpret_cast<const uint8_t*>(m.q4);
}
kernels::dtype quant_type(const matrix& m) { return m.q8 ? kernels::dtype::q8_0 : kernels::dtype::q4_0; }
std::size_t quant_stride(const matrix& m) {
  return static_cast<std::size_t>(kernels::q8_blocks_per_row(m.cols)) *
         (m.q8 ? sizeof(kernels::q8_block) : sizeof(kernels::q4_block));
}

}  // namespace

void matvec(const kernels::backend& be, float* out, const matrix& m, const float* x,
            kernels::matmul_mode mode) {
  if (m.data) be.matvec_typed(out, m.data, m.type, m.stride, x, m.rows, m.cols, mode);
  else if (ggml_quant(be, m, mode))
    be.matvec_typed(out, quant_data(m), quant_type(m), quant_stride(m), x, m.rows, m.cols, mode);
  else if (m.q8) be.matvec_q8(out, m.q8, x, m.rows, m.cols);
  else if (m.q4) (be.matvec_q4 ? be.matvec_q4 : kernels::ref::matvec_q4)(out, m.q4, x, m.rows, m.cols);
  else be.matvec(out, m.f32, x, m.rows, m.cols, m.ld);
}

void matmul(const kernels::backend& be, float* out, int ldo, const matrix& m, const float* X,
            int ldx, int n, kernels::matmul_mode mode) {
  if (m.data && be.matmul_typed) {
    be.matmul_typed(out, ldo, m.data, m.type, m.stride, X, ldx, n, m.rows, m.cols, mode);
  } else if (ggml_quant(be, m, mode) && be.matmul_typed) {
    be.matmul_typed(out, ldo, quant_data(m), quant_type(m), quant_stride(m), X, ldx, n, m.rows, m.cols,
                    mode);
  } else if (ggml_quant(be, m, mode)) {
    for (int j = 0; j < n; ++j)
      matvec(be, out + static_cast<size_t>(j) * ldo, m, X + static_cast<size_t>(j) * ldx, mode);
  } else if (m.q8 && be.matmul_q8) {
    be.matmul_q8(out, ldo, m.q8, X, ldx, n, m.rows, m.cols);
  } else if (m.q4 && be.matmul_q4 && be.matvec_q4) {
    be.matmul_q4(out, ldo, m.q4, X, ldx, n, m.rows, m.cols);
  } else if (m.f32 && be.matmul) {
    be.matmul(out, ldo, m.f32, X, ldx, n, m.rows, m.cols, m.ld);
  } else {
    for (int j = 0; j < n; ++j)
      matvec(be, out + static_cast<size_t>(j) * ldo, m, X + static_cast<size_t>(j) * ldx, mode);
  }
}

namespace {

// A slice's Q/K/V bias rows (qwen2, qwen2moe), counted in *bytes.
void set_biases(shard_weights::layer& L, const moe_layer_view& m, int q0, int k0, int nq, int nk,
                uint64_t* bytes) {
  if (m.bq) L.bq = m.bq + q0;
  if (m.bk) L.bk = m.bk + k0;
  if (m.bv) L.bv = m.bv + k0;
  if (m.bq) *bytes += static_cast<uint64_t>(nq + 2 * nk) * sizeof(float);
}

}  // namespace

result<std::shared_ptr<const shard_weights>> shard_weights::make(
    std::shared_ptr<const model_file> file, slice_spec spec, weight_format fmt,
    kernels::matmul_mode matmul) {
  const config& c = file->cfg();
  auto bad = [&](const std::string& what) {
    return make_error("shard slice " + spec.to_string() + ": " + what + " (model: " +
                      c.to_string() + ")");
  };
  if (spec.layer_begin < 0 || spec.layer_end > c.n_layers || spec.layer_begin >= spec.layer_end)
    return bad("layer range outside [0," + std::to_string(c.n_layers) + ")");
  if (spec.kv_head_begin < 0 || spec.kv_head_end > c.n_kv_heads ||
      spec.kv_head_begin >= spec.kv_head_end)
    return bad("kv head range outside [0," + std::to_string(c.n_kv_heads) + ")");
  if (spec.ffn_begin < 0 || spec.ffn_end > c.hidden_dim || spec.ffn_begin >= spec.ffn_end)
    return bad("ffn range outside [0," + std::to_string(c.hidden_dim) + ")");
  if (spec.classifier && spec.vocab_end != 0 &&
      (spec.vocab_begin < 0 || spec.vocab_end > c.vocab_size || spec.vocab_begin >= spec.vocab_end))
    return bad("classifier rows outside [0," + std::to_string(c.vocab_size) + ")");
  if ((spec.expert_only() || !spec.routed) && !c.moe())
    return bad("an expert slice of a dense model (it has no experts)");
  if (spec.expert_only()) {
    if (spec.ffn_begin != 0 || spec.ffn_end != c.hidden_dim || spec.embedding || spec.classifier)
      return bad("an expert node holds whole experts and nothing else");
    for (size_t i = 0; i < spec.experts.size(); ++i)
      if (spec.experts[i] < 0 || spec.experts[i] >= c.n_experts || (i > 0 && spec.experts[i] <= spec.experts[i - 1]))
        return bad("experts must be ascending, distinct and in [0," + std::to_string(c.n_experts) + ")");
  }

  std::shared_ptr<shard_weights> w(new shard_weights());
  w->file_ = file;
  w->spec_ = spec;
  w->fmt_ = fmt;
  w->matmul_ = matmul == kernels::matmul_mode::count ? file->default_matmul() : matmul;
  const int hs = c.head_size(), d = c.dim, h = c.hidden_dim;
  const int q0 = spec.kv_head_begin * c.kv_mul() * hs;
  const int nq = spec.n_kv_heads() * c.kv_mul() * hs;
  const int k0 = spec.kv_head_begin * hs, nk = spec.n_kv_heads() * hs;
  const int f0 = spec.ffn_begin, nf = spec.ffn_units();

  auto view = [](const float* base, int rows, int cols, int ld) {
    matrix m;
    m.f32 = base;
    m.rows = rows;
    m.cols = cols;
    m.ld = ld;
    return m;
  };
  // q8_0 copies each matrix (row-padded to whole 32-blocks) and drops the f32 view.
  auto finish = [&](matrix m) {
    if (fmt == weight_format::q8_0) {
      const int nb = kernels::q8_blocks_per_row(m.cols);
      std::vector<kernels::q8_block> blocks(static_cast<size_t>(m.rows) * nb);
      for (int r = 0; r < m.rows; ++r)
        kernels::quantize_row_q8(m.f32 + static_cast<size_t>(r) * m.ld, &blocks[r * nb], m.cols);
      w->owned_.push_back(std::move(blocks));
      m.q8 = w->owned_.back().data();
      m.f32 = nullptr;
    } else if (fmt == weight_format::q4_0) {
      const int nb = kernels::q8_blocks_per_row(m.cols);
      std::vector<kernels::q4_block> blocks(static_cast<size_t>(m.rows) * nb);
      for (int r = 0; r < m.rows; ++r)
        kernels::quantize_row_q4(m.f32 + static_cast<size_t>(r) * m.ld, &blocks[r * nb], m.cols);
      w->owned_q4_.push_back(std::move(blocks));
      m.q4 = w->owned_q4_.back().data();
      m.f32 = nullptr;
    }
    w->bytes_ += m.bytes();
    return m;
  };
  w->owned_.reserve(static_cast<size_t>(spec.n_layers()) * (7 + 3 * c.n_experts) + 1);
  w->owned_q4_.reserve(static_cast<size_t>(spec.n_layers()) * (7 + 3 * c.n_experts) + 1);
  if (file->quantized()) return make_q8(std::move(w));
  if (file->has_non_f32()) return make_typed(std::move(w));
  w->emb_ = view(file->token_embedding(), c.vocab_size, d, d);
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    const layer_view v = file->layer(l);
    layer L;
    L.rms_att = v.rms_att;
    L.rms_ffn = v.rms_ffn;
    if (spec.expert_only()) {  // an expert node: its experts, whole, nothing else
      const moe_layer_view& m = file->moe_layer(l);
      auto f = [](const tensor_view& t) { return reinterpret_cast<const float*>(t.data); };
      L.ew1.resize(c.n_experts);
      L.ew3.resize(c.n_experts);
      L.ew2.resize(c.n_experts);
      for (int e : spec.experts) {
        L.ew1[e] = finish(view(f(m.w1[e]), h, d, d));
        L.ew3[e] = finish(view(f(m.w3[e]), h, d, d));
        L.ew2[e] = finish(view(f(m.w2[e]), d, h, h));
      }
      w->layers_.push_back(L);
      continue;
    }
    L.wq = finish(view(v.wq + static_cast<size_t>(q0) * d, nq, d, d));
    L.wk = finish(view(v.wk + static_cast<size_t>(k0) * d, nk, d, d));
    L.wv = finish(view(v.wv + static_cast<size_t>(k0) * d, nk, d, d));
    L.wo = finish(view(v.wo + q0, d, nq, d));
    if (!c.moe()) {
      L.w1 = finish(view(v.w1 + static_cast<size_t>(f0) * d, nf, d, d));
      L.w3 = finish(view(v.w3 + static_cast<size_t>(f0) * d, nf, d, d));
      L.w2 = finish(view(v.w2 + f0, d, nf, h));
    } else {
      const moe_layer_view& m = file->moe_layer(l);
      auto f = [](const tensor_view& t) { return reinterpret_cast<const float*>(t.data); };
      L.router = view(f(m.router), c.n_experts, d, d);  // llama.cpp's quantize keeps routers too
      w->bytes_ += L.router.bytes();
      for (int e = 0; e < c.n_experts; ++e) {
        if (!spec.routed) {  // a stage shard of an expert placement: the expert nodes hold them
          L.ew1.emplace_back();
          L.ew3.emplace_back();
          L.ew2.emplace_back();
          continue;
        }
        L.ew1.push_back(finish(view(f(m.w1[e]) + static_cast<size_t>(f0) * d, nf, d, d)));
        L.ew3.push_back(finish(view(f(m.w3[e]) + static_cast<size_t>(f0) * d, nf, d, d)));
        L.ew2.push_back(finish(view(f(m.w2[e]) + f0, d, nf, h)));
      }
      if (c.shared_hidden && f0 == 0) {
        const int sh = c.shared_hidden;
        L.sw1 = finish(view(f(m.sw1), sh, d, d));
        L.sw3 = finish(view(f(m.sw3), sh, d, d));
        L.sw2 = finish(view(f(m.sw2), d, sh, sh));
        L.shared_gate = m.shared_gate;
        w->bytes_ += static_cast<uint64_t>(d) * sizeof(float);
      }
    }
    set_biases(L, file->moe_layer(l), q0, k0, nq, nk, &w->bytes_);
    w->bytes_ += 2ull * d * sizeof(float);
    w->layers_.push_back(L);
  }
  if (spec.embedding) w->bytes_ += static_cast<uint64_t>(c.vocab_size) * d * sizeof(float);
  if (spec.classifier) {
    w->wcls_ = view(file->classifier() + static_cast<size_t>(spec.vocab_first()) * d,
                    spec.vocab_rows(c.vocab_size), d, d);
    // A shared classifier is the embedding table: quantize a copy for q8_0
    // (embedding lookups keep reading f32 rows), count it once for f32.
    const bool counted = c.shared_classifier && spec.embedding && fmt == weight_format::f32;
    const uint64_t before = w->bytes_;
    w->wcls_ = finish(w->wcls_);
    if (counted) w->bytes_ = before;
    w->bytes_ += static_cast<uint64_t>(d) * sizeof(float);
  }
  return std::shared_ptr<const shard_weights>(std::move(w));
}

// A q8_0 file: the slice's matrices as views of the file's blocks (row
// slices) or owned copies (column slices); see shard_weights::make.
result<std::shared_ptr<const shard_weights>> shard_weights::make_q8(std::shared_ptr<shard_weights> w) {
  const model_file& file = *w->file_;
  const config& c = file.cfg();
  const slice_spec& spec = w->spec_;
  w->fmt_ = weight_format::q8_0;
  const int hs = c.head_size(), d = c.dim;
  const int q0 = spec.kv_head_begin * c.kv_mul() * hs;
  const int nq = spec.n_kv_heads() * c.kv_mul() * hs;
  const int k0 = spec.kv_head_begin * hs, nk = spec.n_kv_heads() * hs;
  const int f0 = spec.ffn_begin, nf = spec.ffn_units();
  using kernels::q8_block;
  using kernels::q8_blocks_per_row;

  // Rows [r0, r0+n) of q: a view into the file.
  auto rows_of = [&](const q8_matrix& q, int r0, int n) {
    matrix m;
    m.q8 = q.blocks + static_cast<size_t>(r0) * q8_blocks_per_row(q.cols);
    m.rows = n;
    m.cols = m.ld = q.cols;
    w->bytes_ += m.bytes();
    return m;
  };
  // Columns [c0, c0+n) of every row of q: owned blocks.
  auto cols_of = [&](const q8_matrix& q, int c0, int n) {
    if (c0 == 0 && n == q.cols) return rows_of(q, 0, q.rows);
    const int nb_full = q8_blocks_per_row(q.cols), nb = q8_blocks_per_row(n);
    std::vector<q8_block> blocks(static_cast<size_t>(q.rows) * nb);
    const bool whole_blocks = c0 % kernels::q8_block_size == 0 &&
                              (n % kernels::q8_block_size == 0 || c0 + n == q.cols);
    std::vector<float> row(whole_blocks ? 0 : q.cols);
    for (int r = 0; r < q.rows; ++r) {
      const q8_block* src = q.blocks + static_cast<size_t>(r) * nb_full;
      if (whole_blocks) {
        std::memcpy(&blocks[static_cast<size_t>(r) * nb], src + c0 / kernels::q8_block_size,
                    nb * sizeof(q8_block));
      } else {
        kernels::dequantize_row_q8(src, row.data(), q.cols);
        kernels::quantize_row_q8(row.data() + c0, &blocks[static_cast<size_t>(r) * nb], n);
      }
    }
    w->owned_.push_back(std::move(blocks));
    matrix m;
    m.q8 = w->owned_.back().data();
    m.rows = q.rows;
    m.cols = m.ld = n;
    w->bytes_ += m.bytes();
    return m;
  };
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    const layer_view v = file.layer(l);
    const q8_layer_view q = file.q8_layer(l);
    layer L;
    L.rms_att = v.rms_att;
    L.rms_ffn = v.rms_ffn;
    L.wq = rows_of(q.wq, q0, nq);
    L.wk = rows_of(q.wk, k0, nk);
    L.wv = rows_of(q.wv, k0, nk);
    L.wo = cols_of(q.wo, q0, nq);
    L.w1 = rows_of(q.w1, f0, nf);
    L.w3 = rows_of(q.w3, f0, nf);
    L.w2 = cols_of(q.w2, f0, nf);
    w->bytes_ += 2ull * d * sizeof(float);
    w->layers_.push_back(L);
  }
  const q8_matrix e = file.q8_embedding();
  w->emb_.q8 = e.blocks;
  w->emb_.rows = e.rows;
  w->emb_.cols = w->emb_.ld = e.cols;
  if (spec.embedding) {
    w->emb_f32_.resize(static_cast<size_t>(e.rows) * e.cols);
    const int nb = q8_blocks_per_row(e.cols);
    for (int r = 0; r < e.rows; ++r)
      kernels::dequantize_row_q8(e.blocks + static_cast<size_t>(r) * nb,
                                 &w->emb_f32_[static_cast<size_t>(r) * e.cols], e.cols);
    w->bytes_ += w->emb_f32_.size() * sizeof(float);
  }
  if (spec.classifier) {
    w->wcls_ = rows_of(file.q8_classifier(), spec.vocab_first(), spec.vocab_rows(c.vocab_size));
    w->bytes_ += static_cast<uint64_t>(d) * sizeof(float);
  }
  return std::shared_ptr<const shard_weights>(std::move(w));
}

// A GGUF file with typed matrices: views in place; see shard_weights::make.
result<std::shared_ptr<const shard_weights>> shard_weights::make_typed(
    std::shared_ptr<shard_weights> w) {
  const model_file& file = *w->file_;
  const config& c = file.cfg();
  const slice_spec& spec = w->spec_;
  const int hs = c.head_size(), d = c.dim;
  const int q0 = spec.kv_head_begin * c.kv_mul() * hs;
  const int nq = spec.n_kv_heads() * c.kv_mul() * hs;
  const int k0 = spec.kv_head_begin * hs, nk = spec.n_kv_heads() * hs;
  const int f0 = spec.ffn_begin, nf = spec.ffn_units();

  auto rows_of = [&](const tensor_view& t, int r0, int n) {
    matrix m;
    m.data = t.data + static_cast<size_t>(r0) * t.row_bytes;
    m.type = t.type;
    m.stride = t.row_bytes;
    m.rows = n;
    m.cols = m.ld = t.cols;
    w->bytes_ += m.bytes();
    return m;
  };
  auto cols_of = [&](const tensor_view& t, int c0, int n) {
    const int be = kernels::block_elems(t.type);
    matrix m;
    m.rows = t.rows;
    m.cols = n;
    if (c0 % be == 0 && n % be == 0) {
      m.data = t.data + static_cast<size_t>(c0 / be) * kernels::block_bytes(t.type);
      m.type = t.type;
      m.stride = t.row_bytes;
      m.ld = n;
      w->bytes_ += m.bytes();
      return m;
    }
    // The slice starts on a 64-byte boundary. The native f32 kernels add a
    // row's columns in an order set by the row's address modulo 64
    // (kernels/native.cpp, f32_avx2/f32_avx512: a head up to the next
    // boundary, then aligned loads), and a heap buffer's address modulo 64
    // changes from run to run: without this, a tensor split of a q6_K file
    // gave different ids in different runs of the same command.
    std::vector<float> out(static_cast<size_t>(t.rows) * n + 64 / sizeof(float)), row(t.cols);
    const size_t skew = (64 - (reinterpret_cast<uintptr_t>(out.data()) & 63)) & 63;
    float* base = out.data() + skew / sizeof(float);  // malloc: 16-byte aligned at least
    for (int r = 0; r < t.rows; ++r) {
      kernels::dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_bytes, row.data(),
                              t.cols);
      std::memcpy(base + static_cast<size_t>(r) * n, row.data() + c0, n * sizeof(float));
    }
    w->owned_f32_.push_back(std::move(out));  // moving keeps the buffer, so base stays valid
    m.f32 = base;
    m.ld = n;
    w->bytes_ += m.bytes();
    return m;
  };
  w->owned_f32_.reserve(static_cast<size_t>(spec.n_layers()) * (2 + c.n_experts));
  for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
    const layer_view v = file.layer(l);
    const typed_layer_view t = file.typed_layer(l);
    layer L;
    L.rms_att = v.rms_att;
    L.rms_ffn = v.rms_ffn;
    if (spec.expert_only()) {  // an expert node: its experts, whole, nothing else
      const moe_layer_view& m = file.moe_layer(l);
      L.ew1.resize(c.n_experts);
      L.ew3.resize(c.n_experts);
      L.ew2.resize(c.n_experts);
      for (int e : spec.experts) {
        L.ew1[e] = rows_of(m.w1[e], 0, c.hidden_dim);
        L.ew3[e] = rows_of(m.w3[e], 0, c.hidden_dim);
        L.ew2[e] = cols_of(m.w2[e], 0, c.hidden_dim);
      }
      w->layers_.push_back(L);
      continue;
    }
    L.wq = rows_of(t.wq, q0, nq);
    L.wk = rows_of(t.wk, k0, nk);
    L.wv = rows_of(t.wv, k0, nk);
    L.wo = cols_of(t.wo, q0, nq);
    if (!c.moe()) {
      L.w1 = rows_of(t.w1, f0, nf);
      L.w3 = rows_of(t.w3, f0, nf);
      L.w2 = cols_of(t.w2, f0, nf);
    } else {
      const moe_layer_view& m = file.moe_layer(l);
      L.router = rows_of(m.router, 0, c.n_experts);
      for (int e = 0; e < c.n_experts; ++e) {
        if (!spec.routed) {  // a stage shard of an expert placement
          L.ew1.emplace_back();
          L.ew3.emplace_back();
          L.ew2.emplace_back();
          continue;
        }
        L.ew1.push_back(rows_of(m.w1[e], f0, nf));
        L.ew3.push_back(rows_of(m.w3[e], f0, nf));
        L.ew2.push_back(cols_of(m.w2[e], f0, nf));
      }
      if (c.shared_hidden && f0 == 0) {
        L.sw1 = rows_of(m.sw1, 0, c.shared_hidden);
        L.sw3 = rows_of(m.sw3, 0, c.shared_hidden);
        L.sw2 = cols_of(m.sw2, 0, c.shared_hidden);
        L.shared_gate = m.shared_gate;
        w->bytes_ += static_cast<uint64_t>(d) * sizeof(float);
      }
    }
    set_biases(L, file.moe_layer(l), q0, k0, nq, nk, &w->bytes_);
    w->bytes_ += 2ull * d * sizeof(float);
    w->layers_.push_back(L);
  }
  const tensor_view e = file.typed_embedding();
  w->emb_.data = e.data;
  w->emb_.type = e.type;
  w->emb_.stride = e.row_bytes;
  w->emb_.rows = e.rows;
  w->emb_.cols = w->emb_.ld = e.cols;
  // The embedding stays in its type; embed() dequantizes one row per token.
  const bool tied = c.shared_classifier;
  if (spec.embedding) w->bytes_ += e.bytes();
  if (spec.classifier) {
    const uint64_t before = w->bytes_;
    w->wcls_ = rows_of(file.typed_classifier(), spec.vocab_first(), spec.vocab_rows(c.vocab_size));
    if (tied && spec.embedding) w->bytes_ = before;  // the same bytes as the embedding
    w->bytes_ += static_cast<uint64_t>(d) * sizeof(float);
  }
  return std::shared_ptr<const shard_weights>(std::move(w));
}

void shard_weights::embed(int token, float* out) const {
  const int dim = cfg().dim;
  if (emb_.data) {
    kernels::dequantize_row(emb_.type, emb_.data + static_cast<size_t>(token) * emb_.stride, out,
                            dim);
    return;
  }
  if (const float* table = embedding()) {
    std::memcpy(out, table + static_cast<size_t>(token) * dim, dim * sizeof(float));
    return;
  }
  kernels::dequantize_row_q8(emb_.q8 + static_cast<size_t>(token) * kernels::q8_blocks_per_row(dim), out,
                             dim);
}

kv_cache::kv_cache(int n_layers, int seq_len, int kv_dim)
    : n_layers_(n_layers), seq_len_(seq_len), kv_dim_(kv_dim),
      k_(static_cast<size_t>(n_layers) * seq_len * kv_dim, 0.0f),
      v_(static_cast<size_t>(n_layers) * seq_len * kv_dim, 0.0f) {}

std::vector<float> kv_cache::rows(int from, int to) const {
  std::vector<float> out;
  const size_t n = static_cast<size_t>(to - from) * kv_dim_;
  out.reserve(2 * n * n_layers_);
  for (int l = 0; l < n_layers_; ++l) {
    out.insert(out.end(), key(l, from), key(l, from) + n);
    out.insert(out.end(), value(l, from), value(l, from) + n);
  }
  return out;
}

void kv_cache::restore(int from, int to, const std::vector<float>& data) {
  const size_t n = static_cast<size_t>(to - from) * kv_dim_;
  const float* p = data.data();
  for (int l = 0; l < n_layers_; ++l) {
    std::memcpy(key(l, from), p, n * sizeof(float));
    p += n;
    std::memcpy(value(l, from), p, n * sizeof(float));
    p += n;
  }
}

scratch::scratch(const shard_weights& w) {
  const config& c = w.cfg();
  const int nq = w.n_heads_local() * c.head_size();
  xb.resize(c.dim);
  q.resize(nq);
  attn.resize(nq);
  att.resize(static_cast<size_t>(w.n_heads_local()) * c.seq_len);
  const int units = std::max(w.spec().ffn_units(), c.shared_hidden);
  hb.resize(units);
  hb2.resize(units);
  partial.resize(c.dim);
  if (c.moe()) {
    router.resize(c.n_experts);
    expert_out.resize(c.dim);
    route_w.resize(c.n_experts_used);
    route_ids.resize(c.n_experts_used);
  }
  dim_ = c.dim;
  nq_ = nq;
  units_ = w.spec().ffn_units();
}

void scratch::batch(int n) {
  const size_t N = static_cast<size_t>(n);
  if (xb_n.size() >= N * dim_) return;
  xb_n.resize(N * dim_);
  partial_n.resize(N * dim_);
  q_n.resize(N * nq_);
  attn_n.resize(N * nq_);
  hb_n.resize(N * units_);
  hb2_n.resize(N * units_);
}

void attention_partial(const kernels::backend& be, const shard_weights& w, int l,
                       const float* x, int pos, kv_cache& kv, scratch& s, float* partial) {
  const config& c = w.cfg();
  const auto& L = w.at(l);
  const int li = l - w.spec().layer_begin;
  norm(be, c, s.xb.data(), x, L.rms_att, c.dim);
  float* k = kv.key(li, pos);
  float* v = kv.value(li, pos);
  matvec(be, s.q.data(), L.wq, s.xb.data(), w.matmul());
  matvec(be, k, L.wk, s.xb.data(), w.matmul());
  matvec(be, v, L.wv, s.xb.data(), w.matmul());
  if (L.bq) {
    for (int i = 0; i < L.wq.rows; ++i) s.q[i] += L.bq[i];
    for (int i = 0; i < L.wk.rows; ++i) k[i] += L.bk[i];
    for (int i = 0; i < L.wv.rows; ++i) v[i] += L.bv[i];
  }
  rotate(be, w, s.q.data(), L.wq.rows, k, L.wk.rows, pos);
  be.attention(s.attn.data(), s.q.data(), kv.key(li, 0), kv.value(li, 0), s.att.data(),
               w.n_heads_local(), c.kv_mul(), c.head_size(), kv.kv_dim(), pos);
  matvec(be, partial, L.wo, s.attn.data(), w.matmul());
}

void ffn_input(const kernels::backend& be, const shard_weights& w, int l, const float* x, float* xb) {
  norm(be, w.cfg(), xb, x, w.at(l).rms_ffn, w.cfg().dim);
}

void ffn_partial(const kernels::backend& be, const shard_weights& w, int l, const float* x,
                 scratch& s, float* partial) {
  const config& c = w.cfg();
  const auto& L = w.at(l);
  norm(be, c, s.xb.data(), x, L.rms_ffn, c.dim);
  if (c.moe()) {
    moe_ffn(be, w, l, s.xb.data(), s, partial);
    return;
  }
  matvec(be, s.hb.data(), L.w1, s.xb.data(), w.matmul());
  matvec(be, s.hb2.data(), L.w3, s.xb.data(), w.matmul());
  be.swiglu(s.hb.data(), s.hb2.data(), L.w1.rows);
  matvec(be, partial, L.w2, s.hb.data(), w.matmul());
}

void attention_partial_batch(const kernels::backend& be, const shard_weights& w, int l,
                             const float* x, int pos0, int n, kv_cache& kv, scratch& s,
                             float* partial) {
  const config& c = w.cfg();
  const auto& L = w.at(l);
  const int li = l - w.spec().layer_begin;
  const int dim = c.dim, nq = L.wq.rows, nk = L.wk.rows, kvd = kv.kv_dim();
  s.batch(n);
  for (int i = 0; i < n; ++i)
    norm(be, c, s.xb_n.data() + static_cast<size_t>(i) * dim, x + static_cast<size_t>(i) * dim, L.rms_att,
               dim);
  matmul(be, s.q_n.data(), nq, L.wq, s.xb_n.data(), dim, n, w.matmul());
  matmul(be, kv.key(li, pos0), kvd, L.wk, s.xb_n.data(), dim, n, w.matmul());
  matmul(be, kv.value(li, pos0), kvd, L.wv, s.xb_n.data(), dim, n, w.matmul());
  if (L.bq)  // Q/K/V biases, as attention_partial adds them
    for (int i = 0; i < n; ++i) {
      float* q = s.q_n.data() + static_cast<size_t>(i) * nq;
      float* k = kv.key(li, pos0 + i);
      float* v = kv.value(li, pos0 + i);
      for (int j = 0; j < nq; ++j) q[j] += L.bq[j];
      for (int j = 0; j < nk; ++j) k[j] += L.bk[j];
      for (int j = 0; j < L.wv.rows; ++j) v[j] += L.bv[j];
    }
  for (int i = 0; i < n; ++i) {
    float* q = s.q_n.data() + static_cast<size_t>(i) * nq;
    rotate(be, w, q, nq, kv.key(li, pos0 + i), nk, pos0 + i);
    be.attention(s.attn_n.data() + static_cast<size_t>(i) * nq, q, kv.key(li, 0), kv.value(li, 0),
                 s.att.data(), w.n_heads_local(), c.kv_mul(), c.head_size(), kvd, pos0 + i);
  }
  matmul(be, partial, dim, L.wo, s.attn_n.data(), nq, n, w.matmul());
}

void ffn_partial_batch(const kernels::backend& be, const shard_weights& w, int l, const float* x,
                       int n, scratch& s, float* partial) {
  const config& c = w.cfg();
  const auto& L = w.at(l);
  const int dim = c.dim, u = L.w1.rows;
  if (c.moe()) {  // each position routes to its own experts: one position at a time
    for (int i = 0; i < n; ++i)
      ffn_partial(be, w, l, x + static_cast<size_t>(i) * dim, s, partial + static_cast<size_t>(i) * dim);
    return;
  }
  s.batch(n);
  for (int i = 0; i < n; ++i)
    norm(be, c, s.xb_n.data() + static_cast<size_t>(i) * dim, x + static_cast<size_t>(i) * dim, L.rms_ffn,
               dim);
  matmul(be, s.hb_n.data(), u, L.w1, s.xb_n.data(), dim, n, w.matmul());
  matmul(be, s.hb2_n.data(), u, L.w3, s.xb_n.data(), dim, n, w.matmul());
  for (int i = 0; i < n; ++i)
    be.swiglu(s.hb_n.data() + static_cast<size_t>(i) * u, s.hb2_n.data() + static_cast<size_t>(i) * u, u);
  matmul(be, partial, dim, L.w2, s.hb_n.data(), u, n, w.matmul());
}

void stage_forward_batch(const kernels::backend& be, const shard_weights& w, float* x, int pos0,
                         int n, kv_cache& kv, scratch& s) {
  const size_t total = static_cast<size_t>(n) * w.cfg().dim;
  s.batch(n);
  float* partial = s.partial_n.data();
  for (int l = w.spec().layer_begin; l < w.spec().layer_end; ++l) {
    attention_partial_batch(be, w, l, x, pos0, n, kv, s, partial);
    for (size_t i = 0; i < total; ++i) x[i] += partial[i];
    ffn_partial_batch(be, w, l, x, n, s, partial);
    for (size_t i = 0; i < total; ++i) x[i] += partial[i];
  }
}

void stage_forward(const kernels::backend& be, const shard_weights& w, float* x, int pos,
                   kv_cache& kv, scratch& s) {
  const int dim = w.cfg().dim;
  std::vector<float>& partial = s.partial;
  for (int l = w.spec().layer_begin; l < w.spec().layer_end; ++l) {
    attention_partial(be, w, l, x, pos, kv, s, partial.data());
    for (int i = 0; i < dim; ++i) x[i] += partial[i];
    ffn_partial(be, w, l, x, s, partial.data());
    for (int i = 0; i < dim; ++i) x[i] += partial[i];
  }
}

void classify(const kernels::backend& be, const shard_weights& w, float* x, float* logits) {
  norm(be, w.cfg(), x, x, w.rms_final(), w.cfg().dim);
  matvec(be, logits, w.classifier(), x, w.matmul());
}

engine::engine(std::shared_ptr<const shard_weights> w, const kernels::backend& be)
    : w_(std::move(w)), be_(&be),
      kv_(w_->spec().n_layers(), w_->cfg().seq_len, w_->spec().n_kv_heads() * w_->cfg().head_size()),
      s_(*w_), x_(w_->cfg().dim), logits_(w_->cfg().vocab_size) {}

const float* engine::forward(int token, int pos) {
  w_->embed(token, x_.data());
  stage_forward(*be_, *w_, x_.data(), pos, kv_, s_);
  classify(*be_, *w_, x_.data(), logits_.data());
  return logits_.data();
}

const float* engine::prefill(const int* tokens, int n, int pos0, float* all_logits) {
  const int dim = w_->cfg().dim, vocab = w_->cfg().vocab_size;
  const int B = std::min(batch_size_, n);
  if (xn_.size() < static_cast<size_t>(B) * dim) xn_.resize(static_cast<size_t>(B) * dim);
  for (int i0 = 0; i0 < n; i0 += B) {
    const int m = std::min(B, n - i0);
    for (int i = 0; i < m; ++i) w_->embed(tokens[i0 + i], xn_.data() + static_cast<size_t>(i) * dim);
    stage_forward_batch(*be_, *w_, xn_.data(), pos0 + i0, m, kv_, s_);
    if (all_logits) {
      for (int i = 0; i < m; ++i) {
        float* xi = xn_.data() + static_cast<size_t>(i) * dim;
        norm(*be_, w_->cfg(), xi, xi, w_->rms_final(), dim);  // the model's epsilon, as classify()
      }
      matmul(*be_, all_logits + static_cast<size_t>(i0) * vocab, vocab, w_->classifier(), xn_.data(), dim,
             m, w_->matmul());
      if (i0 + m == n)
        std::memcpy(logits_.data(), all_logits + static_cast<size_t>(n - 1) * vocab, vocab * sizeof(float));
    } else if (i0 + m == n) {
      classify(*be_, *w_, xn_.data() + static_cast<size_t>(m - 1) * dim, logits_.data());
    }
  }
  return logits_.data();
}

}  // namespace cellshard::model
