// SPDX-License-Identifier: Apache-2.0
#pragma once
// The dense collective checks, written once and run on each rank by every runner: ranks as
// threads (tests/unit/collectives.test.cpp), as processes over shared memory
// (tests/shm/collectives.test.cpp) and as MPI ranks (tests/mpi/collectives.test.cpp). The
// runner builds the communicator (transport, topology, backend, tuning); the checks call its
// public collectives and compare each result with the serial double reference of the exact
// inputs (collective_data.hpp), bitwise after rounding to T. Exact inputs make every order of
// summation give the same bits, so a rank that matches the reference also matches every
// other rank. A check records what is wrong in `findings` and never asserts: a rank that
// threw in the middle would leave its peers waiting, and a forked rank has no doctest.

#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>
#include <squall/core/types.hpp>

#include <algorithm>  // copy
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>  // as_const
#include <vector>

#include "collective_data.hpp"
#include "data.hpp"

namespace squall::test {

/// What the checks on one rank found wrong: the first few descriptions, and how many in all.
class findings {
 public:
  void add(std::string what) {
    if (count_++ < 8) text_ += (text_.empty() ? "" : "\n") + std::move(what);
  }
  bool ok() const { return count_ == 0; }
  std::size_t count() const { return count_; }
  /// The descriptions, one per line, then how many more there were.
  std::string text() const {
    if (count_ <= 8) return text_;
    return text_ + "\n(and " + std::to_string(count_ - 8) + " more)";
  }

 private:
  std::size_t count_ = 0;
  std::string text_;
};

/// The reference of element `i` of the reduction over `ranks` ranks, rounded to T as the
/// collective rounds it (avg divides once, in the accumulator type, then rounds to T).
template <class T, class Op>
T reference_element(int ranks, std::size_t i) {
  const double want = exact_reference<T, Op>(ranks, i);
  if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) {
    return static_cast<T>(want);
  } else {
    return static_cast<T>(static_cast<float>(want));
  }
}

/// Records the first element of `got` (`count` elements, element k being index `first_index`
/// + k of the whole) that differs bitwise from `want(index)`.
template <class T, class Want>
void compare(findings& f, std::string_view what, const T* got, std::size_t count,
             std::size_t first_index, Want want) {
  for (std::size_t k = 0; k < count; ++k) {
    const T expected = want(first_index + k);
    if (std::memcmp(&got[k], &expected, sizeof(T)) != 0) {
      f.add(std::string(what) + ": element " + std::to_string(first_index + k) + " is " +
            std::to_string(as_double(got[k])) + ", not " + std::to_string(as_double(expected)));
      return;
    }
  }
}

/// `count` elements at `p` as the views `Comm`'s collectives take (its backend's memory: the
/// tests' backends keep host-addressable buffers whatever memory they claim).
template <class Comm, class T>
typename Comm::template view<T> view_of(T* p, std::size_t count) {
  return {p, count};
}
template <class Comm, class T>
typename Comm::template view<T> view_of(std::vector<T>& v) {
  return {v.data(), v.size()};
}
template <class Comm, class T>
typename Comm::template view<const T> view_of(const std::vector<T>& v) {
  return {v.data(), v.size()};
}

/// How a finding names the call: "<collective> of <count> (<topology>, <P> ranks)".
template <class Comm>
std::string where(const Comm& comm, std::string_view collective, std::size_t count) {
  return std::string(collective) + " of " + std::to_string(count) + " (" +
         std::string(Comm::topology_type::name) + ", " + std::to_string(comm.size()) + " ranks)";
}

