// model/result.hpp: errors as values for the CAF-free layers (kernels/,
// model/, topologies/). A result<T> holds either a T or an error whose message
// names the file/field/node and what was expected (STYLE.md item 6).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace cellshard {

struct error {
  std::string message;
};

template <class T>
class result {
public:
  result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  result(error e) : v_(std::move(e)) {}            // NOLINT
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
  const error& err() const { return std::get<1>(v_); }

private:
  std::variant<T, error> v_;
};

/// result<void>: success or an error.
template <>
class result<void> {
public:
  result() = default;
  result(error e) : err_(std::move(e)), ok_(false) {}  // NOLINT
  explicit operator bool() const { return ok_; }
  bool ok() const { return ok_; }
  const std::string& message() const { return err_.message; }
  const error& err() const { return err_; }

private:
  error err_;
  bool ok_ = true;
};

inline error make_error(std::string msg) { return error{std::move(msg)}; }

}  // namespace cellshard
