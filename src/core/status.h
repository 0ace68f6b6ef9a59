// Status and Result<T>: how input and environment errors travel. A message always names the
// file, tensor, field or request parameter at fault, so a user can act on it without a debugger.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace dsv41 {

// What kind of failure an error is, chosen where it arises, so a frontend can map it (an HTTP
// status code) without matching message text.
enum class ErrorKind {
  kInvalidArgument,  // the input is wrong (a request parameter, a file's contents)
  kNotFound,         // a named thing does not exist
  kCapacity,         // a limit is reached for now (queue full): retry later
  kUnavailable,      // the service cannot take work (shutting down)
  kInternal,         // a failure of ours
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message, ErrorKind kind = ErrorKind::kInvalidArgument) {
    return Status(std::move(message), kind);
  }

  bool is_ok() const { return !message_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    DSV41_CHECK(message_.has_value());
    return *message_;
  }
  ErrorKind kind() const {
    DSV41_CHECK(message_.has_value());
    return kind_;
  }
  // Prepends context ("config.json: ") to an error, keeping its kind; a no-op on success.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(context + *message_, kind_);
  }

 private:
  Status(std::string message, ErrorKind kind) : message_(std::move(message)), kind_(kind) {}
  std::optional<std::string> message_;
  ErrorKind kind_ = ErrorKind::kInvalidArgument;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like std::expected
  Result(Status status) : v_(std::move(status)) {
    DSV41_CHECK_MSG(!std::get<Status>(v_).is_ok(), "Result built from an ok Status");
  }
  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    DSV41_CHECK_MSG(is_ok(), "value() of an error Result");
    return std::get<T>(v_);
  }
  const T& value() const& {
    DSV41_CHECK_MSG(is_ok(), "value() of an error Result");
    return std::get<T>(v_);
  }
  T&& value() && {
    DSV41_CHECK_MSG(is_ok(), "value() of an error Result");
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace dsv41

// Propagates an error Status from an expression yielding Status.
#define DSV41_RETURN_IF_ERROR(expr) \
  do {                              \
    ::dsv41::Status _st = (expr);   \
    if (!_st.is_ok()) return _st;   \
  } while (0)
