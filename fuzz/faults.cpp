// Fault specs (--fault KIND:node=N:step=S...) and fault files (--faults FILE)
// (supervision/fault_plan.cpp): an accepted spec round-trips through
// to_string(); a refused one says why.
#include "fuzz/common.hpp"
#include "supervision/fault_plan.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = as_text(data, size);
  auto p = supervision::parse_fault_spec(text);
  if (p) {
    auto again = supervision::parse_fault_spec(supervision::to_string(*p));
    FUZZ_CHECK(again && *again == *p);
  } else {
    FUZZ_CHECK(!p.message().empty());
  }
  auto fs = supervision::parse_fault_json(text);
  if (fs)
    for (const auto& f : *fs) {
      auto again = supervision::parse_fault_spec(supervision::to_string(f));
      FUZZ_CHECK(again && *again == f);
    }
  return 0;
}