/// One allreduce of `count` elements of T with Op, in place or out of place (the input must
/// come back untouched).
template <class T, class Op, class Comm>
void check_allreduce(Comm& comm, std::size_t count, bool in_place, findings& f) {
  const int p = comm.size();
  const std::string what = where(comm, in_place ? "allreduce in place" : "allreduce", count) + " " +
                           std::string(to_string(dtype_of<T>)) + " " + std::string(Op::name);
  std::vector<T> data = exact_input<T>(comm.rank(), count);
  std::vector<T> out(count);
  if (in_place) {
    comm.allreduce(view_of<Comm>(data), Op{});
    out = data;
  } else {
    comm.allreduce(view_of<Comm>(std::as_const(data)), view_of<Comm>(out), Op{});
    const std::vector<T> before = exact_input<T>(comm.rank(), count);
    compare(f, what + ": input", data.data(), count, 0, [&](std::size_t i) { return before[i]; });
  }
  compare(f, what, out.data(), count, 0,
          [p](std::size_t i) { return reference_element<T, Op>(p, i); });
}

/// reduce_scatter of `count` int32: out of place (sum), then in place (max, this rank's
/// block of the buffer holds it); the blocks are the communicator's.
template <class Comm>
void check_reduce_scatter(Comm& comm, std::size_t count, findings& f) {
  const int p = comm.size();
  const std::size_t offset = comm.block_offset(count);
  const std::vector<std::int32_t> in = exact_input<std::int32_t>(comm.rank(), count);
  std::vector<std::int32_t> block(comm.block_count(count), -77);
  comm.reduce_scatter(view_of<Comm>(in), view_of<Comm>(block));
  compare(f, where(comm, "reduce_scatter", count), block.data(), block.size(), offset,
          [p](std::size_t i) { return reference_element<std::int32_t, sum_op>(p, i); });
  std::vector<std::int32_t> whole = in;
  comm.reduce_scatter(view_of<Comm>(whole), max_op{});
  compare(f, where(comm, "reduce_scatter in place (max)", count), whole.data() + offset,
          comm.block_count(count), offset,
          [p](std::size_t i) { return reference_element<std::int32_t, max_op>(p, i); });
}

/// allgather of `count` doubles out of place, then of `count` int32 in place (the input
/// being this rank's block of the output).
template <class Comm>
void check_allgather(Comm& comm, std::size_t count, findings& f) {
  const auto p = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::vector<double> mine = exact_input<double>(comm.rank(), count);
  std::vector<double> all(count * p, -1.0);
  comm.allgather(view_of<Comm>(mine), view_of<Comm>(all));
  // element j of the output: element j % count of rank j / count's input
  compare(f, where(comm, "allgather", count), all.data(), all.size(), 0, [count](std::size_t j) {
    return exact_value<double>(static_cast<int>(j / count), j % count);
  });
  std::vector<std::int32_t> again(count * p, -1);
  const std::vector<std::int32_t> block = exact_input<std::int32_t>(comm.rank(), count);
  std::copy(block.begin(), block.end(), again.begin() + static_cast<std::ptrdiff_t>(r * count));
  comm.allgather(view_of<Comm>(static_cast<const std::int32_t*>(again.data() + r * count), count),
                 view_of<Comm>(again));
  compare(f, where(comm, "allgather in place", count), again.data(), again.size(), 0,
          [count](std::size_t j) {
            return exact_value<std::int32_t>(static_cast<int>(j / count), j % count);
          });
}

