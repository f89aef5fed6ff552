// q8_0 weights: the quantized file format (model/quant.hpp) round trip and
// its validation, q8 shard slicing, the teacher-forced agreement of q8_0
// logits with f32 on a fixture sequence, and `cellshard quantize` + `run`.
#include "kernels/backend.hpp"
#include "kernels/reference.hpp"
#include "kernels/types.hpp"
#include "model/checkpoint.hpp"
#include "model/quant.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

using namespace cellshard;
using kernels::q8_block;
using kernels::q8_blocks_per_row;

namespace {

// Awkward shapes: dim, hidden and vocab not multiples of 32 (padded blocks),
// grouped-query attention, an unshared classifier.
model::config odd_config() {
  model::config c;
  c.dim = 48;
  c.hidden_dim = 100;
  c.n_layers = 2;
  c.n_heads = 6;
  c.n_kv_heads = 2;
  c.vocab_size = 300;
  c.seq_len = 64;
  c.shared_classifier = false;
  return c;
}

std::shared_ptr<const model::model_file> open_bytes(std::vector<uint8_t> b, const std::string& name) {
  auto f = model::model_file::from_bytes(std::move(b), name);
  INFO((f.ok() ? std::string() : f.message()));
  REQUIRE(f.ok());
  return *f;
}

// The blocks of a q8 matrix equal a direct quantization of the f32 rows.
bool same_blocks(const model::q8_matrix& q, const float* f32, int rows, int cols) {
  if (q.rows != rows || q.cols != cols) return false;
  const int nb = q8_blocks_per_row(cols);
  std::vector<q8_block> want(static_cast<size_t>(nb));
  for (int r = 0; r < rows; ++r) {
    kernels::quantize_row_q8(f32 + static_cast<size_t>(r) * cols, want.data(), cols);
    if (std::memcmp(want.data(), q.blocks + static_cast<size_t>(r) * nb, nb * sizeof(q8_block)) != 0) return false;
  }
  return true;
}

void check_round_trip(const model::model_file& f32, const model::model_file& q) {
  const auto& c = f32.cfg();
  REQUIRE(q.quantized());
  REQUIRE_FALSE(f32.quantized());
  CHECK(q.cfg().to_string() == c.to_string());
  const int d = c.dim, kv = c.kv_dim(), h = c.hidden_dim;
  CHECK(same_blocks(q.q8_embedding(), f32.token_embedding(), c.vocab_size, d));
  CHECK(same_blocks(q.q8_classifier(), f32.classifier(), c.vocab_size, d));
  CHECK((q.q8_classifier().blocks == q.q8_embedding().blocks) == c.shared_classifier);
  CHECK(std::memcmp(q.rms_final(), f32.rms_final(), d * sizeof(float)) == 0);
  CHECK(q.token_embedding() == nullptr);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto a = f32.layer(l);
    const auto n = q.layer(l);
    const auto b = q.q8_layer(l);
    CHECK(std::memcmp(n.rms_att, a.rms_att, d * sizeof(float)) == 0);
    CHECK(std::memcmp(n.rms_ffn, a.rms_ffn, d * sizeof(float)) == 0);
    CHECK(n.wq == nullptr);
    CHECK(same_blocks(b.wq, a.wq, d, d));
    CHECK(same_blocks(b.wk, a.wk, kv, d));
    CHECK(same_blocks(b.wv, a.wv, kv, d));
    CHECK(same_blocks(b.wo, a.wo, d, d));
    CHECK(same_blocks(b.w1, a.w1, h, d));
    CHECK(same_blocks(b.w2, a.w2, d, h));
    CHECK(same_blocks(b.w3, a.w3, h, d));
  }
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string error_of(std::vector<uint8_t> b, const std::string& name) {
  auto r = model::model_file::from_bytes(std::move(b), name);
  REQUIRE_FALSE(r.ok());
  return r.message();
}

void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) { test::put_le32(b.data() + at, v); }

}  // namespace

