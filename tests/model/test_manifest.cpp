// Weight manifests (issue #17, model/manifest.hpp): a shard built from its
// slice image alone (the manifest's bytes, nothing else of the file) computes
// bit for bit what the shard built from the whole file computes, on llama2.c
// and GGUF files (F32, q8_0, mixture of experts, qwen2 biases), for pipeline, tensor and
// vocabulary slices; a slice reads the bytes its layers hold (checked against
// the llama2.c layout's own arithmetic); corruption and truncation are named.
#include "model/manifest.hpp"

#include "model/gguf.hpp"
#include "model/quant.hpp"
#include "tests/model/gguf_swap.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <cstring>
#include <fstream>
#include <random>
#include <xxhash.h>

using namespace cellshard;

namespace {

std::vector<float> seeded(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

/// The slice image of `spec` gathered from the whole file's own bytes, in
/// two pieces (a chunk boundary inside an entry), verified.
std::vector<uint8_t> gather(const model::manifest& m, const model::model_file& f) {
  std::vector<uint8_t> s(m.bytes());
  const uint64_t half = m.bytes() / 2 + 3;
  REQUIRE(f.file_image() != nullptr);
  REQUIRE(model::copy_slice_bytes(m, f.file_image(), 0, half, s.data()));
  REQUIRE(model::copy_slice_bytes(m, f.file_image(), half, m.bytes() - half, s.data() + half));
  auto ok = model::verify_slice(m, s.data(), s.size(), "gathered");
  INFO((ok ? std::string() : ok.message()));
  REQUIRE(ok);
  return s;
}

/// Every layer's attention and FFN partial, the classifier's logits and the
/// embedding rows from the slice-only model equal those from the file.
/// `lo`: how the file was opened (force_swap: a file of the other byte order).
void same_outputs(const std::shared_ptr<const model::model_file>& file, const model::slice_spec& spec,
                  model::weight_format fmt = model::weight_format::f32, model::load_options lo = {}) {
  INFO("slice " << spec.to_string() << " of " << file->path());
  auto m = model::make_manifest(*file, spec, "model");
  INFO((m ? std::string() : m.message()));
  REQUIRE(m);
  CHECK(m->bytes() <= file->file_bytes());  // equal for a whole GGUF (no unused bytes)
  auto round = model::manifest::decode(m->encode());
  REQUIRE(round);
  CHECK(round->entries == m->entries);
  CHECK(round->digest() == m->digest());
  const auto slice = gather(*m, *file);
  auto part = model::open_slice(*m, slice.data(), slice.size(), lo);
  INFO((part ? std::string() : part.message()));
  REQUIRE(part);
  auto wa = model::shard_weights::make(file, spec, fmt);
  auto wb = model::shard_weights::make(*part, spec, fmt);
  REQUIRE(wa);
  REQUIRE(wb);
  CHECK((*wa)->bytes() == (*wb)->bytes());
  const auto& be = kernels::reference_backend();
  const auto& c = file->cfg();
  const int kvd = spec.n_kv_heads() * c.head_size();
  model::kv_cache ka(spec.n_layers(), c.seq_len, kvd), kb(spec.n_layers(), c.seq_len, kvd);
  model::scratch sa(**wa), sb(**wb);
  std::vector<float> pa(c.dim), pb(c.dim);
  for (int pos = 0; pos < 3; ++pos)
    for (int l = spec.layer_begin; l < spec.layer_end; ++l) {
      const auto x = seeded(c.dim, 100 * pos + l);
      model::attention_partial(be, **wa, l, x.data(), pos, ka, sa, pa.data());
      model::attention_partial(be, **wb, l, x.data(), pos, kb, sb, pb.data());
      CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
      model::ffn_partial(be, **wa, l, x.data(), sa, pa.data());
      model::ffn_partial(be, **wb, l, x.data(), sb, pb.data());
      CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
    }
  if (spec.classifier) {
    const int rows = spec.vocab_rows(c.vocab_size);
    std::vector<float> la(rows), lb(rows);
    auto xa = seeded(c.dim, 7), xb = xa;
    model::classify(be, **wa, xa.data(), la.data());
    model::classify(be, **wb, xb.data(), lb.data());
    CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
  }
  if (spec.embedding)
    for (int t : {0, 1, c.vocab_size - 1}) {
      (*wa)->embed(t, pa.data());
      (*wb)->embed(t, pb.data());
      CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
    }
}

/// A llama2.c image with every 4-byte word in the other byte order (the
/// whole format is 4-byte words): what a big-endian exporter writes.
std::vector<uint8_t> words_swapped(std::vector<uint8_t> b) {
  for (size_t i = 0; i + 4 <= b.size(); i += 4) std::swap(b[i], b[i + 3]), std::swap(b[i + 1], b[i + 2]);
  return b;
}

/// The GGUF image `bytes` rewritten in the other byte order.
std::vector<uint8_t> gguf_swapped(const std::vector<uint8_t>& bytes) {
  return test::gguf_swapped(*model::gguf::file::from_bytes(bytes, "in.gguf").value());
}

/// `a` (a file of one byte order) and `b` (the same model in the other) give
/// manifests of the same ranges, each entry's digest that of its own file's
/// bytes there (XXH3 computed here), and slices that verify.
void same_ranges(const model::manifest& a, const std::vector<uint8_t>& fa, const model::manifest& b,
                 const std::vector<uint8_t>& fb) {
  REQUIRE(a.entries.size() == b.entries.size());
  CHECK(a.bytes() == b.bytes());
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const auto &x = a.entries[i], &y = b.entries[i];
    INFO(x.name);
    CHECK(x.name == y.name);
    CHECK((x.offset == y.offset && x.length == y.length && x.stride == y.stride && x.count == y.count));
    std::string sx, sy;
    for (uint64_t k = 0; k < x.count; ++k) {
      sx.append(reinterpret_cast<const char*>(fa.data() + x.offset + k * x.stride), x.length);
      sy.append(reinterpret_cast<const char*>(fb.data() + y.offset + k * y.stride), y.length);
    }
    CHECK(x.digest == XXH3_64bits(sx.data(), sx.size()));
    CHECK(y.digest == XXH3_64bits(sy.data(), sy.size()));
  }
}

/// Pipeline stages, tensor ranks (column slices of wo and w2), a vocabulary slice.
std::vector<model::slice_spec> specs_of(const model::config& c) {
  std::vector<model::slice_spec> out;
  auto whole = model::slice_spec::whole(c);
  out.push_back(whole);
  if (c.n_layers >= 2) {
    auto a = whole, b = whole;
    a.layer_end = c.n_layers / 2;
    a.classifier = false;
    b.layer_begin = c.n_layers / 2;
    b.embedding = false;
    out.push_back(a);
    out.push_back(b);
  }
  if (c.n_kv_heads >= 2) {
    auto t = whole;  // rank 1 of 2: the second half of heads and units, half the vocabulary
    t.kv_head_begin = c.n_kv_heads / 2;
    t.ffn_begin = c.hidden_dim / 2;
    t.embedding = false;
    t.vocab_begin = c.vocab_size / 2;
    t.vocab_end = c.vocab_size;
    out.push_back(t);
    auto odd = whole;  // an uneven unit split, off any 32-block boundary
    odd.ffn_end = c.hidden_dim / 3 + 1;
    odd.kv_head_end = 1;
    odd.classifier = false;
    out.push_back(odd);
  }
  return out;
}

}  // namespace

