// base/parse.hpp: the one integer parser of the project, for flags, specs,
// file fields, the lines daemons print and the ids files tests read.
//
// parse_uint<T>(s, base): a whole string of digits of `base` (10 or 16; no
// sign, no "0x", no space, no suffix) whose value fits in T; std::nullopt
// otherwise. parse_uint_in<T>(s, what, min, max): the same, with the range
// [min, max] checked and an error (error_code::invalid_argument) whose message
// names `what`, the text and the expected range, e.g.
//   "--nodes: expected an integer from 1 to 2147483647, got '0'".
// parse_count(s, out): a count, parse_uint of at least 1 (0 is refused: every
// "N" of a --topology or placement spec is a number of stages, ranks or
// nodes); sets `out` and returns true, or leaves `out` and returns false.
// Callers with their own usage text (a spec's grammar) use parse_uint or
// parse_count and phrase the error themselves. Pure; thread-safe.
#pragma once

#include <cellshard/result.hpp>

#include <charconv>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace cellshard {

template <class T = int>
std::optional<T> parse_uint(std::string_view s, int base = 10) {
  static_assert(std::is_integral_v<T>, "parse_uint parses integers");
  // from_chars itself refuses space and '+', but takes '-' for a signed T.
  if (s.empty() || s.front() == '-') return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

template <class T>
bool parse_count(std::string_view s, T& out) {
  const auto v = parse_uint<T>(s);
  if (!v || *v < T{1}) return false;
  out = *v;
  return true;
}

template <class T = int>
result<T> parse_uint_in(std::string_view s, std::string_view what, T min = T{0},
                        T max = std::numeric_limits<T>::max()) {
  const auto v = parse_uint<T>(s);
  if (!v || *v < min || *v > max)
    return make_error(error_code::invalid_argument, std::string(what) + ": expected an integer from " +
                                                        std::to_string(min) + " to " + std::to_string(max) +
                                                        ", got '" + std::string(s) + "'");
  return *v;
}

}  // namespace cellshard
