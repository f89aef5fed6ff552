// GGUF models through the engine: the llama2.c fixtures from stories260K.gguf,
// llama.cpp's greedy ids on llama2-small-f32.gguf, the F16/Q8_0 files against
// their F32 source, llama.cpp's logits on llama2-small-q8_0.gguf under
// --matmul ggml, dense qwen2 (synthetic, against the float64 pass), and the
// model-level errors (architecture, shapes, types, biases).
#include "kernels/backend.hpp"
#include "kernels/types.hpp"
#include "model/generate.hpp"
#include "model/gguf.hpp"
#include "model/gguf_model.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tests/model/float64_ref.hpp"
#include "tests/model/greedy.hpp"
#include "tests/model/gguf_swap.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <map>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>

using namespace cellshard;

namespace {

std::shared_ptr<const model::model_file> open_model(const std::string& rel, int ctx = 0) {
  model::load_options o;
  o.ctx = ctx;
  auto f = model::model_file::open(test::shared_file(rel), o);
  INFO((f.ok() ? std::string() : f.message()));
  REQUIRE(f.ok());
  return *f;
}

// Logits of each position after feeding `ids` one per step.
std::vector<std::vector<float>> logits_of(std::shared_ptr<const model::model_file> f,
                                          const std::vector<int>& ids,
                                          kernels::matmul_mode mode,
                                          const char* backend = "reference") {
  auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg()),
                                      model::weight_format::f32, mode);
  REQUIRE(w.ok());
  model::engine eng(*w, *kernels::choose_backend(backend).be);  // blas: native in a cross build
  std::vector<std::vector<float>> out;
  for (size_t p = 0; p < ids.size(); ++p) {
    const float* l = eng.forward(ids[p], static_cast<int>(p));
    out.emplace_back(l, l + f->cfg().vocab_size);
  }
  return out;
}

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

double nmse(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double num = 0, den = 0;
  for (size_t p = 0; p < a.size(); ++p)
    for (size_t i = 0; i < a[p].size(); ++i) {
      num += (double(a[p][i]) - b[p][i]) * (double(a[p][i]) - b[p][i]);
      den += double(b[p][i]) * b[p][i];
    }
  return num / den;
}

using test::greedy;  // tests/model/greedy.hpp

}  // namespace

TEST_CASE("gguf model: stories260K.gguf config, --ctx and tied classifier", "[gguf][model]") {
  if (test::shared_file("models/gguf/stories260K.gguf").empty()) return;
  auto f = open_model("models/gguf/stories260K.gguf");
  const auto& c = f->cfg();
  CHECK(std::string(f->format_name()) == "gguf");
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.seq_len == 128);  // the file's context_length
  CHECK_FALSE(c.shared_classifier);  // llama.cpp's converter writes output.weight
  CHECK(f->default_matmul() == kernels::matmul_mode::exact);
  CHECK(open_model("models/gguf/stories260K.gguf", 512)->cfg().seq_len == 512);
  // Same weights as the llama2.c file.
  auto bin = model::model_file::open(test::shared_file("models/stories260K.bin")).value();
  CHECK(std::memcmp(bin->layer(3).w2, f->layer(3).w2, 64 * 172 * 4) == 0);
  CHECK(std::memcmp(bin->token_embedding(), f->token_embedding(), 64 * 512 * 4) == 0);
}

TEST_CASE("gguf model: every llama2.c fixture from stories260K.gguf with --ctx 512",
          "[gguf][model][fixtures]") {
  if (test::shared_file("models/gguf/stories260K.gguf").empty()) return;
  auto f = open_model("models/gguf/stories260K.gguf", 512);
  auto tok = model::tokenizer::open(test::shared_file("models/tok512.bin"));
  REQUIRE(tok.ok());
  auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg()));
  REQUIRE(w.ok());
  for (const char* be_name : {"reference", "blas", "spe"}) {
    // A cross build has no OpenBLAS: "blas" runs its substitute (native).
    const kernels::backend* be = kernels::choose_backend(be_name).be;
    REQUIRE(be != nullptr);
    for (const auto& fc : test::fixture_cases()) {
      DYNAMIC_SECTION(be_name << " " << fc.name) {
        model::engine eng(*w, *be);
        model::generation_params gp;
        gp.prompt = fc.prompt;
        gp.steps = fc.steps;
        gp.sampling = {fc.temperature, fc.topp, fc.seed ? fc.seed : 1};
        auto res = model::generate(
            [&](int t, int p) -> result<const float*> { return eng.forward(t, p); }, **tok,
            f->cfg().vocab_size, gp, nullptr);
        REQUIRE(res.ok());
        CHECK(res->ids == test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids")));
      }
    }
  }
}

TEST_CASE("gguf model: llama.cpp's greedy ids on llama2-small-f32.gguf", "[gguf][model]") {
  const auto ref_path = test::shared_file("models/gguf/gguf-small-reference-ids.json");
  if (ref_path.empty()) return;
  const auto ref = nlohmann::json::parse(test::read_file(ref_path));
  auto f = open_model("models/gguf/llama2-small-f32.gguf");
  CHECK(f->cfg().n_kv_heads == 4);
  CHECK_FALSE(f->cfg().shared_classifier);
  int runs = 0;
  for (const auto& run : ref["runs"]) {
    if (run["model"] != "llama2-small-f32.gguf") continue;
    const auto prompt = run["prompt_ids"].get<std::vector<int>>();
    const auto want = run["generated_ids"].get<std::vector<int>>();
    for (const char* be : {"reference", "blas", "spe"}) {
      INFO(be << " prompt '" << run["prompt"].get<std::string>() << "'");
      CHECK(greedy(f, prompt, static_cast<int>(want.size()), be) == want);
    }
    ++runs;
  }
  CHECK(runs == 2);
}