TEST_CASE("manifest: a llama2.c slice alone computes what the whole file computes", "[manifest]") {
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  for (bool shared : {true, false}) {
    c->shared_classifier = shared;
    auto f = model::model_file::from_bytes(model::synth_bytes(*c, 11), "synth.bin");
    REQUIRE(f);
    for (const auto& s : specs_of(*c)) {
      same_outputs(*f, s);
      same_outputs(*f, s, model::weight_format::q8_0);
    }
  }
}

TEST_CASE("manifest: the bytes of a pipeline stage are its layers' (llama2.c arithmetic)", "[manifest]") {
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  auto f = model::model_file::from_bytes(model::synth_bytes(*c, 5), "synth.bin");
  REQUIRE(f);
  model::slice_spec s = model::slice_spec::whole(*c);
  s.layer_begin = 1;
  s.layer_end = 2;
  s.embedding = s.classifier = false;
  auto m = model::make_manifest(**f, s, "synth.bin");
  REQUIRE(m);
  // run.c's layout: one layer is layer_params() floats; the header 28 bytes.
  CHECK(m->bytes() == 28 + c->layer_params() * 4);
  CHECK(m->file_bytes == model::checkpoint_bytes(*c));
  CHECK(m->entries.front().name == "header");
  // Every entry lies inside layer 1's fields: none overlaps layer 0's wq.
  const uint64_t wq0 = reinterpret_cast<const uint8_t*>((*f)->layer(0).wq) - (*f)->image();
  for (const auto& e : m->entries) CHECK((e.offset >= wq0 + 4ull * c->dim * c->dim || e.offset < wq0));
}

