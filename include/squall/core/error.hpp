// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The exceptions squall throws. Every one names the operation, the rank that threw and the
/// peer involved, so that a failure on rank 3 of 64 can be read from its message alone.

#include <string>
#include <string_view>
#include <system_error>  // error_category, error_code, system_error
#include <type_traits>   // true_type

namespace squall {

/// squall's own error conditions; the `std::error_code` of every `squall::error` that is not
/// raised by MPI, CUDA or a system call.
enum class errc {
  timeout = 1,       ///< a wait passed its deadline
  peer_failure,      ///< a peer died or left while this rank waited for it
  mismatch,          ///< ranks called with different counts, types, ops or collectives
  invalid_argument,  ///< bad input detected before any communication
  internal,          ///< a broken invariant inside squall (a bug: please report it)
};

/// The category of `squall::errc` codes.
const std::error_category& squall_category() noexcept;
/// The category of codes returned by MPI calls (the value is the MPI error code).
const std::error_category& mpi_category() noexcept;
/// The category of `cudaError_t` codes.
const std::error_category& cuda_category() noexcept;
/// The category of `errno` values from the shared-memory transport's system calls.
const std::error_category& shm_category() noexcept;

/// Makes `std::error_code` from `errc`; found by argument-dependent lookup.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), squall_category()};
}

/// The value of `error_context::rank` and `error_context::peer` when there is none.
inline constexpr int no_rank = -1;
/// See `no_rank`.
inline constexpr int no_peer = -1;

/// Where an error happened: the operation ("allreduce", "shm attach"), this rank, the peer.
struct error_context {
  std::string_view operation = "squall";
  int rank = no_rank;
  int peer = no_peer;
};

/// The base of every exception squall throws, a `std::system_error` whose `what()` reads
/// "squall allreduce (rank 2, peer 3): <detail>: <code message>".
class error : public std::system_error {
 public:
  error(std::error_code code, const error_context& where, std::string_view detail)
      : std::system_error(code, format(where, detail)),
        operation_(where.operation),
        detail_(detail),
        rank_(where.rank),
        peer_(where.peer) {}

  /// The operation that failed.
  const std::string& operation() const noexcept { return operation_; }
  /// What went wrong, without the context prefix.
  const std::string& detail() const noexcept { return detail_; }
  /// The rank that raised the error, or `no_rank`.
  int rank() const noexcept { return rank_; }
  /// The peer involved, or `no_peer`.
  int peer() const noexcept { return peer_; }

 private:
  static std::string format(const error_context& where, std::string_view detail) {
    std::string text = "squall ";
    text += where.operation;
    if (where.rank != no_rank || where.peer != no_peer) {
      text += " (";
      if (where.rank != no_rank) text += "rank " + std::to_string(where.rank);
      if (where.rank != no_rank && where.peer != no_peer) text += ", ";
      if (where.peer != no_peer) text += "peer " + std::to_string(where.peer);
      text += ")";
    }
    text += ": ";
    text += detail;
    return text;
  }

  std::string operation_;
  std::string detail_;
  int rank_;
  int peer_;
};

/// A wait passed its deadline (a peer that is stopped, slow or never arrives).
class timeout_error : public error {
 public:
  timeout_error(const error_context& where, std::string_view detail)
      : error(make_error_code(errc::timeout), where, detail) {}
};

/// A peer process died or left while this rank depended on it.
class peer_failure : public error {
 public:
  peer_failure(const error_context& where, std::string_view detail)
      : error(make_error_code(errc::peer_failure), where, detail) {}
};

/// Ranks disagree about a call: its collective, count, element type or op.
class mismatch_error : public error {
 public:
  mismatch_error(const error_context& where, std::string_view detail)
      : error(make_error_code(errc::mismatch), where, detail) {}
};

/// An argument is malformed: a size, a payload, an option, an environment variable.
class invalid_argument : public error {
 public:
  invalid_argument(const error_context& where, std::string_view detail)
      : error(make_error_code(errc::invalid_argument), where, detail) {}
};

namespace detail {

class named_category : public std::error_category {
 public:
  explicit constexpr named_category(const char* name) noexcept : name_(name) {}
  const char* name() const noexcept override { return name_; }
  std::string message(int value) const override {
    return std::string(name_) + " error " + std::to_string(value);
  }

 private:
  const char* name_;
};

class squall_category_impl final : public named_category {
 public:
  constexpr squall_category_impl() noexcept : named_category("squall") {}
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::timeout:
        return "timed out";
      case errc::peer_failure:
        return "peer failure";
      case errc::mismatch:
        return "mismatched call across ranks";
      case errc::invalid_argument:
        return "invalid argument";
      case errc::internal:
        return "internal error";
    }
    return named_category::message(value);
  }
};

class shm_category_impl final : public named_category {
 public:
  constexpr shm_category_impl() noexcept : named_category("shm") {}
  std::string message(int value) const override { return std::system_category().message(value); }
};

}  // namespace detail

// The categories are immutable objects with static storage, as the standard's own are.
inline const std::error_category& squall_category() noexcept {
  static const detail::squall_category_impl category;
  return category;
}
inline const std::error_category& mpi_category() noexcept {
  static const detail::named_category category("mpi");
  return category;
}
inline const std::error_category& cuda_category() noexcept {
  static const detail::named_category category("cuda");
  return category;
}
inline const std::error_category& shm_category() noexcept {
  static const detail::shm_category_impl category;
  return category;
}

/// Throws `invalid_argument` naming `operation` and element `index` of a compressor's input,
/// which is `what` ("NaN", "infinite"; the compressors' `check_finite`).
[[noreturn]] inline void throw_not_finite(std::string_view operation, std::size_t index,
                                          std::string_view what) {
  throw invalid_argument({.operation = operation}, "element " + std::to_string(index) +
                                                       " is not finite: " + std::string(what) +
                                                       " (check_finite is set)");
}

}  // namespace squall

template <>
struct std::is_error_code_enum<squall::errc> : std::true_type {};
