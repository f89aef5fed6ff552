// The GGUF reader: real files from ../shared/models/gguf, every metadata value
// type through the writer (both byte orders, versions 2 and 3), and each bad
// input with the message it must give.
#include "model/checkpoint.hpp"
#include "model/gguf.hpp"
#include "tests/support.hpp"

#include <cstring>

using namespace cellshard;
using namespace cellshard::model;

namespace {

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A small file with every scalar type, arrays and two tensors.
gguf::writer sample_writer() {
  gguf::writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_i32("test.i32", -7);
  w.set_u64("test.u64", 1ull << 40);
  w.set_f32("test.f32", 1.5f);
  w.set_bool("test.bool", true);
  gguf::value u8;
  u8.type = gguf::value_type::u8;
  u8.u = 200;
  w.copy_value("test.u8", u8);
  gguf::value i16;
  i16.type = gguf::value_type::i16;
  i16.i = -300;
  w.copy_value("test.i16", i16);
  gguf::value f64;
  f64.type = gguf::value_type::f64;
  f64.f = 0.25;
  w.copy_value("test.f64", f64);
  w.set_string_array("test.strings", {"<unk>", "a b", ""});
  w.set_f32_array("test.floats", {0.5f, -2.0f});
  w.set_i32_array("test.ints", {1, -2, 3});
  w.add_tensor("vec", {4}, gguf::ggml_type::f32, f32_bytes({1, 2, 3, 4}));
  w.add_tensor("mat", {2, 3}, gguf::ggml_type::f32, f32_bytes({1, 2, 3, 4, 5, 6}));
  return w;
}

void check_sample(const gguf::file& f) {
  CHECK(f.get_string("general.architecture").value() == "llama");
  CHECK(f.get_u32("llama.block_count").value() == 2);
  CHECK(f.get_i32("test.i32").value() == -7);
  CHECK(f.get_u64("test.u64").value() == (1ull << 40));
  CHECK(f.get_f32("test.f32").value() == 1.5f);
  CHECK(f.get_bool("test.bool").value());
  CHECK(f.get_u32("test.u8").value() == 200);
  CHECK(f.get_int("test.i16").value() == -300);
  CHECK(f.get_f32("test.f64").value() == 0.25f);
  CHECK(f.get_string_array("test.strings").value() ==
        std::vector<std::string>{"<unk>", "a b", ""});
  CHECK(f.get_f32_array("test.floats").value() == std::vector<float>{0.5f, -2.0f});
  CHECK(f.get_i32_array("test.ints").value() == std::vector<int32_t>{1, -2, 3});
  CHECK(f.get_array_count("test.strings").value() == 3);
  REQUIRE(f.tensors().size() == 2);
  auto mat = f.tensor("mat");
  REQUIRE(mat.ok());
  CHECK((*mat)->ne == std::vector<uint64_t>{2, 3});
  CHECK((*mat)->rows() == 3);
  CHECK((*mat)->row_elems() == 2);
  CHECK((*mat)->bytes == 24);
  CHECK(((*mat)->data - f.bytes()) % 32 == 0);
}

}  // namespace

TEST_CASE("gguf: stories260K.gguf metadata and tensors", "[gguf]") {
  const auto path = test::shared_file("models/gguf/stories260K.gguf");
  if (path.empty()) return;
  auto r = gguf::file::open(path);
  REQUIRE(r.ok());
  const auto& f = **r;
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.get_string("general.architecture").value() == "llama");
  CHECK(f.get_u32("llama.embedding_length").value() == 64);
  CHECK(f.get_u32("llama.block_count").value() == 5);
  CHECK(f.get_u32("llama.feed_forward_length").value() == 172);
  CHECK(f.get_u32("llama.attention.head_count").value() == 8);
  CHECK(f.get_u32("llama.attention.head_count_kv").value() == 4);
  CHECK(f.get_u32("llama.context_length").value() == 128);
  CHECK(f.get_f32("llama.attention.layer_norm_rms_epsilon").value() == 1e-5f);
  auto toks = f.get_string_array("tokenizer.ggml.tokens");
  REQUIRE(toks.ok());
  REQUIRE(toks->size() == 512);
  CHECK((*toks)[1] == "<s>");
  CHECK(f.get_f32_array("tokenizer.ggml.scores")->size() == 512);
  auto types = f.get_i32_array("tokenizer.ggml.token_type");
  REQUIRE(types.ok());
  CHECK((*types)[0] == 2);
  CHECK((*types)[1] == 3);
  CHECK(f.get_u32("tokenizer.ggml.padding_token_id").value() == 4294967295u);
  CHECK(f.tensors().size() == 48);
  auto emb = f.tensor("token_embd.weight");
  REQUIRE(emb.ok());
  CHECK((*emb)->type == gguf::ggml_type::f32);
  CHECK((*emb)->ne == std::vector<uint64_t>{64, 512});
  CHECK((*emb)->bytes == 64 * 512 * 4);
  auto down = f.tensor("blk.4.ffn_down.weight");
  REQUIRE(down.ok());
  CHECK((*down)->ne == std::vector<uint64_t>{172, 64});
}

