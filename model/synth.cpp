#include "model/synth.hpp"

#include "model/checkpoint.hpp"
#include "model/gguf.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace cellshard::model {

result<config> synth_preset(const std::string& name) {
  config c;
  c.shared_classifier = true;
  if (name == "stories260k") c = {64, 172, 5, 8, 4, 512, 512, true};
  else if (name == "stories15m") c = {288, 768, 6, 6, 6, 32000, 256, true};
  else if (name == "stories42m") c = {512, 1376, 8, 8, 8, 32000, 1024, true};
  else if (name == "stories110m") c = {768, 2048, 12, 12, 12, 32000, 1024, true};
  else
    return make_error("synth --config: unknown preset '" + name +
                      "', expected stories260k, stories15m, stories42m, stories110m or custom");
  return c;
}

namespace {

struct splitmix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1) from the top 24 bits (exactly representable floats).
  float uniform() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

class writer {
public:
  explicit writer(const std::function<void(const void*, size_t)>& sink) : sink_(sink) {}
  void put(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (host_is_big_endian()) u = __builtin_bswap32(u);
    buf_.push_back(u);
    if (buf_.size() == 1 << 16) flush();
  }
  void flush() {
    if (!buf_.empty()) sink_(buf_.data(), buf_.size() * 4);
    buf_.clear();
  }

private:
  const std::function<void(const void*, size_t)>& sink_;
  std::vector<uint32_t> buf_;
};

}  // namespace

void synth_write(const config& c, uint64_t seed,
                 const std::function<void(const void*, size_t)>& sink) {
  int32_t hdr[7] = {c.dim,     c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                    c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
  if (host_is_big_endian())
    for (auto& v : hdr) v = static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(v)));
  sink(hdr, sizeof hdr);
  splitmix64 rng{seed};
  writer w(sink);
  auto fill = [&](uint64_t n, int fan_in) {
    const float a = std::sqrt(3.0f / static_cast<float>(fan_in));
    for (uint64_t i = 0; i < n; ++i) w.put(a * rng.uniform());
  };
  auto ones = [&](uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) w.put(1.0f);
  };
  const uint64_t L = c.n_layers, d = c.dim, kv = c.kv_dim(), h = c.hidden_dim, V = c.vocab_size;
  // Token embeddings get variance 1/dim like the projections. With unit
  // variance a shared classifier would score the input token far above every
  // other (x . emb[t] ~ |emb[t]|^2 = dim), so a random model would repeat its
  // first token, BOS included, and stop at once; at 1/dim the layers' outputs
  // dominate and generation wanders through the vocabulary.
  fill(V * d, c.dim);
  ones(L * d);      // rms_att
  fill(L * d * d, c.dim);   // wq
  fill(L * kv * d, c.dim);  // wk
  fill(L * kv * d, c.dim);  // wv
  fill(L * d * d, c.dim);   // wo
  ones(L * d);              // rms_ffn
  fill(L * h * d, c.dim);   // w1
  fill(L * d * h, c.hidden_dim);  // w2
  fill(L * h * d, c.dim);   // w3
  ones(d);                  // rms_final
  // RoPE tables as llama2.c's export.py writes them (cos then sin, each
  // [seq_len x head_size/2]); run.c skips them.
  const int hs = c.head_size();
  for (int table = 0; table < 2; ++table)
    for (int p = 0; p < c.seq_len; ++p)
      for (int i = 0; i < hs / 2; ++i) {
        const double freq = 1.0 / std::pow(10000.0, (2.0 * i) / hs);
        const double ang = p * freq;
        w.put(static_cast<float>(table == 0 ? std::cos(ang) : std::sin(ang)));
      }
  if (!c.shared_classifier) fill(V * d, c.dim);
  w.flush();
}

result<void> synth_file(const config& c, uint64_t seed, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(path + ": cannot create: " + std::strerror(errno));
  bool ok = true;
  synth_write(c, seed, [&](const void* p, size_t n) {
    if (ok && std::fwrite(p, 1, n, f) != n) ok = false;
  });
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return make_error(path + ": write failed: " + std::strerror(errno));
  return {};
}

std::vector<uint8_t> synth_bytes(const config& c, uint64_t seed) {
  std::vector<uint8_t> out;
  out.reserve(checkpoint_bytes(c));
  synth_write(c, seed, [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  });
  return out;
}