TEST_CASE("manifest: a corrupt or truncated slice is named, the digest is the slice's identity", "[manifest]") {
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  auto f = model::model_file::from_bytes(model::synth_bytes(*c, 5), "synth.bin");
  REQUIRE(f);
  auto s = model::slice_spec::whole(*c);
  s.layer_end = 2;
  s.classifier = false;
  auto m = model::make_manifest(**f, s, "synth.bin");
  REQUIRE(m);
  auto slice = gather(*m, **f);
  // The byte at the start of layer 1's w2 entry.
  uint64_t at = 0;
  for (const auto& e : m->entries) {
    if (e.name == "w2[1]") break;
    at += e.bytes();
  }
  REQUIRE(at < slice.size());
  slice[at] ^= 0x40;
  auto bad = model::verify_slice(*m, slice.data(), slice.size(), "cache file X");
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.message(), Catch::Contains("cache file X") && Catch::Contains("tensor w2[1]") &&
                                Catch::Contains("expected 0x"));
  auto cut = model::verify_slice(*m, slice.data(), slice.size() - 1, "cache file X");
  REQUIRE_FALSE(cut);
  CHECK_THAT(cut.message(), Catch::Contains(std::to_string(slice.size() - 1) + " bytes, expected " +
                                            std::to_string(slice.size())));
  // Another seed: same layout, other digests, another key.
  auto g = model::model_file::from_bytes(model::synth_bytes(*c, 6), "synth.bin");
  REQUIRE(g);
  auto m2 = model::make_manifest(**g, s, "synth.bin");
  REQUIRE(m2);
  CHECK(m2->bytes() == m->bytes());
  CHECK(m2->digest() != m->digest());
  auto m3 = model::make_manifest(**f, s, "renamed.bin");
  REQUIRE(m3);
  CHECK(m3->digest() == m->digest());  // the name is not part of the identity
  CHECK_FALSE(model::manifest::decode("cellshard-manifest 2\n"));
  CHECK_FALSE(model::manifest::decode("cellshard-manifest 1\nfile 10 llama2.c x\nentry h bytes 8 4 4 1 0x0000000000000000\n"));
}

TEST_CASE("manifest: a slice read from a local file with pread reads only its bytes", "[manifest]") {
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  const std::string dir = test::temp_dir("manifest-pread");
  const std::string path = dir + "/synth.bin";
  REQUIRE(model::synth_file(*c, 9, path));
  auto f = model::model_file::open(path);
  REQUIRE(f);
  auto s = model::slice_spec::whole(*c);
  s.layer_begin = 4;
  s.embedding = false;
  auto m = model::make_manifest(**f, s, "synth.bin");
  REQUIRE(m);
  uint64_t read = 0;
  auto slice = model::read_slice_file(*m, path, &read);
  REQUIRE(slice);
  CHECK(read == m->bytes());
  CHECK(model::verify_slice(*m, slice->data(), slice->size(), path));
}

