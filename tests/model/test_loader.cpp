// The llama2.c loader's validation, the big-endian (forced swap) path, and synth.
#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/generate.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <cstring>
#include <fstream>

using namespace cellshard;

namespace {
std::vector<uint8_t> read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<int> greedy_ids(std::shared_ptr<const model::model_file> f,
                            const model::tokenizer& tok, int steps) {
  auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg()));
  REQUIRE(w.ok());
  model::engine eng(*w, kernels::reference_backend());
  model::generation_params gp;
  gp.steps = steps;
  gp.sampling = {0.0f, 0.9f, 1};
  auto r = model::generate([&](int t, int p) -> result<const float*> { return eng.forward(t, p); },
                           tok, f->cfg().vocab_size, gp, nullptr);
  REQUIRE(r.ok());
  return r->ids;
}
}  // namespace

TEST_CASE("stories260K header and layout", "[loader]") {
  const auto path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  auto f = model::model_file::open(path);
  REQUIRE(f.ok());
  const auto& c = (*f)->cfg();
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.seq_len == 512);
  CHECK(c.shared_classifier);
  CHECK(model::checkpoint_bytes(c) == 1056540);
  CHECK((*f)->classifier() == (*f)->token_embedding());
}

TEST_CASE("bad model files are clear errors naming file and field", "[loader][errors]") {
  auto cfg = model::synth_preset("stories260k").value();
  auto good = model::synth_bytes(cfg, 3);
  SECTION("truncated") {
    auto b = good;
    b.resize(b.size() - 1000);
    auto r = model::model_file::from_bytes(b, "cut.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("cut.bin") && Catch::Contains("truncated by 1000") &&
                                Catch::Contains("expected 1056540"));
  }
  SECTION("corrupt header: dim not divisible by heads") {
    auto b = good;
    test::put_le32(b.data(), 65);  // dim
    auto r = model::model_file::from_bytes(b, "bad.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("bad.bin") && Catch::Contains("dim 65") &&
                                Catch::Contains("n_heads 8"));
  }
  SECTION("corrupt header: negative field") {
    auto b = good;
    test::put_le32(b.data() + 8, static_cast<uint32_t>(-5));  // n_layers
    auto r = model::model_file::from_bytes(b, "neg.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("n_layers is -5"));
  }
  SECTION("heads not divisible by kv heads") {
    auto b = good;
    test::put_le32(b.data() + 16, 3);  // n_kv_heads
    auto r = model::model_file::from_bytes(b, "kv.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("n_kv_heads 3"));
  }
  SECTION("too short for a header") {
    auto r = model::model_file::from_bytes({1, 2, 3}, "tiny.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("tiny.bin") && Catch::Contains("28-byte"));
  }
  SECTION("missing file") {
    auto r = model::model_file::open("/nonexistent/model.bin");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("/nonexistent/model.bin"));
  }
}

TEST_CASE("big-endian files load through the byte-swap path", "[loader][endian]") {
  const auto path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  auto tok = model::tokenizer::open(test::shared_file("models/tok512.bin"));
  REQUIRE(tok.ok());
  // Write the whole file with every 4-byte word swapped: the image a
  // big-endian exporter would produce. Loading it with force_swap exercises
  // exactly the conversion a PS3 (big-endian PPE) runs on a little-endian file.
  auto bytes = read_bytes(path);
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::swap(bytes[i], bytes[i + 3]), std::swap(bytes[i + 1], bytes[i + 2]);
  const std::string swapped = test::temp_dir("endian") + "/stories260K.be.bin";
  std::ofstream(swapped, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());

  auto plain = model::model_file::open(swapped);
  REQUIRE_FALSE(plain.ok());  // read as little-endian the header is nonsense
  model::load_options opts;
  opts.force_swap = true;
  auto f = model::model_file::open(swapped, opts);
  REQUIRE(f.ok());
  CHECK((*f)->cfg().dim == 64);
  auto orig = model::model_file::open(path);
  REQUIRE(orig.ok());
  CHECK(std::memcmp((*f)->token_embedding(), (*orig)->token_embedding(), 512 * 64 * 4) == 0);
  const auto want = test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids"));
  CHECK(greedy_ids(*f, **tok, 200) == want);
}

TEST_CASE("synth is deterministic, exact-size and generates", "[synth]") {
  auto cfg = model::synth_preset("stories260k").value();
  cfg.n_layers = 2;
  cfg.shared_classifier = false;
  auto a = model::synth_bytes(cfg, 7);
  auto b = model::synth_bytes(cfg, 7);
  auto c = model::synth_bytes(cfg, 8);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.size() == model::checkpoint_bytes(cfg));
  // Header fields as written.
  CHECK(test::get_le32(a.data()) == 64);
  CHECK(static_cast<int32_t>(test::get_le32(a.data() + 20)) == -512);  // unshared classifier
  // The RoPE tables sit where export.py puts them: cos(0) = 1 at position 0.
  const size_t floats_before_rope = 512ull * 64 + cfg.layer_params() * 2 + 64;
  CHECK(test::get_le_f32(a.data() + 28 + floats_before_rope * 4) == 1.0f);
  auto f = model::model_file::from_bytes(a, "synth");
  REQUIRE(f.ok());
  CHECK_FALSE((*f)->cfg().shared_classifier);
  auto tok = model::tokenizer::byte_level(512);
  auto ids = greedy_ids(*f, *tok, 20);
  CHECK(ids.size() == 21);
  for (int id : ids) {
    CHECK(id >= 0);
    CHECK(id < 512);
  }
}

TEST_CASE("shard slices partition the model's weights", "[transformer]") {
  auto cfg = model::synth_preset("stories260k").value();
  auto f = model::model_file::from_bytes(model::synth_bytes(cfg, 11), "synth");
  REQUIRE(f.ok());
  auto whole = model::shard_weights::make(*f, model::slice_spec::whole(cfg));
  REQUIRE(whole.ok());
  CHECK((*whole)->bytes() == cfg.total_params() * 4);
  model::slice_spec bad = model::slice_spec::whole(cfg);
  bad.layer_end = 6;
  auto r = model::shard_weights::make(*f, bad);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.message(), Catch::Contains("layer range"));

  // Two tensor-parallel halves: partial outputs sum to the whole layer's.
  auto sa = model::slice_spec::whole(cfg), sb = sa;
  sa.kv_head_end = 2;
  sa.ffn_end = 86;
  sb.kv_head_begin = 2;
  sb.ffn_begin = 86;
  auto wa = model::shard_weights::make(*f, sa), wb = model::shard_weights::make(*f, sb);
  REQUIRE(wa.ok());
  REQUIRE(wb.ok());
  const auto& be = kernels::reference_backend();
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.01f * (i - 30);
  model::kv_cache kw(5, 512, 32), ka(5, 512, 16), kb(5, 512, 16);
  model::scratch sw(**whole), ssa(**wa), ssb(**wb);
  std::vector<float> pw(64), pa(64), pb(64);
  model::attention_partial(be, **whole, 0, x.data(), 0, kw, sw, pw.data());
  model::attention_partial(be, **wa, 0, x.data(), 0, ka, ssa, pa.data());
  model::attention_partial(be, **wb, 0, x.data(), 0, kb, ssb, pb.data());
  for (int i = 0; i < 64; ++i) CHECK(pa[i] + pb[i] == Approx(pw[i]).margin(1e-5));
  model::ffn_partial(be, **whole, 0, x.data(), sw, pw.data());
  model::ffn_partial(be, **wa, 0, x.data(), ssa, pa.data());
  model::ffn_partial(be, **wb, 0, x.data(), ssb, pb.data());
  for (int i = 0; i < 64; ++i) CHECK(pa[i] + pb[i] == Approx(pw[i]).margin(1e-5));
}