std::vector<uint8_t> synth_gguf(const config& c, uint64_t seed) {
  const bool qwen = c.shared_hidden > 0;
  const bool qwen2 = !qwen && c.n_experts == 0 && c.arch == "qwen2";  // dense Qwen2
  const std::string arch = qwen ? "qwen2moe" : qwen2 ? "qwen2" : "llama", a = arch + ".";
  gguf::writer g;
  g.set_string("general.architecture", arch);
  g.set_string("general.name", "cellshard synth seed " + std::to_string(seed));
  g.set_u32(a + "context_length", static_cast<uint32_t>(c.seq_len));
  g.set_u32(a + "embedding_length", static_cast<uint32_t>(c.dim));
  g.set_u32(a + "block_count", static_cast<uint32_t>(c.n_layers));
  g.set_u32(a + "feed_forward_length", static_cast<uint32_t>(qwen ? c.shared_hidden : c.hidden_dim));
  g.set_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
  g.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  g.set_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  g.set_f32(a + "rope.freq_base", c.rope_theta);
  g.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_size()));
  if (c.n_experts > 0) {
    g.set_u32(a + "expert_count", static_cast<uint32_t>(c.n_experts));
    g.set_u32(a + "expert_used_count", static_cast<uint32_t>(c.n_experts_used));
  }
  if (qwen) {
    g.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
    g.set_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(c.shared_hidden));
  }
  g.set_u32("general.file_type", 0);  // llama_ftype ALL_F32

  splitmix64 rng{seed};
  auto tensor = [&](const std::string& name, std::vector<uint64_t> ne, float scale, float offset) {
    uint64_t n = 1;
    for (uint64_t v : ne) n *= v;
    std::vector<uint8_t> data(n * 4);
    for (uint64_t i = 0; i < n; ++i) {
      const float f = offset + scale * rng.uniform();
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (host_is_big_endian()) u = __builtin_bswap32(u);
      std::memcpy(&data[i * 4], &u, 4);
    }
    g.add_tensor(name, std::move(ne), gguf::ggml_type::f32, std::move(data));
  };
  auto matrix = [&](const std::string& name, std::vector<uint64_t> ne) {
    const float s = std::sqrt(3.0f / static_cast<float>(ne[0]));  // ne[0] = fan_in
    tensor(name, std::move(ne), s, 0.0f);
  };
  const uint64_t d = c.dim, kv = c.kv_dim(), h = c.hidden_dim, V = c.vocab_size,
                 E = c.n_experts, sh = c.shared_hidden;
  tensor("token_embd.weight", {d, V}, std::sqrt(3.0f / static_cast<float>(d)), 0.0f);
  tensor("output_norm.weight", {d}, 0.1f, 1.0f);
  if (!c.shared_classifier) matrix("output.weight", {d, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    tensor(p + "attn_norm.weight", {d}, 0.1f, 1.0f);
    matrix(p + "attn_q.weight", {d, d});
    matrix(p + "attn_k.weight", {d, kv});
    matrix(p + "attn_v.weight", {d, kv});
    if (qwen || qwen2) {
      tensor(p + "attn_q.bias", {d}, 0.1f, 0.0f);
      tensor(p + "attn_k.bias", {kv}, 0.1f, 0.0f);
      tensor(p + "attn_v.bias", {kv}, 0.1f, 0.0f);
    }
    matrix(p + "attn_output.weight", {d, d});
    tensor(p + "ffn_norm.weight", {d}, 0.1f, 1.0f);
    if (E == 0) {
      matrix(p + "ffn_gate.weight", {d, h});
      matrix(p + "ffn_up.weight", {d, h});
      matrix(p + "ffn_down.weight", {h, d});
      continue;
    }
    matrix(p + "ffn_gate_inp.weight", {d, E});
    matrix(p + "ffn_gate_exps.weight", {d, h, E});
    matrix(p + "ffn_up_exps.weight", {d, h, E});
    matrix(p + "ffn_down_exps.weight", {h, d, E});
    if (qwen) {
      matrix(p + "ffn_gate_inp_shexp.weight", {d});
      matrix(p + "ffn_gate_shexp.weight", {d, sh});
      matrix(p + "ffn_up_shexp.weight", {d, sh});
      matrix(p + "ffn_down_shexp.weight", {sh, d});
    }
  }
  return g.bytes();
}

result<void> synth_gguf_file(const config& c, uint64_t seed, const std::string& path) {
  const auto bytes = synth_gguf(c, seed);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return make_error(path + ": write failed: " + std::strerror(errno));
  return {};
}

}  // namespace cellshard::model