TEST_CASE("manifest: GGUF slices (F32 mixture of experts, qwen2moe) alone compute what the file computes",
          "[manifest][moe]") {
  for (int shared : {0, 40}) {
    model::config c;
    c.dim = 64;
    c.hidden_dim = 24;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 96;
    c.seq_len = 64;
    c.shared_classifier = shared == 0;
    c.n_experts = 6;
    c.n_experts_used = 2;
    c.shared_hidden = shared;
    auto f = model::model_file::from_bytes(model::synth_gguf(c, 3), "synth.gguf");
    INFO((f ? std::string() : f.message()));
    REQUIRE(f);
    for (const auto& s : specs_of((*f)->cfg())) same_outputs(*f, s);
    auto stage = model::slice_spec::whole((*f)->cfg());
    stage.routed = false;  // an expert placement's stage shard holds no routed expert
    auto m = model::make_manifest(**f, stage, "synth.gguf");
    REQUIRE(m);
    for (const auto& e : m->entries) CHECK(e.name.find("_exps") == std::string::npos);
  }
}

TEST_CASE("manifest: shared GGUF models (F32, q8_0) sliced", "[manifest][gguf]") {
  if (!test::have_shared()) return;
  for (auto rel : {"models/gguf/llama2-small-f32.gguf", "models/gguf/stories260K-q8_0.gguf",
                   "models/gguf/stories260K.gguf"}) {
    auto f = model::model_file::open(test::shared_file(rel));
    INFO((f ? std::string() : f.message()));
    REQUIRE(f);
    for (const auto& s : specs_of((*f)->cfg())) same_outputs(*f, s);
  }
  auto f = model::model_file::open(test::shared_file("models/stories260K.bin"));
  REQUIRE(f);
  for (const auto& s : specs_of((*f)->cfg())) same_outputs(*f, s);
}

