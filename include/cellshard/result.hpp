// <cellshard/result.hpp>: errors as values, for every layer that knows nothing
// of CAF (kernels/, model/, topologies/, supervision/'s plain data types) and
// for the public API. Target cellshard::base (header only, no dependency).
//
// A result<T> holds either a T or an error. An error carries a code (what kind
// of failure, for a program to branch on) and a message (for a person: it
// names the file/field/node and what was expected, STYLE.md item 6).
//
// Thread safety: values; a result is as thread-safe as its T.
// Errors: value() on an error, or message()/err()/code() on a value, is a
// precondition violation (std::bad_variant_access for result<T>).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace cellshard {

/// What kind of failure an error is. Stable numbering: new codes go before
/// `count`, never in between.
enum class error_code : std::uint8_t {
  /// Not classified (the default of make_error(message)).
  unspecified = 0,
  /// An argument or option was out of range or inconsistent.
  invalid_argument,
  /// A file could not be opened, read or written.
  io,
  /// A file or message was read but its content is malformed or inconsistent.
  bad_format,
  /// Valid input this build or this model does not support.
  unsupported,
  /// A deadline passed before the work finished.
  timeout,
  /// Nodes failed beyond what recovery could repair (no spare, budget spent).
  unavailable,
  /// The caller cancelled the work.
  cancelled,
  /// Tokens were produced but differ from what the caller expected (digest).
  mismatch,
  /// A broken invariant inside cellshard (a bug: please report it).
  internal,
  count
};

/// A short stable name of `code` ("io", "timeout", ...), for logs and JSON.
constexpr const char* error_code_name(error_code code) {
  switch (code) {
    case error_code::unspecified: return "unspecified";
    case error_code::invalid_argument: return "invalid_argument";
    case error_code::io: return "io";
    case error_code::bad_format: return "bad_format";
    case error_code::unsupported: return "unsupported";
    case error_code::timeout: return "timeout";
    case error_code::unavailable: return "unavailable";
    case error_code::cancelled: return "cancelled";
    case error_code::mismatch: return "mismatch";
    case error_code::internal: return "internal";
    case error_code::count: break;
  }
  return "unknown";
}
static_assert(static_cast<int>(error_code::count) == 10, "name every error_code above");

struct error {
  /// For a person: what failed, where (file/field/node) and what was expected.
  std::string message;
  /// For a program: what kind of failure.
  error_code code = error_code::unspecified;
};

/// A T or an error of type E. E is `error` or a type derived from it that
/// carries more (generation_error carries the partial output). Propagating an
/// error between results of different T: `if (!r) return r.err();`.
template <class T, class E = error>
class result {
public:
  result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  result(E e) : v_(std::move(e)) {}                // NOLINT
  explicit operator bool() const { return v_.index() == 0; }
  bool ok() const { return v_.index() == 0; }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const std::string& message() const { return std::get<1>(v_).message; }
  error_code code() const { return std::get<1>(v_).code; }
  const E& err() const { return std::get<1>(v_); }

private:
  std::variant<T, E> v_;
};

/// result<void>: success or an error.
template <class E>
class result<void, E> {
public:
  result() = default;
  result(E e) : err_(std::move(e)), ok_(false) {}  // NOLINT
  explicit operator bool() const { return ok_; }
  bool ok() const { return ok_; }
  const std::string& message() const { return err_.message; }
  error_code code() const { return err_.code; }
  const E& err() const { return err_; }

private:
  E err_;
  bool ok_ = true;
};

inline error make_error(std::string msg) { return error{std::move(msg), error_code::unspecified}; }
inline error make_error(error_code code, std::string msg) { return error{std::move(msg), code}; }

}  // namespace cellshard
