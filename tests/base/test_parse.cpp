// tests/base/test_parse.cpp: the project's one integer parser and one
// percentile, against hand-computed values.
#include "base/parse.hpp"
#include "base/percentile.hpp"

#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <vector>

using cellshard::parse_uint;
using cellshard::percentile;

TEST_CASE("parse_uint: whole decimal strings that fit, nothing else", "[base]") {
  CHECK(parse_uint<int>("0") == 0);
  CHECK(parse_uint<int>("42") == 42);
  CHECK(parse_uint<int>("2147483647") == INT_MAX);
  CHECK_FALSE(parse_uint<int>("2147483648"));  // does not fit
  CHECK(parse_uint<std::uint64_t>("18446744073709551615") == UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "1.5"}) {
    INFO(bad);
    CHECK_FALSE(parse_uint<int>(bad));
  }
}

TEST_CASE("percentile interpolates linearly between the closest ranks", "[base]") {
  const std::vector<double> v{4, 1, 3, 2};  // sorted: 1 2 3 4, h = q * 3
  CHECK(percentile(v, 0.0) == 1);
  CHECK(percentile(v, 1.0) == 4);
  CHECK(percentile(v, 0.5) == Approx(2.5));          // h = 1.5
  CHECK(percentile(v, 0.9) == Approx(3.7));          // h = 2.7
  CHECK(percentile(v, 0.99) == Approx(3.97));        // h = 2.97
  CHECK(percentile(std::vector<float>{7.0f}, 0.5) == 7);
  CHECK(percentile(std::vector<double>{}, 0.5) == 0);
  CHECK(percentile(v, 2.0) == 4);                    // q clamped
}
