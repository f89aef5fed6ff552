// base/parse.hpp: the one integer parser of the project for flags, specs and
// file fields: a whole decimal string of digits, no sign, no space, no
// suffix, that fits in T. Range checks (e.g. "at least 1") are the caller's,
// with its own message. Pure.
#pragma once

#include <charconv>
#include <optional>
#include <string_view>
#include <type_traits>

namespace cellshard {

template <class T = int>
std::optional<T> parse_uint(std::string_view s) {
  static_assert(std::is_integral_v<T>, "parse_uint parses integers");
  if (s.empty() || s.front() < '0' || s.front() > '9') return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace cellshard