TEST_CASE("q8_0 file round trip: blocks equal a direct quantization", "[quant]") {
  SECTION("odd shapes, unshared classifier") {
    const auto c = odd_config();
    auto f32 = open_bytes(model::synth_bytes(c, 5), "odd.bin");
    auto img = model::quantize_to_bytes(*f32);
    REQUIRE(img.ok());
    CHECK(img->size() == model::q8_file_bytes(c));
    // Every array on a 64-byte boundary, all inside the file, in order.
    uint64_t end = model::q8_header_bytes;
    for (const auto& a : model::q8_layout(c)) {
      CHECK(a.offset % 64 == 0);
      CHECK(a.offset >= end);
      end = a.offset + a.bytes;
    }
    CHECK(end + model::q8_trailer_bytes <= img->size());
    auto q = open_bytes(*img, "odd.q8");
    check_round_trip(*f32, *q);
    // Via a file (the mmap path): byte-identical to the in-memory image.
    const std::string path = test::temp_dir("quant") + "/odd.q8";
    auto n = model::quantize_to_file(*f32, path);
    REQUIRE(n.ok());
    CHECK(*n == img->size());
    CHECK(test::read_file(path) == std::string(img->begin(), img->end()));
    auto mapped = model::model_file::open(path);
    REQUIRE(mapped.ok());
    check_round_trip(*f32, **mapped);
    // Quantizing a q8 file is refused.
    auto again = model::quantize_to_bytes(**mapped);
    REQUIRE_FALSE(again.ok());
    CHECK_THAT(again.message(), Catch::Contains("already a q8_0 file"));
  }
  SECTION("stories260K, shared classifier") {
    const auto path = test::shared_file("models/stories260K.bin");
    if (path.empty()) return;
    auto f32 = model::model_file::open(path);
    REQUIRE(f32.ok());
    auto img = model::quantize_to_bytes(**f32);
    REQUIRE(img.ok());
    CHECK(img->size() == 285384);  // docs/formats.md
    check_round_trip(**f32, *open_bytes(*img, "stories260K.q8"));
  }
}

TEST_CASE("bad q8_0 files are clear errors naming file, field, expected and actual", "[quant][errors]") {
  const auto c = odd_config();
  auto f32 = open_bytes(model::synth_bytes(c, 5), "odd.bin");
  const std::vector<uint8_t> good = *model::quantize_to_bytes(*f32);
  const std::string want = std::to_string(good.size());
  SECTION("truncated") {
    auto b = good;
    b.resize(b.size() - 100);
    const auto m = error_of(b, "cut.q8");
    CHECK_THAT(m, Catch::Contains("cut.q8") && Catch::Contains("expected " + want + " bytes") &&
                      Catch::Contains("truncated by 100 bytes"));
  }
  SECTION("extra bytes") {
    auto b = good;
    b.resize(b.size() + 3);
    CHECK_THAT(error_of(b, "long.q8"), Catch::Contains("long.q8") && Catch::Contains("3 extra bytes"));
  }
  SECTION("too short for the header") {
    std::vector<uint8_t> b(good.begin(), good.begin() + 20);
    CHECK_THAT(error_of(b, "tiny.q8"), Catch::Contains("tiny.q8") && Catch::Contains("too short"));
  }
  SECTION("version") {
    auto b = good;
    put32(b, 4, 7);
    CHECK_THAT(error_of(b, "v7.q8"),
               Catch::Contains("v7.q8") && Catch::Contains("field version is 7, expected 1"));
  }
  SECTION("header field") {
    auto b = good;
    put32(b, 8 + 4 * 3, 5);  // n_heads 5 does not divide dim 48
    CHECK_THAT(error_of(b, "heads.q8"), Catch::Contains("heads.q8") && Catch::Contains("n_heads 5"));
    put32(b, 8, 0);  // dim 0
    CHECK_THAT(error_of(b, "dim.q8"), Catch::Contains("field dim is 0"));
  }
  SECTION("block size and alignment") {
    auto b = good;
    put32(b, 36, 64);
    CHECK_THAT(error_of(b, "bs.q8"), Catch::Contains("field block_size is 64, expected 32"));
    b = good;
    put32(b, 40, 16);
    CHECK_THAT(error_of(b, "al.q8"), Catch::Contains("field alignment is 16, expected 64"));
    b = good;
    b[50] = 1;
    CHECK_THAT(error_of(b, "res.q8"), Catch::Contains("reserved byte 50 is 1, expected 0"));
  }
  SECTION("one flipped bit in the weights") {
    auto b = good;
    b[b.size() / 2] ^= 0x10;
    const auto m = error_of(b, "flip.q8");
    CHECK_THAT(m, Catch::Contains("flip.q8") && Catch::Contains("field digest") && Catch::Contains("damaged"));
  }
  SECTION("a missing file") {
    auto r = model::model_file::open("/nonexistent/model.q8");
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("/nonexistent/model.q8"));
  }
}