// A big-endian host (the PS3's PPE, s390x) converts little-endian llama2.c
// and CSQ8 files in place, and each GGUF tensor it uses in place; a little-endian host
// runs the same conversion on a file written big-endian (force_swap). Each
// section opens a file the host converts (`foreign`) and the same model in
// the host's order (`ours`): the manifests are of the same ranges (a slice,
// not the whole file), each digest of its own file's bytes, so a node of
// either byte order verifies what it reads from its copy of the file, and
// the slice alone computes what the converted file computes.
TEST_CASE("manifest: a file of the other byte order is sliced, digests of the file's own bytes", "[manifest]") {
  const bool be = model::host_is_big_endian();
  model::load_options fo, oo;  // how `foreign` and `ours` are opened
  fo.force_swap = !be;         // big-endian bytes on a little-endian host, and the other way round
  oo.force_swap = be;
  auto c = model::synth_preset("stories260k");
  REQUIRE(c);
  SECTION("llama2.c") {
    for (bool shared : {true, false}) {
      c->shared_classifier = shared;
      const auto le = model::synth_bytes(*c, 17), swapped = words_swapped(le);
      const auto& foreign = be ? le : swapped;
      const auto& ours = be ? swapped : le;
      auto f = model::model_file::from_bytes(foreign, "foreign.bin", fo);
      auto g = model::model_file::from_bytes(ours, "ours.bin", oo);
      REQUIRE(f);
      REQUIRE(g);
      CHECK((*f)->swapped());
      CHECK_FALSE((*g)->swapped());
      // The image is converted in place, file_image() keeps the file's bytes.
      CHECK(std::memcmp((*f)->image(), (*g)->image(), le.size()) == 0);
      REQUIRE((*f)->file_image() != nullptr);
      CHECK((*f)->file_image() != (*f)->image());
      CHECK(std::memcmp((*f)->file_image(), foreign.data(), foreign.size()) == 0);
      CHECK((*g)->file_image() == (*g)->image());
      for (const auto& s : specs_of(*c)) {
        auto mf = model::make_manifest(**f, s, "m"), mg = model::make_manifest(**g, s, "m");
        REQUIRE(mf);
        REQUIRE(mg);
        same_ranges(*mf, foreign, *mg, ours);
        same_outputs(*f, s, model::weight_format::f32, fo);
        same_outputs(*f, s, model::weight_format::q8_0, fo);
      }
    }
    // A mapped file: file_image() is a second, read-only mapping; a pipeline
    // stage's slice is its layers (run.c's arithmetic), read with pread.
    const auto le = model::synth_bytes(*c, 5);
    const auto foreign = be ? le : words_swapped(le);
    const std::string path = test::temp_dir("manifest-foreign") + "/foreign.bin";
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(foreign.data()), foreign.size());
    auto f = model::model_file::open(path, fo);
    REQUIRE(f);
    CHECK((*f)->swapped());
    REQUIRE((*f)->file_image() != nullptr);
    CHECK((*f)->file_image() != (*f)->image());
    CHECK(std::memcmp((*f)->file_image(), foreign.data(), foreign.size()) == 0);
    auto s = model::slice_spec::whole(*c);
    s.layer_begin = 1;
    s.layer_end = 2;
    s.embedding = s.classifier = false;
    auto m = model::make_manifest(**f, s, "foreign.bin");
    REQUIRE(m);
    CHECK(m->bytes() == 28 + c->layer_params() * 4);
    uint64_t read = 0;
    auto bytes = model::read_slice_file(*m, path, &read);
    REQUIRE(bytes);
    CHECK(read == m->bytes());
    auto ok = model::verify_slice(*m, bytes->data(), bytes->size(), path);
    INFO((ok ? std::string() : ok.message()));
    CHECK(ok);
    // The slice opened here is a converted sparse image: it has no file
    // bytes and is not sliced again.
    auto part = model::open_slice(*m, bytes->data(), bytes->size(), fo);
    REQUIRE(part);
    CHECK((*part)->swapped());
    CHECK((*part)->file_image() == nullptr);
    auto again = model::make_manifest(**part, s, "foreign.bin");
    REQUIRE_FALSE(again);
    CHECK_THAT(again.message(), Catch::Contains("cannot be sliced again"));
  }
  SECTION("CSQ8: one entry, the digest of the file's bytes") {
    auto w = model::model_file::from_bytes(model::synth_bytes(*c, 7), "synth.bin");
    REQUIRE(w);
    const auto le = model::quantize_to_bytes(**w).value();
    const auto foreign = be ? le : model::q8_byte_swapped(le).value();
    auto q = model::model_file::from_bytes(foreign, "foreign.q8", fo);
    REQUIRE(q);
    CHECK((*q)->swapped());
    CHECK((*q)->file_image() != (*q)->image());
    auto m = model::make_manifest(**q, model::slice_spec::whole(*c), "foreign.q8");
    REQUIRE(m);
    REQUIRE(m->entries.size() == 1);
    CHECK(m->entries[0].length == foreign.size());
    CHECK(m->entries[0].digest == XXH3_64bits(foreign.data(), foreign.size()));
    std::vector<uint8_t> slice(m->bytes());
    REQUIRE(model::copy_slice_bytes(*m, (*q)->file_image(), 0, slice.size(), slice.data()));
    CHECK(slice == foreign);
  }
  // qwen2 adds Q/K/V biases a slice must carry for each of its layers.
  for (const char* arch : {"llama", "qwen2"}) DYNAMIC_SECTION("GGUF " << arch) {
    model::config gc;
    gc.arch = arch;
    gc.dim = 64;
    gc.hidden_dim = 96;
    gc.n_layers = 2;
    gc.n_heads = 4;
    gc.n_kv_heads = 2;
    gc.vocab_size = 96;
    gc.seq_len = 64;
    const auto le = model::synth_gguf(gc, 3), swapped = gguf_swapped(le);
    const auto& foreign = be ? le : swapped;
    const auto& ours = be ? swapped : le;
    auto f = model::model_file::from_bytes(foreign, "foreign.gguf", fo);
    auto g = model::model_file::from_bytes(ours, "ours.gguf", oo);
    INFO((f ? std::string() : f.message()));
    REQUIRE(f);
    REQUIRE(g);
    CHECK((*f)->swapped());
    CHECK_FALSE((*g)->swapped());
    CHECK((*f)->cfg().qkv_bias == (std::string(arch) == "qwen2"));
    // The tensors are converted in place; file_image() keeps the file's bytes.
    REQUIRE((*f)->file_image() != nullptr);
    CHECK((*f)->file_image() != (*f)->image());
    CHECK(std::memcmp((*f)->file_image(), foreign.data(), foreign.size()) == 0);
    for (const auto& s : specs_of((*g)->cfg())) {
      auto mf = model::make_manifest(**f, s, "m"), mg = model::make_manifest(**g, s, "m");
      REQUIRE(mf);
      REQUIRE(mg);
      same_ranges(*mf, foreign, *mg, ours);
      same_outputs(*f, s, model::weight_format::f32, fo);
    }
  }
}

