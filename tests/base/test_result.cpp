// tests/base/test_result.cpp: result<T> carries either a value or an error with
// a code and a message; the code survives propagation between result types.
#include <cellshard/result.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <string>

namespace {

cellshard::result<int> parse_digit(char c) {
  if (c < '0' || c > '9')
    return cellshard::make_error(cellshard::error_code::invalid_argument,
                                 std::string("expected a digit, got '") + c + "'");
  return c - '0';
}

cellshard::result<std::string> twice(char c) {
  auto d = parse_digit(c);
  if (!d) return d.err();  // propagates code and message unchanged
  return std::to_string(*d * 2);
}

}  // namespace

TEST_CASE("result holds a value or an error with code and message", "[base]") {
  auto ok = twice('4');
  REQUIRE(ok);
  CHECK(*ok == "8");
  auto bad = twice('x');
  REQUIRE_FALSE(bad);
  CHECK(bad.code() == cellshard::error_code::invalid_argument);
  CHECK(bad.message() == "expected a digit, got 'x'");
  CHECK_THROWS(bad.value());
}

TEST_CASE("make_error without a code is unspecified, and result<void> carries codes", "[base]") {
  cellshard::result<void> fine;
  CHECK(fine.ok());
  cellshard::result<void> e = cellshard::make_error("no code");
  CHECK_FALSE(e.ok());
  CHECK(e.code() == cellshard::error_code::unspecified);
  CHECK(e.message() == "no code");
  cellshard::result<void> t = cellshard::make_error(cellshard::error_code::timeout, "late");
  CHECK(t.code() == cellshard::error_code::timeout);
}

TEST_CASE("every error_code has a distinct name", "[base]") {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(cellshard::error_code::count); ++i) {
    const char* n = cellshard::error_code_name(static_cast<cellshard::error_code>(i));
    CHECK(std::strcmp(n, "unknown") != 0);
    names.insert(n);
  }
  CHECK(names.size() == static_cast<std::size_t>(cellshard::error_code::count));
  CHECK(std::string(cellshard::error_code_name(cellshard::error_code::io)) == "io");
}

namespace {
struct parse_error : cellshard::error {
  int consumed = 0;  // what was read before the error
};
}  // namespace

TEST_CASE("an error type derived from error carries what was done before it", "[base]") {
  using r = cellshard::result<int, parse_error>;
  auto digits = [](const char* s) -> r {
    int v = 0, n = 0;
    for (; *s; ++s, ++n) {
      if (*s < '0' || *s > '9') {
        parse_error e;
        e.code = cellshard::error_code::bad_format;
        e.message = "not a digit at " + std::to_string(n);
        e.consumed = n;
        return e;
      }
      v = v * 10 + (*s - '0');
    }
    return v;
  };
  CHECK(*digits("123") == 123);
  auto bad = digits("12x4");
  REQUIRE_FALSE(bad);
  CHECK(bad.code() == cellshard::error_code::bad_format);
  CHECK(bad.message() == "not a digit at 2");
  CHECK(bad.err().consumed == 2);
  cellshard::result<void, parse_error> v = bad.err();
  CHECK(v.err().consumed == 2);
}
