// tests/base/test_parse.cpp: the project's one integer parser and one
// percentile, against hand-computed values.
#include "base/parse.hpp"
#include "base/percentile.hpp"

#include <catch2/catch.hpp>

#include <climits>
#include <cstdint>
#include <vector>

using cellshard::parse_count;
using cellshard::parse_uint;
using cellshard::parse_uint_in;
using cellshard::percentile;

TEST_CASE("parse_uint: whole decimal strings that fit, nothing else", "[base]") {
  CHECK(parse_uint<int>("0") == 0);
  CHECK(parse_uint<int>("42") == 42);
  CHECK(parse_uint<int>("2147483647") == INT_MAX);
  CHECK_FALSE(parse_uint<int>("2147483648"));  // does not fit
  CHECK(parse_uint<std::uint64_t>("18446744073709551615") == UINT64_MAX);
  for (const char* bad : {"", "-1", "-0", "+1", " 1", "1 ", "1x", "0x10", "1.5", "1,2"}) {
    INFO(bad);
    CHECK_FALSE(parse_uint<int>(bad));
    CHECK_FALSE(parse_uint<std::uint64_t>(bad));
  }
  CHECK_FALSE(parse_uint<std::uint8_t>("256"));
  CHECK(parse_uint<std::uint8_t>("255") == 255);
}

TEST_CASE("parse_uint base 16: digests and byte tokens", "[base]") {
  CHECK(parse_uint<std::uint64_t>("a63dd90f31c958a4", 16) == 0xa63dd90f31c958a4ULL);
  CHECK(parse_uint<std::uint64_t>("FFFFFFFFFFFFFFFF", 16) == UINT64_MAX);
  CHECK_FALSE(parse_uint<std::uint64_t>("1FFFFFFFFFFFFFFFF", 16));  // 17 digits: does not fit
  CHECK(parse_uint<int>("0A", 16) == 10);
  for (const char* bad : {"0x0A", "g", "-a", " a", ""}) {
    INFO(bad);
    CHECK_FALSE(parse_uint<int>(bad, 16));
  }
}

TEST_CASE("parse_count: a count is at least 1 (the placement and planner specs agree on 0)", "[base]") {
  int n = 7;
  CHECK_FALSE(parse_count(std::string_view("0"), n));
  CHECK(n == 7);  // untouched on failure
  CHECK_FALSE(parse_count(std::string_view("-2"), n));
  CHECK_FALSE(parse_count(std::string_view(""), n));
  CHECK(parse_count(std::string_view("1"), n));
  CHECK(n == 1);
  CHECK(parse_count(std::string_view("64"), n));
  CHECK(n == 64);
}

TEST_CASE("parse_uint_in: the range is checked, the error names the field, the text and the range", "[base]") {
  auto ok = parse_uint_in<int>("12", "--steps", 1, 100);
  REQUIRE(ok);
  CHECK(*ok == 12);
  CHECK(parse_uint_in<int>("1", "--steps", 1, 100).value() == 1);
  CHECK(parse_uint_in<int>("100", "--steps", 1, 100).value() == 100);
  auto zero = parse_uint_in<int>("0", "--nodes", 1);
  REQUIRE_FALSE(zero);
  CHECK(zero.code() == cellshard::error_code::invalid_argument);
  CHECK(zero.message() == "--nodes: expected an integer from 1 to 2147483647, got '0'");
  auto big = parse_uint_in<std::uint16_t>("65536", "port");
  REQUIRE_FALSE(big);
  CHECK(big.message() == "port: expected an integer from 0 to 65535, got '65536'");
  CHECK(parse_uint_in<int>("x1", "id").message() == "id: expected an integer from 0 to 2147483647, got 'x1'");
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
