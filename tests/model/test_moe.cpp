// Mixture of experts (model/moe.hpp): llama.cpp's greedy ids on
// moe-small-f32.gguf on every backend, the router's tie rule and
// renormalisation against plain math, the MoE block and whole models
// (Mixtral-style llama and qwen2moe from synth_gguf) against an independent
// float64 forward pass written here from the published formulas, and the
// loader's errors for bad MoE files, quantized and byte-swapped MoE files,
// and chunked prefill.
#include "kernels/backend.hpp"
#include "kernels/types.hpp"
#include "model/gguf.hpp"
#include "model/gguf_model.hpp"
#include "model/moe.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tests/model/float64_ref.hpp"
#include "tests/model/greedy.hpp"
#include "tests/support.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

using namespace cellshard;

namespace {

const char* const kBackends[] = {"reference", "blas", "spe", "native"};

std::shared_ptr<const model::model_file> open_shared(const std::string& rel) {
  auto f = model::model_file::open(test::shared_file(rel));
  INFO((f.ok() ? std::string() : f.message()));
  REQUIRE(f.ok());
  return *f;
}

using test::greedy;  // tests/model/greedy.hpp

// The float64 pass of tests/model/float64_ref.hpp (no code shared with model/).
using ref_forward = test::float64_ref;

std::vector<int> ref_greedy(const model::gguf::file& g, std::vector<int> ids, int n,
                            std::vector<std::vector<double>>* logits = nullptr) {
  ref_forward rf(g);
  std::vector<int> gen;
  const size_t np = ids.size();
  for (size_t p = 0; p + 1 < np + n; ++p) {
    auto l = rf.forward(ids[p], static_cast<int>(p));
    if (p + 1 >= np) {
      if (logits) logits->push_back(l);
      const int next = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
      gen.push_back(next);
      ids.push_back(next);
    }
  }
  return gen;
}

// The smallest top-1 minus top-2 gap over a run's logits.
double min_margin(const std::vector<std::vector<double>>& logits) {
  double m = 1e300;
  for (auto l : logits) {
    std::partial_sort(l.begin(), l.begin() + 2, l.end(), std::greater<double>());
    m = std::min(m, l[0] - l[1]);
  }
  return m;
}

}  // namespace

TEST_CASE("moe: route_top_k chooses the largest and ties go to the lower index", "[moe][unit]") {
  int ids[3];
  float w[3];
  SECTION("ties") {
    const float p[6] = {0.1f, 0.3f, 0.1f, 0.3f, 0.05f, 0.15f};
    model::route_top_k(p, 6, 3, false, ids, w);
    CHECK(ids[0] == 1);
    CHECK(ids[1] == 3);
    CHECK(ids[2] == 5);
    model::route_top_k(p, 6, 2, false, ids, w);
    CHECK(ids[0] == 1);
    CHECK(ids[1] == 3);
    const float all_equal[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    model::route_top_k(all_equal, 4, 3, false, ids, w);
    CHECK(ids[0] == 0);
    CHECK(ids[1] == 1);
    CHECK(ids[2] == 2);
    CHECK(w[2] == 0.25f);
  }
  SECTION("renormalisation against plain math") {
    const float p[5] = {0.05f, 0.4f, 0.2f, 0.1f, 0.25f};
    model::route_top_k(p, 5, 3, true, ids, w);
    CHECK(ids[0] == 1);
    CHECK(ids[1] == 4);
    CHECK(ids[2] == 2);
    const double s = 0.4 + 0.25 + 0.2;
    CHECK(w[0] == Approx(0.4 / s).epsilon(1e-6));
    CHECK(w[1] == Approx(0.25 / s).epsilon(1e-6));
    CHECK(w[2] == Approx(0.2 / s).epsilon(1e-6));
    CHECK(double(w[0]) + w[1] + w[2] == Approx(1.0).epsilon(1e-6));
    model::route_top_k(p, 5, 3, false, ids, w);  // qwen2moe: the probabilities themselves
    CHECK(w[0] == 0.4f);
    CHECK(w[1] == 0.25f);
    CHECK(w[2] == 0.2f);
  }
  SECTION("NaN never wins over a number") {
    const float p[3] = {std::nanf(""), 0.2f, 0.1f};
    model::route_top_k(p, 3, 2, false, ids, w);
    CHECK(ids[0] == 1);
    CHECK(ids[1] == 2);
  }
}

TEST_CASE("moe: moe-small-f32.gguf config", "[moe][gguf]") {
  if (test::shared_file("models/gguf/moe-small-f32.gguf").empty()) return;
  auto f = open_shared("models/gguf/moe-small-f32.gguf");
  const auto& c = f->cfg();
  CHECK(c.moe());
  CHECK(c.arch == "llama");
  CHECK(c.n_experts == 8);
  CHECK(c.n_experts_used == 2);
  CHECK(c.hidden_dim == 256);
  CHECK(c.dim == 128);
  CHECK(c.n_layers == 4);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.shared_classifier);
  CHECK(c.norm_topk);
  CHECK(c.shared_hidden == 0);
  CHECK(f->moe_layer(3).w2.size() == 8);
  CHECK(f->moe_layer(3).w2[7].rows == 128);
  CHECK(f->moe_layer(3).w2[7].cols == 256);
  // Every weight, counted by the config, against the file's tensor data.
  uint64_t elems = 0;
  for (const auto& t : f->gguf()->tensors()) elems += t.elements();
  CHECK(elems == c.total_params());
}