TEST_CASE("q8_0 files load on a big-endian host (forced swap path)", "[quant][endian]") {
  const auto c = odd_config();
  auto f32 = open_bytes(model::synth_bytes(c, 9), "odd.bin");
  auto img = model::quantize_to_bytes(*f32);
  REQUIRE(img.ok());
  auto be = model::q8_byte_swapped(*img);
  REQUIRE(be.ok());
  CHECK(*be != *img);
  auto plain = model::model_file::from_bytes(*be, "be.q8");
  REQUIRE_FALSE(plain.ok());  // read as little-endian the header is nonsense
  const std::string path = test::temp_dir("quant-endian") + "/be.q8";
  write_bytes(path, *be);
  model::load_options opts;
  opts.force_swap = true;
  auto f = model::model_file::open(path, opts);
  INFO((f.ok() ? std::string() : f.message()));
  REQUIRE(f.ok());
  check_round_trip(*f32, **f);
}

TEST_CASE("q8_0 shards of a quantized file: views, slices and bytes", "[quant][transformer]") {
  auto cfg = model::synth_preset("stories260k").value();  // dim 64, hidden 172
  auto f32 = open_bytes(model::synth_bytes(cfg, 11), "synth");
  auto q = open_bytes(*model::quantize_to_bytes(*f32), "synth.q8");
  auto whole = model::shard_weights::make(q, model::slice_spec::whole(cfg), model::weight_format::f32);
  REQUIRE(whole.ok());
  const auto& W = **whole;
  CHECK(W.format() == model::weight_format::q8_0);  // a q8_0 file stays q8_0
  // Whole-model matrices are views of the file's blocks, no copy.
  CHECK(W.at(1).wq.q8 == q->q8_layer(1).wq.blocks);
  CHECK(W.at(1).w2.q8 == q->q8_layer(1).w2.blocks);
  CHECK(W.classifier().q8 == q->q8_embedding().blocks);
  // bytes(): q8 matrices, f32 norms, the dequantized f32 embedding table.
  const uint64_t blk = sizeof(q8_block);
  const uint64_t d = 64, h = 172, kv = 32, v = 512;
  const uint64_t per_layer = (2 * d + 2 * kv) * (d / 32) * blk + 2 * h * (d / 32) * blk +
                             d * q8_blocks_per_row(172) * blk + 2 * d * 4;
  CHECK(W.bytes() == 5 * per_layer + v * d * 4 + v * (d / 32) * blk + d * 4);
  // The embedding rows are the dequantized blocks.
  std::vector<float> row(64), want(64);
  W.embed(77, row.data());
  kernels::dequantize_row_q8(q->q8_embedding().blocks + 77 * 2, want.data(), 64);
  CHECK(row == want);
  CHECK(std::memcmp(W.embedding() + 77 * 64, want.data(), 64 * 4) == 0);

  // Tensor-parallel halves: kv heads [0,2) / [2,4) put wo's column slice on
  // a block boundary (copied blocks); FFN units [0,86) / [86,172) do not
  // (w2's slice re-quantized). Partials sum to the whole layer's.
  auto sa = model::slice_spec::whole(cfg), sb = sa;
  sa.kv_head_end = 2;
  sa.ffn_end = 86;
  sb.kv_head_begin = 2;
  sb.ffn_begin = 86;
  sa.classifier = sb.embedding = false;
  auto wa = model::shard_weights::make(q, sa), wb = model::shard_weights::make(q, sb);
  REQUIRE(wa.ok());
  REQUIRE(wb.ok());
  CHECK((*wa)->embedding() != nullptr);
  CHECK((*wb)->embedding() == nullptr);
  std::vector<float> e(64);
  (*wb)->embed(77, e.data());  // still works from the q8 blocks
  CHECK(e == want);
  CHECK((*wb)->at(0).wq.q8 == q->q8_layer(0).wq.blocks + 32 * 2);  // rows: a view
  // wo columns [32,64): blocks 1 of every row, copied.
  CHECK(std::memcmp((*wb)->at(0).wo.q8, q->q8_layer(0).wo.blocks + 1, blk) == 0);
  const auto& be = kernels::reference_backend();
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = 0.01f * (i - 30);
  model::kv_cache kw(5, 512, 32), ka(5, 512, 16), kb(5, 512, 16);
  model::scratch sw(W), ssa(**wa), ssb(**wb);
  std::vector<float> pw(64), pa(64), pb(64);
  model::attention_partial(be, W, 0, x.data(), 0, kw, sw, pw.data());
  model::attention_partial(be, **wa, 0, x.data(), 0, ka, ssa, pa.data());
  model::attention_partial(be, **wb, 0, x.data(), 0, kb, ssb, pb.data());
  for (int i = 0; i < 64; ++i) CHECK(pa[i] + pb[i] == Approx(pw[i]).margin(1e-5));
  model::ffn_partial(be, W, 0, x.data(), sw, pw.data());
  model::ffn_partial(be, **wa, 0, x.data(), ssa, pa.data());
  model::ffn_partial(be, **wb, 0, x.data(), ssb, pb.data());
  // The re-quantized w2 half rounds twice: bound the difference by the
  // quantization step of its inputs (max|w2| / 127 per weight).
  float scale = 0;
  for (int i = 0; i < 64; ++i) scale = std::max(scale, std::fabs(pw[i]));
  for (int i = 0; i < 64; ++i) CHECK(pa[i] + pb[i] == Approx(pw[i]).margin(0.02 * scale));
}