TEST_CASE("gguf model: llama.cpp's logits on llama2-small-q8_0.gguf under --matmul ggml",
          "[gguf][model][ggml]") {
  const auto lpath = test::shared_file("models/gguf/llama2-small-q8_0.once_upon_a_time.logits.f32");
  if (lpath.empty()) return;
  const auto ref = nlohmann::json::parse(
      test::read_file(test::shared_file("models/gguf/llama2-small-q8_0-reference.json")));
  auto f = open_model("models/gguf/llama2-small-q8_0.gguf");
  CHECK(f->has_non_f32());
  CHECK(f->default_matmul() == kernels::matmul_mode::ggml);
  std::vector<int> ids = ref["prompt_ids"].get<std::vector<int>>();
  const auto gen = ref["generated_ids"].get<std::vector<int>>();
  ids.insert(ids.end(), gen.begin(), gen.begin() + 3);  // positions 5-7: the first greedy ids
  const std::string raw = test::read_file(lpath);
  REQUIRE(raw.size() == 8 * 512 * 4);
  std::vector<std::vector<float>> want(8, std::vector<float>(512));
  // llama.cpp's dump is little-endian f32: assembled byte by byte, so that a
  // big-endian host (qemu-ppc64, docs/cell.md) reads the same values.
  for (int p = 0; p < 8; ++p)
    for (int i = 0; i < 512; ++i) {
      const auto* b = reinterpret_cast<const unsigned char*>(raw.data()) + (p * 512 + i) * 4;
      const uint32_t u = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
      std::memcpy(&want[p][i], &u, 4);
    }
  for (auto mode : {kernels::matmul_mode::ggml, kernels::matmul_mode::exact}) {
    const auto got = logits_of(f, ids, mode);
    int same_top1 = 0;
    for (int p = 0; p < 8; ++p) same_top1 += argmax(got[p]) == argmax(want[p]);
    const double e = nmse(got, want);
    WARN("llama2-small-q8_0 vs llama.cpp, --matmul " << kernels::to_string(mode) << ": NMSE "
                                                     << e << ", top-1 same on " << same_top1
                                                     << "/8");
    if (mode == kernels::matmul_mode::ggml) {
      CHECK(e <= 5e-3);
      CHECK(same_top1 >= 7);
    }
  }
}

TEST_CASE("gguf model: F16 and Q8_0 files against their F32 source", "[gguf][model]") {
  if (test::shared_file("models/gguf/stories260K-f16.gguf").empty()) return;
  auto f32 = open_model("models/gguf/stories260K.gguf");
  const std::vector<int> ids = {1, 403, 407, 261, 378, 400, 151, 19};
  const auto base = logits_of(f32, ids, kernels::matmul_mode::exact);
  for (const char* name : {"stories260K-f16.gguf", "stories260K-q8_0.gguf"}) {
    auto f = open_model(std::string("models/gguf/") + name);
    CHECK(f->has_non_f32());
    for (auto mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
      for (const char* be : {"reference", "blas", "spe"}) {
        const auto got = logits_of(f, ids, mode, be);
        const double e = nmse(got, base);
        if (std::string(be) == "reference")
          WARN(name << " --matmul " << kernels::to_string(mode) << " vs F32: NMSE " << e);
        INFO(name << " " << be << " " << kernels::to_string(mode));
        CHECK(e < (std::string(name).find("f16") != std::string::npos ? 1e-5 : 5e-3));
      }
    }
  }
}

TEST_CASE("gguf model: llama-2-tiny-random.gguf (F16, 32000 tokens) loads and runs",
          "[gguf][model]") {
  if (test::shared_file("models/gguf/llama-2-tiny-random.gguf").empty()) return;
  auto f = open_model("models/gguf/llama-2-tiny-random.gguf");
  CHECK(f->cfg().vocab_size == 32000);
  CHECK(f->cfg().dim == 8);
  CHECK(f->cfg().seq_len == 4096);
  const auto exact = logits_of(f, {1, 15043, 3186}, kernels::matmul_mode::exact);
  const auto ggml = logits_of(f, {1, 15043, 3186}, kernels::matmul_mode::ggml);
  for (const auto& row : exact)
    for (float v : row) REQUIRE(std::isfinite(v));
  CHECK(nmse(ggml, exact) < 1e-5);
}

namespace {

// stories260K.gguf rewritten with `edit` applied to a copy of its metadata and
// tensors (tensor data copied unchanged unless dropped).
std::vector<uint8_t> rewrite(const std::string& path,
                             const std::function<void(model::gguf::writer&)>& edit,
                             const std::string& drop_tensor = "") {
  auto g = model::gguf::file::open(path).value();
  model::gguf::writer w;
  for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
  for (const auto& t : g->tensors())
    if (t.name != drop_tensor)
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  edit(w);
  return w.bytes();
}

std::string load_error(std::vector<uint8_t> bytes) {
  auto r = model::model_file::from_bytes(std::move(bytes), "edited.gguf");
  REQUIRE_FALSE(r.ok());
  return r.message();
}

}  // namespace