TEST_CASE("moe: llama.cpp's greedy ids on moe-small-f32.gguf on every backend", "[moe][gguf]") {
  const auto ref_path = test::shared_file("models/gguf/gguf-small-reference-ids.json");
  if (ref_path.empty()) return;
  const auto ref = nlohmann::json::parse(test::read_file(ref_path));
  auto f = open_shared("models/gguf/moe-small-f32.gguf");
  int runs = 0;
  for (const auto& run : ref["runs"]) {
    if (run["model"] != "moe-small-f32.gguf") continue;
    const auto prompt = run["prompt_ids"].get<std::vector<int>>();
    const auto want = run["generated_ids"].get<std::vector<int>>();
    REQUIRE(want.size() == 64);
    for (const char* be : kBackends) {
      INFO(be << " prompt '" << run["prompt"].get<std::string>() << "'");
      CHECK(greedy(f, prompt, static_cast<int>(want.size()), be) == want);
    }
    ++runs;
  }
  CHECK(runs == 2);
}

TEST_CASE("moe: the MoE block against float64 math and tensor-parallel slices adding up",
          "[moe][gguf]") {
  const auto path = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (path.empty()) return;
  auto f = open_shared("models/gguf/moe-small-f32.gguf");
  ref_forward rf(*f->gguf());
  const auto& c = f->cfg();
  auto whole = model::shard_weights::make(f, model::slice_spec::whole(c)).value();
  // Two halves of every expert's units (tensor parallelism).
  auto half = [&](int b, int e) {
    auto s = model::slice_spec::whole(c);
    s.ffn_begin = b;
    s.ffn_end = e;
    return model::shard_weights::make(f, s).value();
  };
  auto wa = half(0, 100), wb = half(100, 256);
  std::vector<float> xb(c.dim), out(c.dim), pa(c.dim), pb(c.dim);
  for (int layer : {0, 3}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<double> xd(c.dim);
      for (int i = 0; i < c.dim; ++i) xb[i] = static_cast<float>(std::sin(0.37 * i + 1.3 * trial + layer));
      for (int i = 0; i < c.dim; ++i) xd[i] = xb[i];
      const auto want = rf.moe(layer, xd);
      model::scratch s(*whole), sa(*wa), sb(*wb);
      const kernels::backend& be = kernels::reference_backend();
      model::moe_ffn(be, *whole, layer, xb.data(), s, out.data());
      model::moe_ffn(be, *wa, layer, xb.data(), sa, pa.data());
      model::moe_ffn(be, *wb, layer, xb.data(), sb, pb.data());
      double err = 0, scale = 0, split = 0;
      for (int i = 0; i < c.dim; ++i) {
        err = std::max(err, std::abs(out[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
        split = std::max(split, std::abs(double(pa[i]) + pb[i] - want[i]));
      }
      INFO("layer " << layer << " trial " << trial << " max |out| " << scale);
      CHECK(scale > 1e-2);
      CHECK(err <= 1e-5 * scale);
      CHECK(split <= 1e-5 * scale);
    }
  }
}

TEST_CASE("moe: float64 forward pass agrees with llama.cpp on moe-small-f32.gguf (first 16 ids)",
          "[moe][gguf]") {
  const auto ref_path = test::shared_file("models/gguf/gguf-small-reference-ids.json");
  if (ref_path.empty()) return;
  const auto ref = nlohmann::json::parse(test::read_file(ref_path));
  auto g = model::gguf::file::open(test::shared_file("models/gguf/moe-small-f32.gguf")).value();
  for (const auto& run : ref["runs"]) {
    if (run["model"] != "moe-small-f32.gguf" || run["prompt"] != "Once upon a time") continue;
    auto want = run["generated_ids"].get<std::vector<int>>();
    want.resize(16);
    CHECK(ref_greedy(*g, run["prompt_ids"].get<std::vector<int>>(), 16) == want);
  }
}

namespace {

model::config tiny_moe(int shared_hidden) {
  model::config c;
  c.dim = 64;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 96;
  c.seq_len = 64;
  c.shared_classifier = shared_hidden == 0;
  c.n_experts = 6;
  c.n_experts_used = 2;
  c.shared_hidden = shared_hidden;
  return c;
}

}  // namespace

TEST_CASE("moe: synth GGUF models (Mixtral-style and qwen2moe) against the float64 pass",
          "[moe][synth]") {
  for (int shared : {0, 40}) {
    const auto c = tiny_moe(shared);
    auto bytes = model::synth_gguf(c, 7);
    auto g = model::gguf::file::from_bytes(bytes, "synth.gguf").value();
    auto f = model::model_file::from_bytes(bytes, "synth.gguf");
    INFO((f.ok() ? std::string() : f.message()));
    REQUIRE(f.ok());
    const auto& fc = (*f)->cfg();
    CHECK(fc.arch == (shared ? "qwen2moe" : "llama"));
    CHECK(fc.n_experts == 6);
    CHECK(fc.n_experts_used == 2);
    CHECK(fc.hidden_dim == 24);
    CHECK(fc.shared_hidden == shared);
    CHECK(fc.norm_topk == (shared == 0));
    CHECK(fc.qkv_bias == (shared != 0));
    const std::vector<int> prompt = {1, 17, 42, 5};
    std::vector<std::vector<double>> want_logits;
    const auto want = ref_greedy(*g, prompt, 24, &want_logits);
    WARN("synth " << fc.arch << ": float64 pass's smallest top-1/top-2 margin "
                  << min_margin(want_logits));
    REQUIRE(min_margin(want_logits) > 1e-3);  // far above f32 rounding: ids must agree
    for (const char* be : kBackends) {
      INFO(fc.arch << " on " << be);
      std::vector<std::vector<float>> got_logits;
      CHECK(greedy(*f, prompt, 24, be, &got_logits) == want);
      double err = 0;
      for (size_t p = 0; p < got_logits.size(); ++p)
        for (size_t i = 0; i < got_logits[p].size(); ++i)
          err = std::max(err, std::abs(got_logits[p][i] - want_logits[p][i]));
      CHECK(err < 1e-3);
    }
  }
}

namespace {

// moe-small-f32.gguf rewritten: `edit` on the metadata, `tensor` may replace
// or drop (return false) a tensor.
using tensor_edit = std::function<bool(const model::gguf::tensor_info&, std::vector<uint64_t>&,
                                       std::vector<uint8_t>&)>;
std::string moe_error(const std::function<void(model::gguf::writer&)>& edit,
                      const tensor_edit& tensor = nullptr) {
  auto g = model::gguf::file::open(test::shared_file("models/gguf/moe-small-f32.gguf")).value();
  model::gguf::writer w;
  for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
  for (const auto& t : g->tensors()) {
    std::vector<uint64_t> ne = t.ne;
    std::vector<uint8_t> data(t.data, t.data + t.bytes);
    if (tensor && !tensor(t, ne, data)) continue;
    w.add_tensor(t.name, ne, t.type, std::move(data));
  }
  edit(w);
  auto r = model::model_file::from_bytes(w.bytes(), "edited-moe.gguf");
  REQUIRE_FALSE(r.ok());
  return r.message();
}

}  // namespace

TEST_CASE("moe: bad MoE files are clear errors", "[moe][errors]") {
  if (test::shared_file("models/gguf/moe-small-f32.gguf").empty()) return;
  SECTION("experts_used > experts") {
    CHECK(moe_error([](auto& w) { w.set_u32("llama.expert_used_count", 9); }) ==
          "edited-moe.gguf: key llama.expert_used_count is 9, expected at most "
          "llama.expert_count (8)");
  }
  SECTION("expert_count without expert_used_count") {
    CHECK_THAT(moe_error([](auto& w) { w.set_string("llama.expert_used_count", "two"); }),
               Catch::Contains("key llama.expert_used_count is string, expected an integer"));
  }
  SECTION("a missing expert tensor") {
    CHECK(moe_error([](auto&) {},
                    [](const auto& t, auto&, auto&) { return t.name != "blk.2.ffn_up_exps.weight"; }) ==
          "edited-moe.gguf: missing tensor blk.2.ffn_up_exps.weight (llama.expert_count is 8: "
          "every layer needs ffn_gate_inp, ffn_gate_exps, ffn_up_exps and ffn_down_exps)");
  }
  SECTION("a missing router") {
    CHECK_THAT(moe_error([](auto&) {},
                         [](const auto& t, auto&, auto&) { return t.name != "blk.0.ffn_gate_inp.weight"; }),
               Catch::Contains("missing tensor blk.0.ffn_gate_inp.weight (the router"));
  }
  SECTION("a wrong expert tensor shape") {
    auto msg = moe_error([](auto&) {}, [](const auto& t, auto& ne, auto& data) {
      if (t.name == "blk.1.ffn_down_exps.weight") {  // 7 experts instead of 8
        ne[2] = 7;
        data.resize(data.size() / 8 * 7);
      }
      return true;
    });
    CHECK_THAT(msg, Catch::StartsWith("edited-moe.gguf: tensor blk.1.ffn_down_exps.weight has "
                                      "shape [256, 128, 7], expected [256, 128, 8] from the metadata"));
  }
  SECTION("a 2-D expert tensor") {
    auto msg = moe_error([](auto&) {}, [](const auto& t, auto& ne, auto&) {
      if (t.name == "blk.0.ffn_gate_exps.weight") ne = {128, 256 * 8};
      return true;
    });
    CHECK_THAT(msg, Catch::Contains("tensor blk.0.ffn_gate_exps.weight has shape [128, 2048], "
                                    "expected [128, 256, 8]"));
  }
}

TEST_CASE("moe: experts in Q8_0 and Q4_0 (cellshard quantize) run near F32 on every backend",
          "[moe][gguf][quantize]") {
  if (test::shared_file("models/gguf/moe-small-f32.gguf").empty()) return;
  auto f32 = open_shared("models/gguf/moe-small-f32.gguf");
  // Teacher-forced: the prompt and llama.cpp's first greedy ids, so that
  // every position sees the same context in both files.
  const std::vector<int> ids = {1, 403, 407, 261, 378, 494, 108, 494, 133, 97, 354, 288};
  auto logits_of = [&](std::shared_ptr<const model::model_file> f, const char* be) {
    auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg())).value();
    model::engine eng(w, *kernels::find_backend(be));
    std::vector<std::vector<float>> out;
    for (size_t p = 0; p < ids.size(); ++p) {
      const float* l = eng.forward(ids[p], static_cast<int>(p));
      out.emplace_back(l, l + f->cfg().vocab_size);
    }
    return out;
  };
  const auto base = logits_of(f32, "reference");
  for (auto type : {kernels::dtype::q8_0, kernels::dtype::q4_0}) {
    auto img = model::quantize_gguf(*f32, type);
    REQUIRE(img.ok());
    auto q = model::model_file::from_bytes(*img, "moe-quantized.gguf");
    INFO((q.ok() ? std::string() : q.message()));
    REQUIRE(q.ok());
    CHECK((*q)->has_non_f32());
    CHECK((*q)->moe_layer(2).w1[5].type == type);
    CHECK((*q)->moe_layer(2).w2[5].type == type);
    CHECK((*q)->moe_layer(2).router.type == kernels::dtype::f32);  // routers are kept
    for (const char* be : kBackends) {
      const auto got = logits_of(*q, be);
      double num = 0, den = 0;
      for (size_t p = 0; p < got.size(); ++p)
        for (size_t i = 0; i < got[p].size(); ++i) {
          num += (double(got[p][i]) - base[p][i]) * (double(got[p][i]) - base[p][i]);
          den += double(base[p][i]) * base[p][i];
        }
      INFO(kernels::to_string(type) << " on " << be << ": NMSE " << num / den);
      if (std::string(be) == "reference")
        WARN("moe-small " << kernels::to_string(type) << " vs F32 logits: NMSE " << num / den);
      // Measured 0.015 (q8_0) and 0.46 (q4_0) under the files' default
      // --matmul ggml with a quantized tied classifier: random uniform weights
      // quantize badly, and a rounding can flip a near-tied expert choice.
      // (--weights q8_0 on the F32 file, exact matmul, f32 embedding: 1e-3.)
      CHECK(num / den < (type == kernels::dtype::q8_0 ? 0.05 : 0.7));
    }
  }
}