TEST_CASE("q8_0/q4_0 quantized at load under --matmul ggml take the typed slot's ggml products",
          "[quant][transformer]") {
  // model::matvec/matmul with m.q8 / m.q4 and mode ggml must be the
  // backend's typed q8_0/q4_0 product in ggml precision (activations rounded
  // to q8_0 blocks), and mode exact the q8/q4 slots, on every backend that
  // has a typed slot.
  const int rows = 7, cols = 96, nb = cols / 32, n = 3;
  std::vector<float> w(static_cast<size_t>(rows) * cols), X(static_cast<size_t>(n) * cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * 1.5f;
  for (size_t i = 0; i < X.size(); ++i) X[i] = std::cos(0.11f * static_cast<float>(i) + 0.3f);
  std::vector<q8_block> q8(static_cast<size_t>(rows) * nb);
  std::vector<kernels::q4_block> q4(static_cast<size_t>(rows) * nb);
  for (int r = 0; r < rows; ++r) {
    kernels::quantize_row_q8(&w[static_cast<size_t>(r) * cols], &q8[static_cast<size_t>(r) * nb], cols);
    kernels::quantize_row_q4(&w[static_cast<size_t>(r) * cols], &q4[static_cast<size_t>(r) * nb], cols);
  }
  for (const char* name : {"reference", "native"}) {
    const kernels::backend* be = kernels::find_backend(name);
    REQUIRE(be != nullptr);
    REQUIRE(be->matvec_typed);
    INFO(name);
    for (int fmt = 0; fmt < 2; ++fmt) {
      model::matrix m;
      m.rows = rows;
      m.cols = cols;
      if (fmt == 0) m.q8 = q8.data();
      else m.q4 = q4.data();
      const void* data = fmt == 0 ? static_cast<const void*>(q8.data()) : static_cast<const void*>(q4.data());
      const auto t = fmt == 0 ? kernels::dtype::q8_0 : kernels::dtype::q4_0;
      const size_t stride = nb * (fmt == 0 ? sizeof(q8_block) : sizeof(kernels::q4_block));
      std::vector<float> got(rows), want(rows), ex(rows);
      model::matvec(*be, got.data(), m, X.data(), kernels::matmul_mode::ggml);
      be->matvec_typed(want.data(), data, t, stride, X.data(), rows, cols, kernels::matmul_mode::ggml);
      CHECK(got == want);
      model::matvec(*be, ex.data(), m, X.data(), kernels::matmul_mode::exact);
      if (fmt == 0) be->matvec_q8(want.data(), q8.data(), X.data(), rows, cols);
      else (be->matvec_q4 ? be->matvec_q4 : kernels::ref::matvec_q4)(want.data(), q4.data(), X.data(), rows, cols);
      CHECK(ex == want);
      CHECK(ex != got);  // the rounded activations are visible
      // A batch of n vectors: each the single-vector ggml product.
      std::vector<float> batch(static_cast<size_t>(n) * rows);
      model::matmul(*be, batch.data(), rows, m, X.data(), cols, n, kernels::matmul_mode::ggml);
      for (int j = 0; j < n; ++j) {
        model::matvec(*be, got.data(), m, X.data() + static_cast<size_t>(j) * cols, kernels::matmul_mode::ggml);
        CHECK(std::vector<float>(batch.begin() + j * rows, batch.begin() + (j + 1) * rows) == got);
      }
    }
  }
}

TEST_CASE("q8_0 teacher-forced on a fixture: argmax agrees with f32 at >= 95% of positions",
          "[quant][fixture]") {
  const auto mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  const auto ids = test::read_ids(test::shared_file("fixtures/greedy_bos_n200.ids"));
  REQUIRE(ids.size() == 201);
  auto f32 = model::model_file::open(mpath);
  REQUIRE(f32.ok());
  auto q = open_bytes(*model::quantize_to_bytes(**f32), "stories260K.q8");
  const auto& c = (*f32)->cfg();
  auto w32 = model::shard_weights::make(*f32, model::slice_spec::whole(c));
  auto wq_load = model::shard_weights::make(*f32, model::slice_spec::whole(c), model::weight_format::q8_0);
  auto wq_file = model::shard_weights::make(q, model::slice_spec::whole(c));
  REQUIRE(w32.ok());
  REQUIRE(wq_load.ok());
  REQUIRE(wq_file.ok());
  // Load-time bytes: q8 matrices + f32 norms + the f32 embedding table + the
  // classifier's q8 copy.
  CHECK((*wq_load)->bytes() == (*wq_file)->bytes());

  auto argmax = [](const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); };
  struct run {
    const char* name;
    std::shared_ptr<const model::shard_weights> w;
    const kernels::backend* be;
  };
  const run runs[] = {{"q8_0 at load (--weights q8_0), reference", *wq_load, &kernels::reference_backend()},
                      {"q8_0 file, reference", *wq_file, &kernels::reference_backend()},
                      {"q8_0 file, spe", *wq_file, kernels::find_backend("spe")}};
  model::engine ref(*w32, kernels::reference_backend());
  std::vector<std::vector<float>> want;
  const int n = static_cast<int>(ids.size()) - 1;
  for (int pos = 0; pos < n; ++pos) {
    const float* l = ref.forward(ids[pos], pos);
    want.emplace_back(l, l + c.vocab_size);
    CHECK(argmax(l, c.vocab_size) == ids[pos + 1]);  // f32 reproduces the greedy fixture
  }
  for (const run& r : runs) {
    REQUIRE(r.be != nullptr);
    model::engine eng(r.w, *r.be);
    int agree = 0;
    double abs_err = 0, abs_ref = 0;
    for (int pos = 0; pos < n; ++pos) {
      const float* l = eng.forward(ids[pos], pos);
      agree += argmax(l, c.vocab_size) == argmax(want[pos].data(), c.vocab_size);
      for (int i = 0; i < c.vocab_size; ++i) {
        abs_err += std::fabs(l[i] - want[pos][i]);
        abs_ref += std::fabs(want[pos][i]);
      }
    }
    const double rate = static_cast<double>(agree) / n;
    const double mae = abs_err / (static_cast<double>(n) * c.vocab_size);
    std::ostringstream os;
    os << "stories260K, " << r.name << ", teacher-forced on greedy_bos_n200 (" << n
       << " positions): argmax agreement " << agree << "/" << n << " = " << rate * 100
       << "%, mean absolute logit error " << mae << " (mean |f32 logit| "
       << abs_ref / (static_cast<double>(n) * c.vocab_size) << ")";
    WARN(os.str());
    CHECK(rate >= 0.95);
  }
}