/// allgatherv of `base + 3q` doubles from rank q (rank 0's empty where `base` is 0), each
/// rank placing the blocks in reverse rank order with a gap of 5 after each (the gaps must stay
/// untouched); out of place, then in place (this rank's block already in its place).
template <class Comm>
void check_allgatherv(Comm& comm, std::size_t base, findings& f) {
  const auto p = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  constexpr std::size_t gap = 5;
  std::vector<std::size_t> counts(p), at(p);
  std::size_t end = 0;
  for (std::size_t k = p; k-- > 0;) {
    counts[k] = base + 3 * k;
    at[k] = end;
    end += counts[k] + gap;
  }
  const std::vector<double> mine = exact_input<double>(comm.rank(), counts[r]);
  for (const bool in_place : {false, true}) {
    const std::string what =
        where(comm, in_place ? "allgatherv in place" : "allgatherv", base) + ", block of rank ";
    std::vector<double> out(end, -1.0);
    std::vector<double*> into(p);
    for (std::size_t q = 0; q < p; ++q) into[q] = out.data() + at[q];
    if (in_place) std::copy(mine.begin(), mine.end(), into[r]);
    const double* in = in_place ? into[r] : mine.data();
    comm.allgatherv(view_of<Comm>(in, counts[r]), std::span<const std::size_t>(counts),
                    std::span<double* const>(into));
    for (std::size_t q = 0; q < p; ++q) {
      compare(f, what + std::to_string(q), into[q], counts[q], 0,
              [q](std::size_t i) { return exact_value<double>(static_cast<int>(q), i); });
      compare(f, what + std::to_string(q) + ": the gap after it", into[q] + counts[q], gap, 0,
              [](std::size_t) { return -1.0; });
    }
  }
}

/// broadcast of `count` bfloat16 from every root; the other ranks' buffers hold other values.
template <class Comm>
void check_broadcast(Comm& comm, std::size_t count, findings& f) {
  for (int root = 0; root < comm.size(); ++root) {
    std::vector<bfloat16> b = exact_input<bfloat16>(comm.rank() == root ? root : root + 1, count);
    comm.broadcast(view_of<Comm>(b), root);
    compare(f, where(comm, "broadcast from " + std::to_string(root), count), b.data(), count, 0,
            [root](std::size_t i) { return exact_value<bfloat16>(root, i); });
  }
}

