// SPDX-License-Identifier: Apache-2.0
#pragma once
/// Where a compressed collective's time goes on one rank: encoding, transfer and decoding
/// (`communicator::last_split`), marked by the algorithms of algorithm/compressed/.

#include <chrono>
#include <cstddef>  // size_t

namespace squall {

/// The seconds one rank's last compressed collective spent in each phase, on the host's
/// clock (`communicator::last_split`); they add up to the call's time. `encode`: making
/// payloads (with error feedback, through the residual; PowerSGD: the products with the
/// matrix and the orthogonalization); `transfer`: moving them, with whatever the algorithm
/// does between messages (the reduction of linear payloads' bodies, gTop-k's merges,
/// per-hop requantization's decode-add-encode at every hop, which all count here);
/// `decode`: making the result from what arrived, and the final scaling. On a backend whose
/// kernels run asynchronously the split is the host's view: a kernel counts where the host
/// waited for it. With overlap (`chunks` > 1, `collective_tuning::overlap_chunks`) encoding
/// and decoding ran on a second thread while the calling thread moved payloads: each phase
/// is its own thread's busy time, and their sum exceeds the call's time by what overlap hid.
struct phase_split {
  double encode = 0;
  double transfer = 0;
  double decode = 0;
  std::size_t chunks = 1;  ///< the chunks the tensor was cut into (1: no overlap)
};

namespace detail {

enum class phase { encode, transfer, decode };

/// Splits a call's time into phases: `start` at its beginning, then `mark(p)` says the time
/// since the last mark (or the start) went to `p`. A few clock reads per call.
class phase_clock {
 public:
  using clock = std::chrono::steady_clock;

  void start() {
    split_ = {};
    last_ = clock::now();
  }
  void mark(phase p) {
    const clock::time_point now = clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    (p == phase::encode     ? split_.encode
     : p == phase::transfer ? split_.transfer
                            : split_.decode) += seconds;
  }
  /// The phases of an overlapped call, each timed on its own thread (`run_phases`); the next
  /// `mark` counts from now.
  void overlapped(const phase_split& split) {
    split_.encode += split.encode;
    split_.transfer += split.transfer;
    split_.decode += split.decode;
    split_.chunks = split.chunks;
    last_ = clock::now();
  }
  const phase_split& split() const { return split_; }

 private:
  phase_split split_;
  clock::time_point last_ = clock::now();
};

}  // namespace detail
}  // namespace squall