TEST_CASE("cellshard quantize, then run -m x.q8", "[quant][cli][processes]") {
  const auto mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  const auto tok = test::shared_file("models/tok512.bin");
  const std::string dir = test::temp_dir("quant-cli");
  const std::string out = dir + "/stories260K.q8";
  auto r = test::run_command({test::cellshard_bin(), "quantize", mpath, out});
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK_THAT(r.err, Catch::Contains("wrote " + out));
  auto f = model::model_file::open(out);
  REQUIRE(f.ok());
  CHECK((*f)->quantized());

  auto single = test::run_command({test::cellshard_bin(), "run", "-m", out, "-z", tok, "-t", "0", "-n", "200",
                                   "-q", "--ids-out", dir + "/single.ids"});
  INFO(single.err);
  REQUIRE(single.status == 0);
  const auto ids = test::read_ids(dir + "/single.ids");
  CHECK(ids.size() == 201);
  // In-process nodes, tensor parallel (wo slices copied, w2 re-quantized).
  auto tensor = test::run_command({test::cellshard_bin(), "run", "-m", out, "-z", tok, "-t", "0", "-n", "40", "-q",
                                   "--nodes", "2", "--topology", "tensor", "--ids-out", dir + "/tensor.ids"});
  INFO(tensor.err);
  CHECK(tensor.status == 0);
  CHECK(test::read_ids(dir + "/tensor.ids").size() == 41);

  auto missing = test::run_command({test::cellshard_bin(), "quantize", dir + "/nope.bin", dir + "/nope.q8"});
  CHECK(missing.status == 1);
  CHECK_THAT(missing.err, Catch::Contains("nope.bin"));
  auto twice = test::run_command({test::cellshard_bin(), "quantize", out, dir + "/twice.q8"});
  CHECK(twice.status == 1);
  CHECK_THAT(twice.err, Catch::Contains("already a q8_0 file"));
}