/// `calls` random calls, the same sequence on every rank (`seed`): each an allreduce,
/// allgather, in-place reduce-scatter, broadcast or barrier of float, of a count that takes
/// the runner's windows, peer memory or messages; about every fourth call one rank makes
/// another call (another collective, count or root), and every rank must throw
/// `mismatch_error`. Every matching call's result is compared with values that call alone
/// wrote (small integers, exact in float), so a path that reads a stale window half or a
/// peer's old buffer after a mismatch is seen. For a communicator with the mismatch check on.
template <class Comm>
void check_calls_around_mismatches(Comm& comm, std::uint64_t seed, int calls, findings& f) {
  constexpr std::size_t counts[] = {3, 100, 400, 2000, 5003};
  const int p = comm.size();
  const int r = comm.rank();
  const auto pn = static_cast<std::size_t>(p);
  std::uint64_t state = seed;
  const auto next = [&](std::uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  for (int call = 0; call < calls; ++call) {
    const auto op = static_cast<int>(next(5));  // allreduce, allgather, reduce-scatter, ...
    const std::size_t count = counts[next(std::size(counts))];
    const int root = static_cast<int>(next(static_cast<std::uint64_t>(p)));
    const bool odd_one = next(4) == 0;
    const int odd_rank = static_cast<int>(next(static_cast<std::uint64_t>(p)));
    const auto odd_kind = static_cast<int>(next(3));
    // what the odd rank calls, worked out alike on every rank
    int odd_op = op;
    std::size_t odd_count = count;
    int odd_root = root;
    if (odd_kind == 0) odd_op = (op + 1) % 5;
    if (odd_kind == 1 && op != 4) odd_count = count + 1;  // a barrier has no count
    if (odd_kind == 2 && op == 3) odd_root = (root + 1) % p;
    if (odd_kind == 2 && op != 3) odd_op = op == 4 ? 3 : 4;  // a barrier for a call
    const bool mismatched = odd_one && (odd_op != op || odd_count != count || odd_root != root);
    const bool odd = odd_one && r == odd_rank;
    const int my_op = odd ? odd_op : op;
    const std::size_t my_count = odd ? odd_count : count;
    const auto value = [&](int q, std::size_t i) {
      return static_cast<float>((call * 7 + q * 3 + static_cast<int>(i % 11)) % 64);
    };
    std::vector<float> in(my_count * (my_op == 2 ? pn : 1));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    std::vector<float> out(my_op == 1 ? my_count * pn : in.size());
    bool caught = false;
    try {
      switch (my_op) {
        case 0:
          comm.allreduce(view_of<Comm>(std::as_const(in)), view_of<Comm>(out));
          break;
        case 1:
          comm.allgather(view_of<Comm>(std::as_const(in)), view_of<Comm>(out));
          break;
        case 2:
          comm.reduce_scatter(view_of<Comm>(in));
          break;
        case 3:
          comm.broadcast(view_of<Comm>(in), odd ? odd_root : root);
          break;
        default:
          comm.barrier();
      }
    } catch (const mismatch_error&) {
      caught = true;
    }
    const std::string what = "call " + std::to_string(call) + " (collective " + std::to_string(op) +
                             ", count " + std::to_string(count) + ")";
    if (caught != mismatched) {
      f.add(what + (mismatched ? ": no mismatch_error" : ": an unexpected mismatch_error"));
      return;  // the ranks may no longer be in step
    }
    if (mismatched) continue;
    const auto sum = [&](std::size_t i) {
      float s = 0;
      for (int q = 0; q < p; ++q) s += value(q, i);
      return s;
    };
    std::size_t wrong = 0;
    if (op == 0) {
      for (std::size_t i = 0; i < count; ++i) wrong += out[i] != sum(i);
    } else if (op == 1) {
      for (std::size_t i = 0; i < count * pn; ++i) {
        wrong += out[i] != value(static_cast<int>(i / count), i % count);
      }
    } else if (op == 2) {
      const std::size_t at = static_cast<std::size_t>(r) * count;
      for (std::size_t i = 0; i < count; ++i) wrong += in[at + i] != sum(at + i);
    } else if (op == 3) {
      for (std::size_t i = 0; i < count; ++i) wrong += in[i] != value(root, i);
    }
    if (wrong != 0) f.add(what + ": " + std::to_string(wrong) + " elements wrong");
  }
}

/// Every dense collective on `comm` (a collective call: every rank runs it): counts 0, 1,
/// P - 1, P + 1 and a prime for each collective, the allreduce over every element type and
/// op, in place and out of place, and float sums of `large_counts` (as the runner can afford).
template <class Comm>
void check_dense_collectives(Comm& comm, findings& f,
                             std::span<const std::size_t> large_counts = {}) {
  const auto p = static_cast<std::size_t>(comm.size());
  const std::size_t counts[] = {0, 1, p > 1 ? p - 1 : 3, p + 1, 1009};
  for (const std::size_t count : counts) {
    check_allreduce<float, sum_op>(comm, count, true, f);
    check_allreduce<float, sum_op>(comm, count, false, f);
    check_allreduce<std::int32_t, sum_op>(comm, count, false, f);
    check_reduce_scatter(comm, count, f);
    check_allgather(comm, count, f);
    check_broadcast(comm, count, f);
  }
  for (const std::size_t base : {std::size_t{0}, std::size_t{1009}, std::size_t{16385}}) {
    check_allgatherv(comm, base, f);  // 16385 doubles a rank: above peer_memory_bytes
  }
  check_allreduce<double, avg_op>(comm, 777, false, f);
  check_allreduce<std::int64_t, min_op>(comm, 777, true, f);
  check_allreduce<float16, max_op>(comm, 777, false, f);
  check_allreduce<bfloat16, sum_op>(comm, 777, true, f);
  check_allreduce<std::int32_t, avg_op>(comm, 100, true, f);
  for (const bool in_place : {false, true}) {
    check_allreduce<bfloat16, avg_op>(comm, p + 1, in_place, f);
    check_allreduce<std::int64_t, max_op>(comm, 1, in_place, f);
    check_allreduce<float, sum_op>(comm, 100003, in_place, f);
  }
  for (const std::size_t count : large_counts) {
    check_allreduce<float, sum_op>(comm, count, count % 2 == 0, f);
  }
  comm.barrier();
}

}  // namespace squall::test