TEST_CASE("gguf model: bad models are clear errors", "[gguf][model][errors]") {
  const auto path = test::shared_file("models/gguf/stories260K.gguf");
  if (path.empty()) return;
  SECTION("a copy loads like the original") {
    auto r = model::model_file::from_bytes(rewrite(path, [](auto&) {}), "copy.gguf");
    REQUIRE(r.ok());
    CHECK((*r)->cfg().dim == 64);
  }
  SECTION("unsupported architecture") {
    CHECK(load_error(rewrite(path, [](auto& w) { w.set_string("general.architecture", "phi3"); })) ==
          "edited.gguf: unsupported architecture phi3 (general.architecture; cellshard runs "
          "llama, qwen2 and qwen2moe)");
    // qwen2 is known: its keys are read under its own prefix.
    CHECK_THAT(load_error(rewrite(path, [](auto& w) { w.set_string("general.architecture", "qwen2"); })),
               Catch::StartsWith("edited.gguf: missing key qwen2.embedding_length"));
  }
  SECTION("a bias the engine would not apply") {
    const std::vector<uint8_t> zeros(64 * 4);
    CHECK(load_error(rewrite(path, [&](auto& w) {
            w.add_tensor("blk.0.attn_output.bias", {64}, model::gguf::ggml_type::f32, zeros);
          })) == "edited.gguf: tensor blk.0.attn_output.bias is a bias cellshard does not apply "
                 "(supported: attn_q.bias, attn_k.bias, attn_v.bias)");
    CHECK(load_error(rewrite(path, [&](auto& w) {
            w.add_tensor("blk.1.attn_k.bias", {64}, model::gguf::ggml_type::f32, zeros);
          })) == "edited.gguf: tensor blk.1.attn_k.bias is present but blk.0.attn_q.bias is not: "
                 "expected Q/K/V biases in every layer or in none");
    // Layer 0's biases promise every layer's: a missing one is named.
    CHECK(load_error(rewrite(path, [&](auto& w) {
            w.add_tensor("blk.0.attn_q.bias", {64}, model::gguf::ggml_type::f32, zeros);
            for (const char* b : {"blk.0.attn_k.bias", "blk.0.attn_v.bias"})  // kv_dim 32
              w.add_tensor(b, {32}, model::gguf::ggml_type::f32, std::vector<uint8_t>(32 * 4));
          })) == "edited.gguf: missing tensor blk.1.attn_q.bias");
  }
  SECTION("MoE keys on a dense file") {  // test_moe.cpp has the MoE files' own errors
    CHECK(load_error(rewrite(path, [](auto& w) {
            w.set_u32("llama.expert_count", 4);
            w.set_u32("llama.expert_used_count", 2);
          })) == "edited.gguf: missing tensor blk.0.ffn_gate_inp.weight (the router; "
                 "llama.expert_count is 4)");
  }
  SECTION("missing key") {
    auto b = rewrite(path, [](auto& w) { w.set_string("llama.block_count", "five"); });
    CHECK(load_error(b) == "edited.gguf: key llama.block_count is string, expected an integer");
  }
  SECTION("shape that disagrees with the metadata") {
    auto b = rewrite(path, [](auto& w) { w.set_u32("llama.feed_forward_length", 173); });
    CHECK_THAT(load_error(b), Catch::Contains("tensor blk.0.ffn_gate.weight has shape [64, 172], "
                                              "expected [64, 173] from the metadata"));
  }
  SECTION("token count that disagrees with the embedding") {
    auto b = rewrite(path, [](auto& w) { w.set_string_array("tokenizer.ggml.tokens", {"a", "b"}); });
    CHECK_THAT(load_error(b), Catch::Contains("tokenizer.ggml.tokens has 2 tokens, but token_embd.weight has 512 rows"));
  }
  SECTION("missing tensor") {
    auto b = rewrite(path, [](auto&) {}, "blk.2.attn_k.weight");
    CHECK(load_error(b) == "edited.gguf: missing tensor blk.2.attn_k.weight");
  }
  SECTION("tensor type without kernels") {
    auto g = model::gguf::file::open(path).value();
    model::gguf::writer w;
    for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
    for (const auto& t : g->tensors()) {
      if (t.name == "blk.0.attn_q.weight")  // IQ4_NL (ggml type 20): 18 bytes per 32
        w.add_tensor(t.name, t.ne, 20u, std::vector<uint8_t>(64 / 32 * 18 * 64));
      else
        w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
    }
    CHECK(load_error(w.bytes()) == "edited.gguf: tensor blk.0.attn_q.weight has type IQ4_NL, "
                                   "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
  }
  SECTION("a rope base or epsilon that is not a positive number") {
    auto b = rewrite(path, [](auto& w) { w.set_f32("llama.rope.freq_base", -1.0f); });
    CHECK(load_error(b) == "edited.gguf: key llama.rope.freq_base is -1.000000, expected a positive finite value");
    b = rewrite(path, [](auto& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", 0.0f); });
    CHECK(load_error(b) ==
          "edited.gguf: key llama.attention.layer_norm_rms_epsilon is 0.000000, expected a positive finite value");
    b = rewrite(path, [](auto& w) { w.set_f32("llama.rope.freq_base", std::numeric_limits<float>::infinity()); });
    CHECK(load_error(b) == "edited.gguf: key llama.rope.freq_base is inf, expected a positive finite value");
  }
}

namespace {
// The engine's logits on `backends` follow the float64 pass (tests/model/float64_ref.hpp) over the
// same file bytes for `ids` (max error at most 1e-4 of the largest logit).
void check_against_float64(const std::vector<uint8_t>& bytes, const std::vector<int>& ids,
                           std::initializer_list<const char*> backends) {
  auto f = model::model_file::from_bytes(bytes, "edited.gguf");
  REQUIRE(f.ok());
  auto g = model::gguf::file::from_bytes(bytes, "edited.gguf");
  REQUIRE(g.ok());
  test::float64_ref ref(**g);
  std::vector<std::vector<double>> want;
  for (size_t p = 0; p < ids.size(); ++p) want.push_back(ref.forward(ids[p], static_cast<int>(p)));
  for (const char* be : backends) {
#ifdef CELLSHARD_NO_BLAS
    if (std::string(be) == "blas") continue;  // cross builds have no OpenBLAS
#endif
    INFO("backend " << be);
    const auto got = logits_of(*f, ids, kernels::matmul_mode::exact, be);
    double worst = 0, scale = 0;
    for (size_t p = 0; p < ids.size(); ++p)
      for (size_t i = 0; i < want[p].size(); ++i) {
        worst = std::max(worst, std::abs(got[p][i] - want[p][i]));
        scale = std::max(scale, std::abs(want[p][i]));
      }
    CHECK(worst <= 1e-4 * scale);
  }
}
}  // namespace

TEST_CASE("gguf model: another RMSNorm epsilon and RoPE base (Llama 3, Qwen2 values) match float64",
          "[gguf][model]") {
  const auto path = test::shared_file("models/gguf/llama2-small-f32.gguf");
  if (path.empty()) return;
  // llama2-small-f32.gguf rewritten with Llama 3's RoPE base and Qwen2's
  // epsilon; each changes the output (checked), and the engine on every
  // backend follows an independent float64 pass of the same file.
  for (const auto& [eps, base] : {std::pair<float, float>{1e-6f, 500000.0f}, {1e-5f, 1000000.0f}, {1e-6f, 10000.0f}}) {
    const auto bytes = rewrite(path, [&, eps = eps, base = base](auto& w) {
      w.set_f32("llama.attention.layer_norm_rms_epsilon", eps);
      w.set_f32("llama.rope.freq_base", base);
    });
    auto f = model::model_file::from_bytes(bytes, "edited.gguf");
    REQUIRE(f.ok());
    CHECK((*f)->cfg().rms_eps == eps);
    CHECK((*f)->cfg().rope_theta == base);
    INFO("eps " << eps << " base " << base);
    check_against_float64(bytes, {1, 403, 407, 261, 378, 24, 9, 77}, {"reference", "blas", "spe", "native"});
  }
  // Llama 3.1's rope_freqs.weight: one factor per rotated pair (head size 32:
  // 16 factors), dividing the angle; the engine follows the float64 pass.
  {
    std::vector<float> factors(16);
    for (int i = 0; i < 16; ++i) factors[static_cast<size_t>(i)] = i < 4 ? 1.0f : 1.0f + 0.5f * i;
    std::vector<uint8_t> raw(factors.size() * 4);
    for (size_t i = 0; i < factors.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &factors[i], 4);
      test::put_le32(raw.data() + 4 * i, u);
    }
    const auto bytes = rewrite(path, [&](auto& w) {
      w.set_f32("llama.rope.freq_base", 500000.0f);
      w.add_tensor("rope_freqs.weight", {16}, model::gguf::ggml_type::f32, raw);
    });
    auto f = model::model_file::from_bytes(bytes, "edited.gguf");
    REQUIRE(f.ok());
    REQUIRE((*f)->rope_factors() != nullptr);
    CHECK((*f)->rope_factors()[15] == 8.5f);
    check_against_float64(bytes, {1, 403, 407, 261, 378, 24}, {"reference", "native"});
    // Factors of the wrong length are refused naming the tensor.
    auto bad = model::model_file::from_bytes(
        rewrite(path, [&](auto& w) {
          w.add_tensor("rope_freqs.weight", {8}, model::gguf::ggml_type::f32,
                       std::vector<uint8_t>(raw.begin(), raw.begin() + 32));
        }),
        "edited.gguf");
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.message(), Catch::Contains("rope_freqs.weight"));
  }
  // The constants matter: the last position's logits move with the base.
  auto plain = open_model("models/gguf/llama2-small-f32.gguf");
  auto moved = model::model_file::from_bytes(
      rewrite(path, [](auto& w) { w.set_f32("llama.rope.freq_base", 500000.0f); }), "edited.gguf");
  REQUIRE(moved.ok());
  const std::vector<int> ids = {1, 403, 407, 261};
  const auto a = logits_of(plain, ids, kernels::matmul_mode::exact), b = logits_of(*moved, ids, kernels::matmul_mode::exact);
  CHECK(a[0] == b[0]);  // position 0: RoPE is the identity
  CHECK(a[3] != b[3]);
}

TEST_CASE("gguf model: a byte-swapped file loads (big-endian host path)", "[gguf][model]") {
  const auto path = test::shared_file("models/gguf/stories260K-q8_0.gguf");
  if (path.empty()) return;
  // Rewrite every number and every tensor's data in the other byte order,
  // then read it with force_swap: same logits as the original.
  auto g = model::gguf::file::open(path).value();
  model::load_options o;
  o.force_swap = true;
  auto swapped = model::model_file::from_bytes(test::gguf_swapped(*g), "swapped.gguf", o);
  REQUIRE(swapped.ok());
  const std::vector<int> ids = {1, 403, 407};
  CHECK(logits_of(*swapped, ids, kernels::matmul_mode::ggml) ==
        logits_of(open_model("models/gguf/stories260K-q8_0.gguf"), ids, kernels::matmul_mode::ggml));
}

TEST_CASE("gguf model: a file of the other byte order is converted in place, not copied",
          "[gguf][model]") {
  const auto path = test::shared_file("models/gguf/stories260K-q8_0.gguf");
  if (path.empty()) return;
  // On a little-endian host a big-endian rewrite read with force_swap; on a
  // big-endian host the file itself (every GGUF is little-endian).
  const bool be_host = model::host_is_big_endian();
  auto g = model::gguf::file::open(path).value();
  std::vector<uint8_t> bytes;
  if (be_host) {
    const std::string raw = test::read_file(path);
    bytes.assign(raw.begin(), raw.end());
  } else {
    bytes = test::gguf_swapped(*g);
  }
  const std::string file = test::temp_dir("gguf-swapped-in-place") + "/swapped-q8_0.gguf";
  test::write_file(file, std::string(bytes.begin(), bytes.end()));
  model::load_options o;
  o.force_swap = !be_host;
  auto mapped = model::model_file::open(file, o);
  INFO((mapped.ok() ? std::string() : mapped.message()));
  REQUIRE(mapped.ok());
  auto owned = model::model_file::from_bytes(bytes, "swapped-q8_0.gguf", o);
  REQUIRE(owned.ok());
  for (const auto& m : {*mapped, *owned}) {
    CHECK(m->swapped());
    // Every matrix points into the model's own (converted) image: no copy.
    const uint8_t* lo = m->image();
    const uint8_t* hi = lo + m->file_bytes();
    auto inside = [&](const model::tensor_view& t) { return t.data >= lo && t.data + t.rows * t.row_bytes <= hi; };
    CHECK(inside(m->typed_embedding()));
    CHECK(inside(m->typed_classifier()));
    for (int l = 0; l < m->cfg().n_layers; ++l) {
      const auto t = m->typed_layer(l);
      for (const auto& v : {t.wq, t.wk, t.wv, t.wo, t.w1, t.w2, t.w3}) CHECK(inside(v));
      const float* norm = m->layer(l).rms_att;
      CHECK((reinterpret_cast<const uint8_t*>(norm) >= lo && reinterpret_cast<const uint8_t*>(norm) < hi));
    }
    // The file's own bytes and their digest stay what every host sees.
    REQUIRE(m->file_image() != nullptr);
    CHECK(m->file_image() != m->image());
    CHECK(std::memcmp(m->file_image(), bytes.data(), bytes.size()) == 0);
    CHECK(std::memcmp(m->image(), bytes.data(), bytes.size()) != 0);
    CHECK(m->digest() == XXH64(bytes.data(), bytes.size(), 0));
  }
  const std::vector<int> ids = {1, 403, 407};
  const auto want = logits_of(open_model("models/gguf/stories260K-q8_0.gguf"), ids, kernels::matmul_mode::ggml);
  CHECK(logits_of(*mapped, ids, kernels::matmul_mode::ggml) == want);
  CHECK(logits_of(*owned, ids, kernels::matmul_mode::ggml) == want);
}

TEST_CASE("gguf quantize: q8_0 matches llama.cpp's quantizer, q4_0 runs close to f32",
          "[gguf][model][quantize]") {
  if (test::shared_file("models/gguf/llama2-small-q8_0.gguf").empty()) return;
  auto f32 = open_model("models/gguf/llama2-small-f32.gguf");
  auto img = model::quantize_gguf(*f32, kernels::dtype::q8_0);
  REQUIRE(img.ok());
  auto ours = model::gguf::file::from_bytes(*img, "ours-q8_0.gguf").value();
  auto theirs = model::gguf::file::open(test::shared_file("models/gguf/llama2-small-q8_0.gguf")).value();
  int compared = 0;
  for (const auto& t : theirs->tensors()) {
    const auto* o = ours->find_tensor(t.name);
    REQUIRE(o != nullptr);
    INFO(t.name);
    CHECK(o->type == t.type);
    REQUIRE(o->bytes == t.bytes);
    CHECK(std::memcmp(o->data, t.data, t.bytes) == 0);  // byte-identical blocks
    ++compared;
  }
  CHECK(compared == 39);
  CHECK(ours->get_u32("general.file_type").value() == 7);

  auto q4 = model::quantize_gguf(*f32, kernels::dtype::q4_0);
  REQUIRE(q4.ok());
  auto m4 = model::model_file::from_bytes(*q4, "q4_0.gguf");
  REQUIRE(m4.ok());
  CHECK((*m4)->typed_layer(0).wq.type == kernels::dtype::q4_0);
  const std::vector<int> ids = {1, 403, 407, 261, 378, 464, 62, 19};
  const auto base = logits_of(f32, ids, kernels::matmul_mode::exact);
  for (auto mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
    const double e = nmse(logits_of(*m4, ids, mode), base);
    WARN("llama2-small quantized to q4_0 here, --matmul " << kernels::to_string(mode)
                                                         << " vs F32: NMSE " << e);
    CHECK(e < 0.3);  // random uniform weights: measured 0.18 in both modes
  }
  // stories260K's rows are 64 wide: no K-quant super-block of 256 fits.
  for (auto t : {kernels::dtype::q6_k, kernels::dtype::q4_k}) {
    auto bad = model::quantize_gguf(*open_model("models/gguf/stories260K.gguf"), t);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.message(), Catch::Contains("stories260K.gguf: tensor token_embd.weight has rows of 64 elements"));
    CHECK_THAT(bad.message(), Catch::Contains("rows must be a multiple of 256"));
    CHECK_THAT(bad.message(), Catch::Contains(t == kernels::dtype::q4_k ? "as q5_0 instead" : "as q8_0 instead"));
  }
  auto f32_type = model::quantize_gguf(*f32, kernels::dtype::f32);
  REQUIRE_FALSE(f32_type.ok());
  CHECK_THAT(f32_type.message(), Catch::Contains("expected f16, bf16, q8_0, q4_0, q4_K or q6_K"));
}