TEST_CASE("gguf: quantized and F16 files report their tensor types", "[gguf]") {
  const auto q8 = test::shared_file("models/gguf/llama2-small-q8_0.gguf");
  if (q8.empty()) return;
  auto r = gguf::file::open(q8);
  REQUIRE(r.ok());
  auto wq = (*r)->tensor("blk.0.attn_q.weight");
  REQUIRE(wq.ok());
  CHECK((*wq)->type == gguf::ggml_type::q8_0);
  CHECK((*wq)->bytes == 256 / 32 * 34 * 256);
  CHECK(gguf::ggml_type_name((*wq)->type) == "Q8_0");
  auto f16 = gguf::file::open(test::shared_file("models/gguf/stories260K-f16.gguf"));
  REQUIRE(f16.ok());
  CHECK((*f16)->tensor("output.weight").value()->type == gguf::ggml_type::f16);
  CHECK((*f16)->tensor("output_norm.weight").value()->type == gguf::ggml_type::f32);
}

TEST_CASE("gguf: a vocabulary-only file (no tensors) opens", "[gguf]") {
  for (const char* name : {"models/gguf/ggml-vocab-llama-spm.gguf",
                           "models/gguf/ggml-vocab-llama-bpe.gguf"}) {
    const auto path = test::shared_file(name);
    if (path.empty()) return;
    auto r = gguf::file::open(path);
    REQUIRE(r.ok());
    CHECK((*r)->tensors().empty());
    CHECK((*r)->get_string_array("tokenizer.ggml.tokens")->size() > 30000);
  }
  const auto bpe = gguf::file::open(test::shared_file("models/gguf/ggml-vocab-llama-bpe.gguf"));
  REQUIRE(bpe.ok());
  CHECK((*bpe)->get_string("tokenizer.ggml.model").value() == "gpt2");
  CHECK((*bpe)->get_string("tokenizer.ggml.pre").value() == "llama-bpe");
  CHECK((*bpe)->get_string_array("tokenizer.ggml.merges")->size() == 280147);
  CHECK((*bpe)->get_u32("tokenizer.ggml.bos_token_id").value() == 128000);
}

TEST_CASE("gguf: every value type round-trips, versions 2 and 3, both byte orders", "[gguf]") {
  const auto w = sample_writer();
  for (uint32_t version : {2u, 3u}) {
    auto r = gguf::file::from_bytes(w.bytes(version), "sample.gguf");
    REQUIRE(r.ok());
    CHECK((*r)->version() == version);
    // swapped(): the tensor data needs converting, i.e. a big-endian host.
    CHECK((*r)->swapped() == host_is_big_endian());
    check_sample(**r);
  }
  // A file in the other byte order, read with force_swap: the metadata comes
  // out the same (the big-endian host path).
  auto swapped = gguf::file::from_bytes(w.bytes(3, true), "swapped.gguf", {true});
  REQUIRE(swapped.ok());
  CHECK((*swapped)->swapped() != host_is_big_endian());
  check_sample(**swapped);
  // Read without the swap it is recognisably the other byte order.
  auto unswapped = gguf::file::from_bytes(w.bytes(3, true), "swapped.gguf");
  REQUIRE_FALSE(unswapped.ok());
  CHECK_THAT(unswapped.message(), Catch::Contains("swapped.gguf") &&
                                      Catch::Contains("unsupported GGUF version 50331648") &&
                                      Catch::Contains("other byte order"));
}