TEST_CASE("moe: --weights q8_0 on the F32 file quantizes the experts at load", "[moe][gguf]") {
  if (test::shared_file("models/gguf/moe-small-f32.gguf").empty()) return;
  auto f = open_shared("models/gguf/moe-small-f32.gguf");
  auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg()), model::weight_format::q8_0);
  REQUIRE(w.ok());
  CHECK((*w)->at(1).ew1[3].q8 != nullptr);
  CHECK((*w)->at(1).ew2[3].q8 != nullptr);
  CHECK((*w)->at(1).router.f32 != nullptr);  // routers stay f32
  auto f32w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg())).value();
  model::engine a(*w, kernels::reference_backend()), b(f32w, kernels::reference_backend());
  double num = 0, den = 0;
  const int ids[] = {1, 403, 407, 261, 378};
  for (int p = 0; p < 5; ++p) {
    const float* la = a.forward(ids[p], p);
    const float* lb = b.forward(ids[p], p);
    for (int i = 0; i < f->cfg().vocab_size; ++i) {
      num += (double(la[i]) - lb[i]) * (double(la[i]) - lb[i]);
      den += double(lb[i]) * lb[i];
    }
  }
  WARN("moe-small --weights q8_0 vs f32 logits: NMSE " << num / den);
  CHECK(num / den < 1e-3);
  CHECK(num / den > 0);  // it did quantize
}

