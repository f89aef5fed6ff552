// tokenizer.bin files and encode/decode (model/tokenizer.cpp). An input whose
// first byte is even is a tokenizer file (the rest of the input): an accepted
// one serialises back to the same bytes, and encodes and decodes a few texts.
// An odd first byte: the rest is text for a byte-level tokenizer. Every id
// encoded is in range and decodes.
#include "fuzz/common.hpp"
#include "model/tokenizer.hpp"

using namespace cellshard;

namespace {
void round(const model::tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text, true, true);
  int prev = model::bos_id;
  for (int id : ids) {
    FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    (void)tok.decode(prev, id);
    prev = id;
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) {
    static const auto byte_level = model::tokenizer::byte_level(300);
    round(*byte_level, as_text(data + 1, size - 1));
    return 0;
  }
  const auto bytes = as_bytes(data + 1, size - 1);
  auto t = model::tokenizer::from_bytes(bytes, "fuzz.tok");
  if (!t) return 0;
  FUZZ_CHECK((*t)->to_bytes() == bytes);
  // Small vocabularies without the byte pieces: encode must still stay in range.
  if ((*t)->vocab_size() < 3) return 0;
  for (const char* text : {"", "Once upon a time", " a b ab", "\xe2\x80\x99\xff\x00"}) round(**t, text);
  return 0;
}
