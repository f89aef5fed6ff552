// The session journal reader (model/journal.cpp), which --resume runs on a
// file a user may have edited: an accepted journal, written again by the
// writer's own line functions, has the same digests and reads back.
#include "fuzz/common.hpp"
#include "model/journal.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = as_text(data, size);
  auto j = model::parse_journal(text, "fuzz.jsonl");
  if (!j) {
    FUZZ_CHECK(!j.message().empty());
    return 0;
  }
  // The writer's lines for what was read carry the same digest chain, and
  // read back to the same journal.
  uint64_t d = 0;
  std::string again = model::journal_header_line(j->header, &d) + "\n";
  for (const auto& e : j->entries) again += model::journal_entry_line(e, d, &d) + "\n";
  FUZZ_CHECK(d == j->digest);
  auto back = model::parse_journal(again, "again.jsonl");
  FUZZ_CHECK(back && back->digest == j->digest && back->entries.size() == j->entries.size());
  return 0;
}
