// Status and StatusOr<T>: the error type passed across module boundaries.
//
// An ok Status is a null pointer; an error carries a code and a message that
// is meant for the person using aotid, so it names the thing that was wrong.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace aotid {

enum class StatusCode {
  kOk = 0,
  kNotFound,
  kInvalidArgument,
  kAlreadyExists,
  kFailedPrecondition,
  kUnavailable,
  kResourceExhausted,
  kCorruption,
  kIOError,
  kInternal,
  kCancelled,         // the caller no longer wants the result (a client that hung up)
  kDeadlineExceeded,  // the work ran past its time limit
  // Over a fixed limit of this machine's (a runner's memory, a slot's
  // size): the same request fails the same way every time, so unlike
  // kResourceExhausted (a full queue, which drains) it is not retried.
  kLimitExceeded,
  kLast = kLimitExceeded,  // the highest code: codes read from a runner are checked against it
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message alone, without the code name; empty when ok().
  const std::string& message() const;
  // "NotFound: model 'x' ..." for logs; "OK" when ok().
  std::string ToString() const;

  // Returns a copy whose message is "context: original message".
  Status WithContext(std::string_view context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status LimitExceeded(std::string m) { return {StatusCode::kLimitExceeded, std::move(m)}; }
// IOError naming `what` (usually a path) and strerror(errno_value).
Status ErrnoError(std::string_view what, int errno_value);

// Holds either a value or a non-ok Status. Built from an ok Status (a bug
// in the caller: there is no value to hold) it holds Internal("StatusOr
// built from an OK status") instead, so ok() and status() always agree.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status)  // NOLINT: implicit on purpose
      : v_(status.ok() ? Internal("StatusOr built from an OK status") : std::move(status)) {}
  StatusOr(T value) : v_(std::move(value)) {}         // NOLINT: implicit on purpose

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when ok(); otherwise the error it holds (never OK).
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  // The value, or `fallback` when there is none.
  T value_or(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace aotid

#define AOTID_CONCAT_INNER(a, b) a##b
#define AOTID_CONCAT(a, b) AOTID_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not ok.
#define RETURN_IF_ERROR(expr)                   \
  do {                                          \
    ::aotid::Status _st = (expr);               \
    if (!_st.ok()) return _st;                  \
  } while (0)

// `lhs = value of expr` (a StatusOr), or return its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(AOTID_CONCAT(_status_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
