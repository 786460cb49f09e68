// SPDX-License-Identifier: Apache-2.0
#pragma once
/// `gradient_buckets<Communicator>`: many gradient tensors fused into buckets of about
/// `bucket_bytes` (DDP's default 25 MiB), each bucket's (compressed) allreduce started on the
/// communicator's progress thread as soon as its last tensor is marked ready, so that the
/// exchange of the layers already done overlaps the backward pass of the others.
///
///   squall::gradient_buckets<comm_type> buckets(comm, {w3.size(), w2.size(), w1.size()});
///   // backward, last layer first: write each gradient into its slot, then mark it
///   std::copy(g3.begin(), g3.end(), buckets.gradient(0).data());  buckets.ready(0);
///   ...
///   buckets.wait();                      // every bucket reduced: buckets.gradient(i) holds it
///
/// Tensors are assigned to buckets in the order given (give them in the order backward
/// produces them), a bucket closed when the next tensor would take it past `bucket_bytes` (a
/// tensor larger than that has a bucket of its own). Each bucket keeps its compression state
/// (error feedback's residual, PowerSGD's Q) across steps. Every rank must give the same sizes
/// and the same `bucket_bytes`; the order in which tensors are marked ready may differ between
/// ranks (buckets are started in bucket order regardless, so every rank starts the same
/// sequence: a bucket that is complete waits for the buckets before it).

#include <squall/algorithm/request.hpp>
#include <squall/compress/none.hpp>
#include <squall/core/buffer.hpp>
#include <squall/core/error.hpp>
#include <squall/core/ops.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace squall {

template <class Communicator>
class gradient_buckets {
  static constexpr bool compresses =
      !std::is_same_v<typename Communicator::compressor_type, identity_compressor>;

 public:
  /// Buckets for tensors of `sizes` float elements on `comm` (which must outlive them), each
  /// of at most `bucket_bytes` unless one tensor alone is larger; `mean`: the buckets are
  /// averaged over ranks (`avg_op`, DDP's convention), else summed.
  gradient_buckets(Communicator& comm, const std::vector<std::size_t>& sizes,
                   std::size_t bucket_bytes = std::size_t{25} << 20, bool mean = true)
      : comm_(comm), mean_(mean) {
    if (bucket_bytes == 0) {
      throw invalid_argument({.operation = "gradient_buckets", .rank = comm.rank()},
                             "bucket_bytes must be positive");
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t bytes = sizes[i] * sizeof(float);
      if (buckets_.empty() || (buckets_.back().count > 0 &&
                               (buckets_.back().count * sizeof(float) + bytes > bucket_bytes))) {
        buckets_.emplace_back();
      }
      bucket& b = buckets_.back();
      slots_.push_back({buckets_.size() - 1, b.count, sizes[i]});
      b.count += sizes[i];
      ++b.tensors;
    }
    for (bucket& b : buckets_) {
      b.data.resize(b.count);
      if constexpr (compresses) b.state.emplace_back(comm_.template make_state<float>(b.count));
    }
    ready_.assign(sizes.size(), false);
  }

  gradient_buckets(const gradient_buckets&) = delete;
  gradient_buckets& operator=(const gradient_buckets&) = delete;
  /// Waits for what is in flight (errors dropped: the communicator raises them next).
  ~gradient_buckets() {
    for (bucket& b : buckets_) {
      try {
        b.inflight.wait();
      } catch (...) {
      }
    }
  }

  std::size_t tensors() const { return slots_.size(); }
  std::size_t bucket_count() const { return buckets_.size(); }
  /// The bucket tensor `i` lies in.
  std::size_t bucket_of(std::size_t i) const { return slot(i).bucket; }

  /// Tensor `i`'s place in its bucket: write its gradient here before `ready(i)`; after
  /// `wait()` it holds the reduced gradient.
  std::span<float> gradient(std::size_t i) {
    const slot_info& s = slot(i);
    return {buckets_[s.bucket].data.data() + s.offset, s.count};
  }

  /// Tensor `i`'s gradient is in place. When this completes its bucket and every bucket
  /// before it has been started, starts them (the compressed allreduce with the bucket's
  /// state, or the dense one). `invalid_argument` if `i` was already marked this step.
  void ready(std::size_t i) {
    const slot_info& s = slot(i);
    if (ready_[i]) {
      throw invalid_argument({.operation = "gradient_buckets", .rank = comm_.rank()},
                             "tensor " + std::to_string(i) + " marked ready twice in one step");
    }
    ready_[i] = true;
    ++buckets_[s.bucket].marked;
    while (next_ < buckets_.size() && buckets_[next_].marked == buckets_[next_].tensors) {
      start(buckets_[next_]);
      ++next_;
    }
  }
  /// Copies `grad` into tensor `i`'s place, then `ready(i)`.
  void ready(std::size_t i, buffer_view<const float> grad) {
    const std::span<float> place = gradient(i);
    if (grad.count() != place.size()) {
      throw invalid_argument({.operation = "gradient_buckets", .rank = comm_.rank()},
                             "tensor " + std::to_string(i) + " has " +
                                 std::to_string(place.size()) + " elements, the gradient " +
                                 std::to_string(grad.count()));
    }
    for (std::size_t k = 0; k < place.size(); ++k) place[k] = grad.data()[k];
    ready(i);
  }

  /// Waits for every bucket's allreduce (rethrowing the first error) and starts the next step.
  /// `invalid_argument` naming the first tensor not marked ready.
  void wait() {
    for (std::size_t i = 0; i < ready_.size(); ++i) {
      if (!ready_[i]) {
        throw invalid_argument({.operation = "gradient_buckets", .rank = comm_.rank()},
                               "wait() before tensor " + std::to_string(i) + " was marked ready");
      }
    }
    for (bucket& b : buckets_) {
      b.inflight.wait();
      b.marked = 0;
    }
    ready_.assign(ready_.size(), false);
    next_ = 0;
  }

 private:
  struct slot_info {
    std::size_t bucket = 0;
    std::size_t offset = 0;
    std::size_t count = 0;
  };
  struct bucket {
    std::vector<float> data;
    std::size_t count = 0;
    std::size_t tensors = 0;
    std::size_t marked = 0;
    std::vector<typename Communicator::template state_type<float>> state;  ///< one, compressing
    request inflight;
  };

  const slot_info& slot(std::size_t i) const {
    if (i >= slots_.size()) {
      throw invalid_argument(
          {.operation = "gradient_buckets", .rank = comm_.rank()},
          "tensor " + std::to_string(i) + " of " + std::to_string(slots_.size()));
    }
    return slots_[i];
  }

  void start(bucket& b) {
    const host_view<float> data(b.data.data(), b.data.size());
    if constexpr (compresses) {
      b.inflight = mean_ ? comm_.iallreduce(data, b.state.front(), avg_op{})
                         : comm_.iallreduce(data, b.state.front(), sum_op{});
    } else {
      b.inflight = mean_ ? comm_.iallreduce(data, avg_op{}) : comm_.iallreduce(data, sum_op{});
    }
  }

  Communicator& comm_;
  bool mean_;
  std::vector<bucket> buckets_;
  std::vector<slot_info> slots_;
  std::vector<bool> ready_;
  std::size_t next_ = 0;  ///< the first bucket not started this step
};

}  // namespace squall