// Every `cellshard quantize --type` made here from the two F32 models, against
// the F32 model's own logits (exact mode) over 8 positions: the NMSE (sum of
// squared differences over sum of squares of the F32 logits) and the top-1
// agreement, in both matmul modes. docs/formats.md has the table (pure files:
// every matrix in the type; llama-quantize's classifier rule for q4_0/q4_K/q6_K
// is reported too).
TEST_CASE("gguf quantize: every type against the F32 model over 8 positions", "[gguf][model][quantize]") {
  if (test::shared_file("models/gguf/llama2-small-f32.gguf").empty()) return;
  struct bound {
    kernels::dtype type;
    double nmse;  // upper bound asserted in both modes (measured values in formats.md)
    bool top1;    // >= 7 of 8 same top-1 asserted
  };
  struct source {
    const char* file;
    std::vector<int> ids;
    std::vector<bound> types;
  };
  using kernels::dtype;
  const source sources[] = {
      {"models/gguf/llama2-small-f32.gguf",
       {1, 403, 407, 261, 378, 464, 62, 19},
       // Random uniform weights: 4-bit rounding moves these logits far (the
       // 4-bit types' top-1 agrees on 1-3 of 8 only; not asserted).
       {{dtype::f16, 1e-5, true}, {dtype::bf16, 1e-3, true}, {dtype::q8_0, 5e-3, true},
        {dtype::q6_k, 2e-2, true}, {dtype::q4_k, 0.2, false}, {dtype::q4_0, 0.3, false}}},
      {"models/gguf/stories260K.gguf",
       {1, 403, 407, 261, 378, 400, 151, 19},
       {{dtype::f16, 1e-5, true}, {dtype::bf16, 1e-4, true}, {dtype::q8_0, 5e-4, true}, {dtype::q4_0, 5e-2, true}}},
  };
  for (const auto& src : sources) {
    auto f32 = open_model(src.file);
    const auto base = logits_of(f32, src.ids, kernels::matmul_mode::exact);
    for (const auto& b : src.types) {
      for (bool pure : {true, false}) {
        model::quantize_options o;
        o.type = b.type;
        o.pure = pure;
        if (!pure && model::classifier_type(b.type, f32->cfg().dim, false) == b.type) continue;  // same file
        auto img = model::quantize_gguf(*f32, o);
        REQUIRE(img.ok());
        auto q = model::model_file::from_bytes(*img, "quantized.gguf");
        REQUIRE(q.ok());
        CHECK((*q)->typed_layer(0).wq.type == b.type);
        CHECK((*q)->typed_layer(0).w2.type == (f32->cfg().hidden_dim % kernels::block_elems(b.type) == 0
                                                    ? b.type
                                                    : dtype::f32));  // stories260K's 172-wide ffn_down
        for (auto mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
          const auto got = logits_of(*q, src.ids, mode);
          int same = 0;
          for (size_t p = 0; p < got.size(); ++p) same += argmax(got[p]) == argmax(base[p]);
          const double e = nmse(got, base);
          WARN(src.file << " --type " << kernels::to_string(b.type) << (pure ? " --pure" : "") << " --matmul "
                        << kernels::to_string(mode) << " vs F32: NMSE " << e << ", top-1 same on " << same << "/8");
          INFO(src.file << " " << kernels::to_string(b.type) << " " << kernels::to_string(mode));
          if (pure) {
            CHECK(e <= b.nmse);
            if (b.top1) CHECK(same >= 7);
          }
        }
      }
    }
  }
}

