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
///
/// With a low-rank compressor (PowerSGD) give each tensor's matrix view too (`columns`: a
/// weight of shape (out, in, ...) has in x ... columns, 0 for a vector), and each bucket is
/// reduced per tensor as torch's PowerSGD hook does: a weight with a state of its own in its
/// own view, the vectors (and matrices the factors would not shrink twofold) dense. PowerSGD
/// on a whole bucket, one near-square matrix of several layers, loses the layers' low rank
/// (docs/performance.md: 35 points below on Fashion-MNIST through the DDP hook).

#include <squall/algorithm/request.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/sketch.hpp>  // powersgd_shape
#include <squall/compress/state.hpp>   // uses_low_rank, inner_of
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
    assign(sizes, bucket_bytes);
    for (bucket& b : buckets_) {
      if constexpr (compresses) b.state.emplace_back(comm_.template make_state<float>(b.count));
    }
  }

  /// Buckets as above for a low-rank compressor, reduced per tensor: tensor i viewed as rows
  /// of `columns[i]` elements (0: a vector), compressed where (rows + columns) x rank x 2 <
  /// rows x columns, else reduced dense. `invalid_argument` unless `columns` has one entry per
  /// tensor, each 0 or at most the tensor's size.
  gradient_buckets(Communicator& comm, const std::vector<std::size_t>& sizes,
                   const std::vector<std::size_t>& columns,
                   std::size_t bucket_bytes = std::size_t{25} << 20,
                   bool mean = true) requires uses_low_rank<typename Communicator::compressor_type>
      : comm_(comm), mean_(mean) {
    if (columns.size() != sizes.size()) {
      throw invalid_argument({.operation = "gradient_buckets", .rank = comm.rank()},
                             std::to_string(columns.size()) + " column counts for " +
                                 std::to_string(sizes.size()) + " tensors");
    }
    assign(sizes, bucket_bytes);
    const std::size_t rank = inner_of(comm.compressor()).rank;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const std::size_t c = columns[i];
      if (c > sizes[i]) {
        throw invalid_argument({.operation = "gradient_buckets", .rank = comm.rank()},
                               "tensor " + std::to_string(i) + " of " + std::to_string(sizes[i]) +
                                   " elements in rows of " + std::to_string(c));
      }
      bucket& b = buckets_[slots_[i].bucket];
      part p{slots_[i].offset, sizes[i], dense_part};
      const powersgd_shape view = powersgd_shape::of(sizes[i], c);
      if (c != 0 && (view.rows + c) * rank * 2 < view.rows * c) {
        p.state = b.state.size();
        b.state.emplace_back(comm_.template make_state<float>(sizes[i], view));
      }
      b.parts.push_back(p);
    }
  }

  gradient_buckets(const gradient_buckets&) = delete;
  gradient_buckets& operator=(const gradient_buckets&) = delete;
  /// Waits for what is in flight (errors dropped: the communicator raises them next).
  ~gradient_buckets() {
    for (bucket& b : buckets_) {
      for (request& r : b.inflight) {
        try {
          r.wait();
        } catch (...) {
        }
      }
    }
  }

  std::size_t tensors() const { return slots_.size(); }
  std::size_t bucket_count() const { return buckets_.size(); }
  /// The bucket tensor `i` lies in.
  std::size_t bucket_of(std::size_t i) const { return slot(i).bucket; }
  /// How many tensors are compressed (all of them where the buckets are reduced whole with a
  /// compressor; per tensor, those with a state; none for the dense allreduce).
  std::size_t compressed_tensors() const {
    if constexpr (!compresses) {
      return 0;
    } else {
      std::size_t n = 0;
      for (const bucket& b : buckets_) n += b.parts.empty() ? b.tensors : b.state.size();
      return n;
    }
  }

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
      for (request& r : b.inflight) r.wait();
      b.inflight.clear();
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
  static constexpr std::size_t dense_part = static_cast<std::size_t>(-1);
  // A tensor of a bucket reduced on its own (low-rank, per tensor): its place, and its
  // state's index in the bucket's states, or dense_part.
  struct part {
    std::size_t offset = 0;
    std::size_t count = 0;
    std::size_t state = dense_part;
  };
  struct bucket {
    std::vector<float> data;
    std::size_t count = 0;
    std::size_t tensors = 0;
    std::size_t marked = 0;
    /// Compressing: one for the bucket, or (per tensor) one per compressed part.
    std::vector<typename Communicator::template state_type<float>> state;
    std::vector<part> parts;  ///< per tensor only
    std::vector<request> inflight;
  };

  // Assigns the tensors to buckets and sizes the buckets' buffers.
  void assign(const std::vector<std::size_t>& sizes, std::size_t bucket_bytes) {
    if (bucket_bytes == 0) {
      throw invalid_argument({.operation = "gradient_buckets", .rank = comm_.rank()},
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
    for (bucket& b : buckets_) b.data.resize(b.count);
    ready_.assign(sizes.size(), false);
  }

  const slot_info& slot(std::size_t i) const {
    if (i >= slots_.size()) {
      throw invalid_argument(
          {.operation = "gradient_buckets", .rank = comm_.rank()},
          "tensor " + std::to_string(i) + " of " + std::to_string(slots_.size()));
    }
    return slots_[i];
  }

  void start(bucket& b) {
    const auto reduce = [&](host_view<float> data, auto* state) {
      if constexpr (compresses) {
        if (state != nullptr) {
          b.inflight.push_back(mean_ ? comm_.iallreduce(data, *state, avg_op{})
                                     : comm_.iallreduce(data, *state, sum_op{}));
          return;
        }
      }
      b.inflight.push_back(mean_ ? comm_.iallreduce(data, avg_op{})
                                 : comm_.iallreduce(data, sum_op{}));
    };
    using state_pointer = typename Communicator::template state_type<float>*;
    if (b.parts.empty()) {
      reduce(host_view<float>(b.data.data(), b.data.size()),
             compresses ? b.state.data() : state_pointer{});
      return;
    }
    for (const part& p : b.parts) {
      reduce(host_view<float>(b.data.data() + p.offset, p.count),
             p.state == dense_part ? state_pointer{} : b.state.data() + p.state);
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