TEST_CASE("manifest: open_slice_file reads a slice straight into the model image, same bytes, same errors",
          "[manifest]") {
  // stories15m-shaped (60 MB): its embedding table and pipeline stages hold
  // contiguous runs of many MiB (the huge-page runs), its tensor ranks strided
  // columns of wo and w2.
  auto c = model::synth_preset("stories15m");
  REQUIRE(c);
  const std::string dir = test::temp_dir("manifest-open-slice-file");
  const std::string path = dir + "/synth.bin";
  REQUIRE(model::synth_file(*c, 5, path));
  auto f = model::model_file::open(path);
  REQUIRE(f);
  for (const auto& spec : specs_of(*c)) {
    INFO("slice " << spec.to_string());
    auto m = model::make_manifest(**f, spec, "synth.bin");
    REQUIRE(m);
    uint64_t read_a = 0, read_b = 0;
    auto bytes = model::read_slice_file(*m, path, &read_a);
    REQUIRE(bytes);
    auto a = model::open_slice(*m, bytes->data(), bytes->size());
    REQUIRE(a);
    auto failure = model::slice_file_failure::read;
    auto b = model::open_slice_file(*m, path, "its synth.bin", {}, &read_b, &failure);
    INFO((b ? std::string() : b.message()));
    REQUIRE(b);
    CHECK(failure == model::slice_file_failure::none);
    CHECK(read_b == read_a);
    CHECK(read_b == m->bytes());
    // The whole sparse image, slice bytes and zeros alike, is the same.
    REQUIRE((*a)->file_bytes() == (*b)->file_bytes());
    CHECK(std::memcmp((*a)->image(), (*b)->image(), (*a)->file_bytes()) == 0);
  }
  auto spec = model::slice_spec::whole(*c);
  spec.layer_begin = 2;
  auto m = model::make_manifest(**f, spec, "synth.bin");
  REQUIRE(m);
  // One byte of layer 3's wq changed in the node's copy: the digest error names it.
  const std::string bad = dir + "/bad.bin";
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const model::manifest_entry* wq3 = nullptr;
    for (const auto& e : m->entries)
      if (e.name == "wq[3]") wq3 = &e;
    REQUIRE(wq3 != nullptr);
    all[wq3->offset + 100] ^= 0x40;
    std::ofstream(bad, std::ios::binary) << all;
  }
  auto failure = model::slice_file_failure::none;
  auto g = model::open_slice_file(*m, bad, "its synth.bin in /models", {}, nullptr, &failure);
  REQUIRE_FALSE(g);
  CHECK(failure == model::slice_file_failure::digest);
  CHECK_THAT(g.message(), Catch::StartsWith("its synth.bin in /models: tensor wq[3] of synth.bin has digest 0x"));
  // A truncated copy: the size is named.
  const std::string shorter = dir + "/short.bin";
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    all.resize(all.size() - 10);
    std::ofstream(shorter, std::ios::binary) << all;
  }
  auto t = model::open_slice_file(*m, shorter, "its synth.bin", {}, nullptr, &failure);
  REQUIRE_FALSE(t);
  CHECK(failure == model::slice_file_failure::read);
  CHECK_THAT(t.message(), Catch::Contains("bytes, expected " + std::to_string(m->file_bytes)));
}