namespace {
// Test-local packers for the types cellshard reads but does not write (Q4_1,
// Q5_0, Q5_1, Q5_K): plain min/max grids, packed from the layout description
// (kernels/types.hpp), so a model of each type can be made from an F32 one.
int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }
void pack_row(kernels::dtype t, const float* x, uint8_t* out, int cols) {
  using kernels::dtype;
  if (t == dtype::q5_k) {
    for (int b = 0; b < cols / 256; ++b, x += 256) {
      kernels::block_q5_k k{};
      float s[8], mn[8], smax = 0, mmax = 0;
      for (int j = 0; j < 8; ++j) {
        float lo = 0, hi = 0;
        for (int l = 0; l < 32; ++l) {
          lo = std::min(lo, x[32 * j + l]);
          hi = std::max(hi, x[32 * j + l]);
        }
        s[j] = (hi - lo) / 31;
        mn[j] = -lo;
        smax = std::max(smax, s[j]);
        mmax = std::max(mmax, mn[j]);
      }
      k.d = kernels::fp32_to_fp16(smax / 63);
      k.dmin = kernels::fp32_to_fp16(mmax / 63);
      const float d = kernels::fp16_to_fp32(k.d), dmin = kernels::fp16_to_fp32(k.dmin);
      int sc[8], m[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = d > 0 ? clampi(static_cast<int>(std::lround(s[j] / d)), 1, 63) : 0;
        m[j] = dmin > 0 ? clampi(static_cast<int>(std::lround(mn[j] / dmin)), 0, 63) : 0;
      }
      for (int j = 0; j < 4; ++j) {
        k.scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        k.scales[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        k.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
      }
      for (int e = 0; e < 256; ++e) {
        const int j = e / 32, l = e % 32;
        const float step = d * sc[j];
        const int q = step > 0 ? clampi(static_cast<int>(std::lround((x[e] + dmin * m[j]) / step)), 0, 31) : 0;
        uint8_t& byte = k.qs[32 * (j / 2) + l];
        byte = static_cast<uint8_t>(j % 2 ? (byte & 0x0F) | ((q & 15) << 4) : (byte & 0xF0) | (q & 15));
        k.qh[l] |= static_cast<uint8_t>((q >> 4) << j);
      }
      std::memcpy(out + static_cast<size_t>(b) * sizeof k, &k, sizeof k);
    }
    return;
  }
  const size_t bb = static_cast<size_t>(kernels::block_bytes(t));
  for (int b = 0; b < cols / 32; ++b, x += 32) {
    float lo = x[0], hi = x[0], amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    int q[32];
    uint16_t d, m = 0;
    if (t == dtype::q5_0) {
      d = kernels::fp32_to_fp16(max / -16);
      const float df = kernels::fp16_to_fp32(d);
      for (int j = 0; j < 32; ++j) q[j] = df != 0 ? clampi(static_cast<int>(std::lround(x[j] / df)) + 16, 0, 31) : 16;
    } else {
      const int nmax = t == dtype::q4_1 ? 15 : 31;
      d = kernels::fp32_to_fp16((hi - lo) / nmax);
      m = kernels::fp32_to_fp16(lo);
      const float df = kernels::fp16_to_fp32(d), mf = kernels::fp16_to_fp32(m);
      for (int j = 0; j < 32; ++j) q[j] = df != 0 ? clampi(static_cast<int>(std::lround((x[j] - mf) / df)), 0, nmax) : 0;
    }
    uint8_t* o = out + static_cast<size_t>(b) * bb;
    std::memcpy(o, &d, 2);
    size_t at = 2;
    if (t != dtype::q5_0) {
      std::memcpy(o + 2, &m, 2);
      at = 4;
    }
    if (t != dtype::q4_1) {
      uint32_t qh = 0;
      for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
      for (int k = 0; k < 4; ++k) o[at + k] = static_cast<uint8_t>(qh >> (8 * k));
      at += 4;
    }
    for (int j = 0; j < 16; ++j) o[at + j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  }
}
}  // namespace

// The types Q4_K_M/Q5_K_M files mix in, end to end: llama2-small's matrices
// packed here into each (plain min/max grids), loaded, run in both modes on
// every backend against the F32 model.
TEST_CASE("gguf model: Q4_1 Q5_0 Q5_1 and Q5_K files load and run close to F32 on every backend",
          "[gguf][model][types]") {
  if (test::shared_file("models/gguf/llama2-small-f32.gguf").empty()) return;
  auto f32 = open_model("models/gguf/llama2-small-f32.gguf");
  const auto* g = f32->gguf();
  REQUIRE(g != nullptr);
  const std::vector<int> ids = {1, 403, 407, 261, 378, 464, 62, 19};
  const auto base = logits_of(f32, ids, kernels::matmul_mode::exact);
  using kernels::dtype;
  for (dtype t : {dtype::q4_1, dtype::q5_0, dtype::q5_1, dtype::q5_k}) {
    model::gguf::writer w;
    for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
    for (const auto& ti : g->tensors()) {
      if (ti.ne.size() != 2) {
        w.add_tensor(ti.name, ti.ne, ti.type, std::vector<uint8_t>(ti.data, ti.data + ti.bytes));
        continue;
      }
      const int cols = static_cast<int>(ti.ne[0]);
      const size_t rb = kernels::row_bytes(t, cols);
      std::vector<uint8_t> out(rb * ti.rows());
      for (uint64_t r = 0; r < ti.rows(); ++r)
        pack_row(t, reinterpret_cast<const float*>(ti.data) + r * cols, out.data() + r * rb, cols);
      w.add_tensor(ti.name, ti.ne, kernels::ggml_type_of(t), std::move(out));
    }
    auto q = model::model_file::from_bytes(w.bytes(), "packed.gguf");
    INFO(kernels::to_string(t) << " " << (q.ok() ? "" : q.message()));
    REQUIRE(q.ok());
    CHECK((*q)->typed_layer(0).wq.type == t);
    CHECK((*q)->default_matmul() == kernels::matmul_mode::ggml);
    for (auto mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
      const auto ref = logits_of(*q, ids, mode);
      const double e = nmse(ref, base);
      WARN("llama2-small packed as " << kernels::to_string(t) << " --matmul " << kernels::to_string(mode)
                                     << " vs F32: NMSE " << e);
      CHECK(e < (t == dtype::q4_1 ? 0.3 : 0.1));  // random uniform weights, min/max grids
      // The typed matvecs agree to 1e-10 given the same x (tests/kernels/types.cpp);
      // here the backends' own attention and norm sums differ in the last bits,
      // which under ggml can flip an activation's q8 rounding (measured: q5_K
      // 4.5e-5 on spe and native, 2026-12-02).
      for (const char* be : {"blas", "spe", "native"}) {
        INFO(be << " " << kernels::to_string(mode));
        CHECK(nmse(logits_of(*q, ids, mode, be), ref) < (mode == kernels::matmul_mode::exact ? 1e-9 : 1e-3));
      }
    }
  }
}

namespace {
// A dense qwen2 model shaped like a small Qwen2 (grouped-query attention, Q/K/V
// biases, NEOX RoPE, Qwen2's epsilon 1e-6 and base 1e6), tok512's vocabulary.
model::config tiny_qwen2(bool tied) {
  model::config c;
  c.arch = "qwen2";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.vocab_size = 512;
  c.seq_len = 64;
  c.shared_classifier = tied;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  return c;
}

// The float64 pass's greedy continuation of `ids` (n ids) and the smallest
// top-1 minus top-2 gap on the way.
std::vector<int> float64_greedy(const model::gguf::file& g, std::vector<int> ids, int n, double* margin) {
  test::float64_ref ref(g);
  std::vector<int> gen;
  *margin = 1e300;
  const size_t np = ids.size();
  for (size_t p = 0; p + 1 < np + n; ++p) {
    auto l = ref.forward(ids[p], static_cast<int>(p));
    if (p + 1 < np) continue;
    const int best = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    const double top = l[best];
    l[best] = -1e300;
    *margin = std::min(*margin, top - *std::max_element(l.begin(), l.end()));
    gen.push_back(best);
    ids.push_back(best);
  }
  return gen;
}
}  // namespace

TEST_CASE("gguf model: dense qwen2 (Q/K/V biases, NEOX RoPE) follows the float64 pass",
          "[gguf][model][qwen2]") {
  for (bool tied : {true, false}) {
    INFO((tied ? "tied classifier" : "untied classifier"));
    const auto bytes = model::synth_gguf(tiny_qwen2(tied), 11);
    auto f = model::model_file::from_bytes(bytes, "qwen2.gguf");
    INFO((f.ok() ? std::string() : f.message()));
    REQUIRE(f.ok());
    const auto& c = (*f)->cfg();
    CHECK(c.arch == "qwen2");
    CHECK(c.qkv_bias);
    CHECK_FALSE(c.moe());
    CHECK(c.shared_classifier == tied);
    CHECK(c.rms_eps == 1e-6f);
    CHECK(c.rope_theta == 1000000.0f);
    CHECK((*f)->moe_layer(1).bq != nullptr);
    // Logits: every backend within 1e-4 of the largest float64 logit.
    check_against_float64(bytes, {1, 403, 407, 261, 378, 24, 9, 77, 5, 300},
                          {"reference", "blas", "spe", "native"});
    // Greedy ids: exactly the float64 pass's (its margins far above f32 rounding).
    auto g = model::gguf::file::from_bytes(bytes, "qwen2.gguf").value();
    double margin = 0;
    const std::vector<int> prompt = {1, 403, 407};
    const auto want = float64_greedy(*g, prompt, 24, &margin);
    WARN("qwen2 synth (" << (tied ? "tied" : "untied") << "): float64 smallest top-1/top-2 margin " << margin);
    REQUIRE(margin > 1e-3);
    for (const char* be : {"reference", "blas", "spe", "native"}) {
      INFO(be);
      CHECK(greedy(*f, prompt, 24, be) == want);
    }
  }
  const auto bytes = model::synth_gguf(tiny_qwen2(true), 11);
  auto f = model::model_file::from_bytes(bytes, "qwen2.gguf").value();
  const std::vector<int> ids = {1, 403, 407, 261, 378, 24, 9, 77};
  const auto base = logits_of(f, ids, kernels::matmul_mode::exact);
  SECTION("the biases and the NEOX pairs each change the logits") {
    // The same weights read as llama (adjacent RoPE pairs) differ after
    // position 0; without the biases they differ everywhere.
    auto g = model::gguf::file::from_bytes(bytes, "qwen2.gguf").value();
    model::gguf::writer as_llama, no_bias;
    for (const auto& k : g->keys()) {
      std::string nk = k;
      if (nk.rfind("qwen2.", 0) == 0) nk = "llama." + nk.substr(6);
      as_llama.copy_value(nk, *g->find(k));
      no_bias.copy_value(k, *g->find(k));
    }
    as_llama.set_string("general.architecture", "llama");
    for (const auto& t : g->tensors()) {
      std::vector<uint8_t> data(t.data, t.data + t.bytes);
      as_llama.add_tensor(t.name, t.ne, t.type, data);
      if (t.name.find(".bias") == std::string::npos) no_bias.add_tensor(t.name, t.ne, t.type, data);
    }
    const auto l = logits_of(model::model_file::from_bytes(as_llama.bytes(), "as-llama.gguf").value(), ids,
                             kernels::matmul_mode::exact);
    CHECK(l[0] == base[0]);  // position 0: RoPE is the identity either way
    CHECK(nmse(l, base) > 1e-4);
    const auto nb = logits_of(model::model_file::from_bytes(no_bias.bytes(), "no-bias.gguf").value(), ids,
                              kernels::matmul_mode::exact);
    CHECK(nb[0] != base[0]);
  }
  SECTION("prefill in chunks is bit-identical to one position at a time") {
    auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg())).value();
    const int V = f->cfg().vocab_size, n = static_cast<int>(ids.size());
    for (const char* be : {"reference", "native"}) {
      INFO(be);
      model::engine one(w, *kernels::find_backend(be)), chunk(w, *kernels::find_backend(be));
      chunk.set_batch_size(3);
      std::vector<float> all(static_cast<size_t>(n) * V);
      chunk.prefill(ids.data(), n, 0, all.data());
      for (int p = 0; p < n; ++p) {
        const float* l = one.forward(ids[p], p);
        CHECK(std::vector<float>(l, l + V) == std::vector<float>(all.begin() + static_cast<size_t>(p) * V,
                                                                 all.begin() + static_cast<size_t>(p + 1) * V));
      }
    }
  }
  SECTION("quantized by cellshard quantize (q8_0, q4_0): typed weights with the biases") {
    for (auto type : {kernels::dtype::q8_0, kernels::dtype::q4_0}) {
      auto img = model::quantize_gguf(*f, type);
      REQUIRE(img.ok());
      auto q = model::model_file::from_bytes(*img, "qwen2-q.gguf");
      REQUIRE(q.ok());
      CHECK((*q)->typed_layer(0).wq.type == type);
      CHECK((*q)->moe_layer(0).bq != nullptr);  // biases stay F32
      for (auto mode : {kernels::matmul_mode::exact, kernels::matmul_mode::ggml}) {
        const double e = nmse(logits_of(*q, ids, mode), base);
        WARN("qwen2 synth quantized to " << kernels::to_string(type) << ", --matmul "
                                         << kernels::to_string(mode) << " vs F32: NMSE " << e);
        CHECK(e < (type == kernels::dtype::q8_0 ? 1e-3 : 0.3));
      }
    }
  }
  SECTION("a byte-swapped qwen2 file gives the same logits (big-endian host path)") {
    auto g = model::gguf::file::from_bytes(bytes, "qwen2.gguf").value();
    model::load_options o;
    o.force_swap = true;
    auto swapped = model::model_file::from_bytes(test::gguf_swapped(*g), "swapped-qwen2.gguf", o);
    REQUIRE(swapped.ok());
    CHECK(logits_of(*swapped, ids, kernels::matmul_mode::exact) == base);
  }
}