TEST_CASE("gguf: general.alignment places the data section", "[gguf]") {
  auto w = sample_writer();
  w.set_u32("general.alignment", 64);
  auto r = gguf::file::from_bytes(w.bytes(), "a64.gguf");
  REQUIRE(r.ok());
  CHECK((*r)->alignment() == 64);
  CHECK((*r)->data_offset() % 64 == 0);
  const float* v = reinterpret_cast<const float*>((*r)->tensor("mat").value()->data);
  CHECK(v[5] == 6.0f);
  w.set_u32("general.alignment", 48);
  auto bad = gguf::file::from_bytes(w.bytes(), "a48.gguf");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.message(), Catch::Contains("a48.gguf") && Catch::Contains("general.alignment") &&
                                Catch::Contains("power of two"));
}

TEST_CASE("gguf: bad inputs are clear errors naming file, key or tensor", "[gguf][errors]") {
  const auto good = sample_writer().bytes();
  auto open = [](std::vector<uint8_t> b) { return gguf::file::from_bytes(std::move(b), "bad.gguf"); };
  SECTION("bad magic") {
    auto b = good;
    b[0] = 'X';
    auto r = open(b);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("bad.gguf: bad magic") && Catch::Contains("GGUF") &&
                                Catch::Contains("58 47 55 46"));
  }
  SECTION("empty file") {
    auto r = open({});
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("bad magic") && Catch::Contains("only 0 bytes"));
  }
  SECTION("unsupported version") {
    auto b = good;
    b[4] = 1;
    auto r = open(b);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("unsupported GGUF version 1, expected 2 or 3"));
    b[4] = 4;
    CHECK_THAT(open(b).message(), Catch::Contains("unsupported GGUF version 4"));
  }
  SECTION("truncated anywhere in the header") {
    // Every cut inside header, metadata and tensor infos is an error that says
    // truncated (or, in the data, names the tensor that lies outside).
    const auto data_start = gguf::file::from_bytes(good, "x").value()->data_offset();
    for (size_t cut = 4; cut < data_start; cut += 7) {
      auto b = good;
      b.resize(cut);
      auto r = open(b);
      REQUIRE_FALSE(r.ok());
      CHECK_THAT(r.message(), Catch::Contains("bad.gguf") &&
                                  (Catch::Contains("truncated") || Catch::Contains("outside")));
    }
  }
  SECTION("tensor outside the file") {
    auto b = good;
    b.resize(b.size() - 4);
    auto r = open(b);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("tensor mat") && Catch::Contains("outside the file") &&
                                Catch::Contains("truncated"));
  }
  SECTION("unknown tensor type") {
    gguf::writer w;
    w.add_tensor("odd", {4}, 99, std::vector<uint8_t>(16));
    auto r = open(w.bytes());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("tensor odd") && Catch::Contains("unknown tensor type 99"));
  }
  SECTION("row not a whole number of blocks") {
    gguf::writer w;
    w.add_tensor("q", {40}, gguf::ggml_type::q8_0, std::vector<uint8_t>(68));
    auto r = open(w.bytes());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("tensor q") && Catch::Contains("multiple of its block size 32"));
  }
  SECTION("unknown value type") {
    gguf::writer w;
    w.set_u32("k", 1);
    auto b = w.bytes();
    // Value type follows magic 4, version 4, counts 16, key (8 + 1).
    b[4 + 4 + 16 + 9] = 77;
    auto r = open(b);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("key k has value type 77"));
  }
  SECTION("absurd string length") {
    gguf::writer w;
    w.set_string("k", "v");
    auto b = w.bytes();
    b[4 + 4 + 16 + 7] = 0x7f;  // top byte of the key length
    auto r = open(b);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.message(), Catch::Contains("bad.gguf") && Catch::Contains("corrupt file"));
  }
  SECTION("missing key and wrong type") {
    auto f = open(good).value();
    auto m = f->get_u32("llama.embedding_length");
    REQUIRE_FALSE(m.ok());
    CHECK(m.message() == "bad.gguf: missing key llama.embedding_length (expected an integer)");
    auto t = f->get_u32("general.architecture");
    REQUIRE_FALSE(t.ok());
    CHECK(t.message() == "bad.gguf: key general.architecture is string, expected an integer");
    CHECK(f->get_string_array("test.floats").message() ==
          "bad.gguf: key test.floats is array of f32, expected an array of string");
    CHECK(f->get_u32("test.i32").message() ==
          "bad.gguf: key test.i32 is -7, expected a value in 0..4294967295");
    CHECK(f->tensor("output.weight").message() == "bad.gguf: missing tensor output.weight");
  }
}