TEST_CASE("moe: a byte-swapped MoE file gives the same logits (big-endian host path)", "[moe][gguf]") {
  const auto path = test::shared_file("models/gguf/moe-small-f32.gguf");
  if (path.empty()) return;
  auto g = model::gguf::file::open(path).value();
  model::gguf::writer w;
  for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
  for (const auto& t : g->tensors()) {
    std::vector<uint8_t> data(t.data, t.data + t.bytes);
    kernels::swap_rows(kernels::dtype::f32, data.data(), static_cast<int>(t.rows()), static_cast<int>(t.ne[0]));
    w.add_tensor(t.name, t.ne, t.type, std::move(data));
  }
  model::load_options o;
  o.force_swap = true;
  auto swapped = model::model_file::from_bytes(w.bytes(3, true), "swapped-moe.gguf", o);
  INFO((swapped.ok() ? std::string() : swapped.message()));
  REQUIRE(swapped.ok());
  std::vector<std::vector<float>> a, b;
  const std::vector<int> prompt = {1, 403, 407};
  CHECK(greedy(*swapped, prompt, 6, "reference", &a) ==
        greedy(open_shared("models/gguf/moe-small-f32.gguf"), prompt, 6, "reference", &b));
  CHECK(a == b);
}

TEST_CASE("moe: prefill in chunks is bit-identical to one position at a time", "[moe][synth]") {
  for (int shared : {0, 40}) {
    auto f = model::model_file::from_bytes(model::synth_gguf(tiny_moe(shared), 3), "synth.gguf").value();
    auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg())).value();
    const std::vector<int> ids = {1, 17, 42, 5, 9, 60, 33, 2, 71};
    const int V = f->cfg().vocab_size, n = static_cast<int>(ids.size());
    for (const char* be : kBackends) {
      INFO(f->cfg().arch << " on " << be);
      model::engine one(w, *kernels::find_backend(be)), chunk(w, *kernels::find_backend(be));
      chunk.set_batch_size(4);
      std::vector<float> all(static_cast<size_t>(n) * V);
      chunk.prefill(ids.data(), n, 0, all.data());
      for (int p = 0; p < n; ++p) {
        const float* l = one.forward(ids[p], p);
        CHECK(std::vector<float>(l, l + V) ==
              std::vector<float>(all.begin() + static_cast<size_t>(p) * V, all.begin() + static_cast<size_t>(p + 1) * V));
      }
    }
  }
}
