// SPDX-License-Identifier: Apache-2.0
#pragma once
// The training of train_fashion_mnist.cpp: its settings, one rank's training loop and the two
// runners that visit every --compressor. The loop (`train_loop`, train_loop.cpp) is compiled
// once: it reaches the communicators through `exchange`, which `train` implements for each
// transport and compressor, one translation unit per transport (train_shm.cpp, train_mpi.cpp),
// compiled side by side.
#include <squall/compress/by_name.hpp>
#include <squall/squall.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>  // memcmp
#include <numeric>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dataset.hpp"
#include "model.hpp"

namespace fashion_mnist {

using clock_type = std::chrono::steady_clock;

/// The learning rate and momentum --lr and --momentum default to (dense SGD's on this network).
inline constexpr float default_lr = 0.05f;
inline constexpr float default_momentum = 0.9f;

struct settings {
  int ranks = 2;
  int epochs = 10;
  std::size_t batch = 32;  // per rank
  float lr = default_lr;
  float momentum = default_momentum;
  bool cosine = true;            // --schedule cosine|constant
  double warmup = 0;             // --warmup EPOCHS
  bool masking = true;           // --masking on|off
  bool flush_denormals = false;  // --flush-denormals on|off (x86: MXCSR's FTZ and DAZ)
  int sparsity_warmup = 0;       // --sparsity-warmup EPOCHS (DGC)
  std::size_t hidden = 256;
  std::vector<squall::compressor_choice> compressors;
  std::size_t train_subset = 0;  // 0: all 60,000
  std::size_t test_subset = 0;   // 0: all 10,000
  std::string data;
  std::string csv;
  std::uint64_t seed = 1;
  std::string transport = "shm";  // shm: fork -n ranks; mpi: the ranks mpiexec started
  double require_accuracy = 0;    // exit 4 if a run ends below it (tests)
  std::size_t overlap = 0;        // --overlap K: W1 in K pieces, non-blocking (0: blocking)
  // --registered on|off: the gradients in registered memory; unset, where the transport has
  // it (shm)
  std::optional<bool> registered;
};

/// Trains once per --compressor on -n forked ranks joined by shm_transport (train_shm.cpp);
/// returns the exit status (0, or the last failing run's).
int train_over_shm(const settings& s, const dataset& data, std::size_t train_count,
                   std::size_t test_count);
/// The same on the ranks mpiexec started, over mpi_transport (train_mpi.cpp; MPI initialised).
int train_over_mpi(const settings& s, const dataset& data, std::size_t train_count,
                   std::size_t test_count);

/// PowerSGD views a weight matrix as its layer's rows x columns; other compressors take none.
template <class C>
void set_columns(C& c, std::size_t columns) {
  if constexpr (requires { c.columns; })
    c.columns = columns;
  else if constexpr (requires { c.inner.columns; })
    c.inner.columns = columns;
}

/// Where compressor `c` keeps a top-k ratio (its own, error feedback's inner one, a chain's
/// selection), or null: what the sparsity warm-up lowers.
template <class C>
double* topk_ratio(C& c) {
  if constexpr (std::is_same_v<C, squall::topk_compressor>)
    return &c.ratio;
  else if constexpr (requires { c.inner; })
    return topk_ratio(c.inner);
  else if constexpr (requires { c.select; })
    return topk_ratio(c.select);
  else
    return nullptr;
}

/// DGC's sparsity warm-up (Lin et al., "Deep Gradient Compression", ICLR 2018): over the first
/// `epochs` epochs the density falls geometrically from 25% towards `target` (DGC's 75%,
/// 93.75%, 98.4375%, 99.6% sparsity for 4 epochs and 0.1%), then stays at `target`.
inline double warmup_density(double target, int epoch, int epochs) {
  if (epoch > epochs || target >= 0.25) return target;
  return 0.25 * std::pow(target / 0.25, static_cast<double>(epoch - 1) / epochs);
}

/// Who this rank is, and how it makes a transport for each of its communicators.
template <class Transport, class Make>
struct rank_of_job {
  int rank = 0;
  int size = 1;
  Make make;  // Transport make(std::string_view part): "dense", "w1" or "w2"
};

/// What the training loop needs of one rank's communicators (the dense one, W1's and W2's),
/// whatever the transport and the compressor: the loop is compiled once, this is implemented by
/// `train` for each of them.
class exchange {
 public:
  /// One block of W1's rows in the flat gradient, reduced on its own (with --overlap K, K of
  /// them), compressed or dense.
  struct piece {
    std::size_t from = 0, count = 0;
    bool compress = false;
  };
  /// What the compressor is, fixed before the first step.
  struct facts {
    std::string label;             ///< the compressor as given (--compressor)
    bool local_momentum = false;   ///< error feedback: each rank compresses its own velocity
    bool sketch_momentum = false;  ///< FetchSGD: the results are the steps (momentum in sketches)
    bool masks = false;            ///< DGC's momentum masking applies (sparse sets with feedback)
    bool has_ratio = false;        ///< a top-k ratio the sparsity warm-up may lower
    double target_ratio = 0;       ///< that ratio
    std::vector<piece> w1;         ///< W1's pieces
    bool compress_w2 = false;
    std::span<float> gradients;  ///< the flat gradient the loop computes into (`exchange` owns it)
    bool registered = false;     ///< `gradients` lies in registered memory
  };

  virtual ~exchange() = default;
  /// The mean over the ranks of gradient part `g` (W1's piece `k`, W2 or the biases): blocking,
  /// or (`start`) started, to be waited by `finish`.
  virtual void reduce(part which, std::size_t k, std::span<float> g, bool start) = 0;
  /// Waits for every reduction started since the last call.
  virtual void finish() = 0;
  /// The bytes this rank has sent for the gradients since the start.
  virtual std::uint64_t bytes_sent() const = 0;
  /// `v` summed (or its maximum) over the ranks.
  virtual double across(double v, bool sum) = 0;
  /// `v`'s elementwise maximum over the ranks, in place.
  virtual void max_over_ranks(std::vector<float>& v) = 0;
  /// Sets the top-k ratio of both communicators' compressors (every rank alike, between calls).
  virtual void set_ratio(double ratio) = 0;
  /// DGC's momentum masking: zeroes `velocity` where this rank's last encode sent its value.
  virtual void mask_sent(float* velocity) = 0;
};

/// One rank's training loop over `ex`; returns its exit code: 0, 3 if the ranks' weights
/// differ, 4 if the final test accuracy is below --require-accuracy (train_loop.cpp).
int train_loop(int rank, int size, exchange& ex, const exchange::facts& f, const settings& s,
               const dataset& data, std::size_t train_count, std::size_t test_count);

/// One rank's training with compressor C: its communicators behind `exchange`, then
/// `train_loop`. The tensors C compresses go through a ring communicator of C per weight
/// matrix; every tensor sent dense (all of them for `none`, the biases, a matrix C would not
/// make smaller) through one dense communicator on the automatic topology, which on one host
/// picks direct's one-shot: with the gradients in its registered memory (shm, --registered on)
/// each rank reads the peers' gradients with plain loads, no system call and no copy between.
template <class Transport, class Make, class C>
int train(const rank_of_job<Transport, Make>& me, C compressor,
          const squall::compressor_choice& choice, const settings& s,
          const fashion_mnist::dataset& data, std::size_t train_count, std::size_t test_count) {
  using comm_type = squall::communicator<Transport, squall::ring_topology, C>;
  using dense_type = squall::communicator<Transport, squall::automatic_topology>;
  using state_type = typename comm_type::template state_type<float>;
  constexpr bool dense = std::is_same_v<C, squall::identity_compressor>;
  const fashion_mnist::mlp model{.hidden = s.hidden};
  // a NaN or infinity in a gradient stops every rank at once, naming it, before it can enter
  // a payload, the sum or an error-feedback residual
  const squall::options opts{.check_finite = true};
  dense_type dense_comm(me.make("dense"), {}, opts);
  // one compressing communicator per weight matrix, so that PowerSGD sees each as its layer's
  // matrix (none for `none`)
  C c1 = compressor, c2 = compressor;
  set_columns(c1, model.hidden);
  set_columns(c2, model.classes);
  // FetchSGD keeps the momentum in sketch space, after the sum: it gets --momentum, and the
  // tensors it compresses take its result as the step (no velocity of their own)
  constexpr bool sketch_momentum = requires { c1.momentum = 0.9; };
  if constexpr (sketch_momentum) c1.momentum = c2.momentum = static_cast<double>(s.momentum);
  std::optional<comm_type> comm1, comm2;
  if constexpr (!dense) {
    const squall::collective_tuning tuning = choice.tuned({});
    comm1.emplace(me.make("w1"), squall::ring_topology{}, c1, opts, tuning);
    comm2.emplace(me.make("w2"), squall::ring_topology{}, c2, opts, tuning);
  }
  // A tensor whose fixed-size payload is not smaller than its dense bytes goes dense: a
  // 3 x 4096 count sketch of W2's 2,560 values would send 4.8 times their bytes.
  const auto worth = [&](const std::optional<comm_type>& comm, std::size_t count) {
    if constexpr (dense)
      return false;
    else if constexpr (!squall::compression_traits<squall::inner_compressor_t<C>>::fixed_size)
      return true;
    else if constexpr (requires {
                         squall::inner_of(comm->compressor())
                             .max_payload_bytes(squall::dtype::float32, count, 1u);
                       })  // hq: its size on these ranks, not its bound for any number
      return squall::inner_of(comm->compressor())
                 .max_payload_bytes(squall::dtype::float32, count,
                                    static_cast<std::uint32_t>(comm->size())) <
             count * sizeof(float);
    else
      return comm->compressor().max_payload_bytes(squall::dtype::float32, count) <
             count * sizeof(float);
  };
  // Momentum: with error feedback each rank keeps its own velocity and compresses that (the
  // loop's comment says why); DGC's masking for the sparse-set compressors (the ones gTop-k
  // merges) and count sketch's two rounds (Sketched-SGD zeroes the momentum it sent), with
  // error feedback.
  constexpr bool local_momentum = squall::is_error_feedback<C>;
  constexpr squall::aggregation_set allowed = squall::compression_traits<C>::aggregations;
  constexpr bool masks = local_momentum && (allowed.contains(squall::aggregation::gtopk) ||
                                            allowed.contains(squall::aggregation::two_round));
  exchange::facts f;
  f.label = choice.text;
  f.local_momentum = local_momentum;
  f.sketch_momentum = sketch_momentum;
  f.masks = masks;
  // W1 as `pieces` blocks of rows, each reduced on its own, with its own state (with
  // --overlap K, K pieces, each started as soon as backward has it; else one, the matrix)
  const std::size_t pieces = std::max<std::size_t>(s.overlap, 1);
  std::vector<state_type> w1_states;
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t from = fashion_mnist::w1_row(model, k, pieces) * model.hidden;
    const std::size_t count = fashion_mnist::w1_row(model, k + 1, pieces) * model.hidden - from;
    const bool compress = worth(comm1, count);
    f.w1.push_back({from, count, compress});
    if constexpr (!dense)
      w1_states.push_back(comm1->template make_state<float>(compress ? count : 0));
  }
  f.compress_w2 = worth(comm2, model.w2_count());
  std::optional<state_type> state2;
  if constexpr (!dense)
    state2.emplace(comm2->template make_state<float>(f.compress_w2 ? model.w2_count() : 0));
  C ratio_of = compressor;
  if (const double* ratio = topk_ratio(ratio_of)) {
    f.has_ratio = true;
    f.target_ratio = *ratio;
  }
  // The flat gradient: in the dense communicator's registered memory where the transport has
  // it (collective: every rank allocates it, the same size, here), else on the heap.
  std::vector<float> heap_gradients;
  std::optional<squall::registered_buffer<float>> registered_gradients;
  if constexpr (squall::registered_memory_transport<Transport>) {
    if (s.registered.value_or(true))
      registered_gradients =
          dense_comm.transport().template allocate<float>(model.parameter_count());
  }
  if (registered_gradients) {
    f.gradients = std::span(registered_gradients->data(), registered_gradients->size());
    f.registered = true;
  } else {
    heap_gradients.resize(model.parameter_count());
    f.gradients = heap_gradients;
  }

  class of_communicators final : public exchange {
   public:
    of_communicators(dense_type& dense_comm, std::optional<comm_type>& comm1,
                     std::optional<comm_type>& comm2, std::vector<state_type>& w1_states,
                     std::optional<state_type>& state2, const facts& f)
        : dense_(dense_comm),
          comm1_(comm1),
          comm2_(comm2),
          w1_states_(w1_states),
          state2_(state2),
          f_(f) {}

    void reduce(part which, std::size_t k, std::span<float> g, bool start) override {
      const squall::host_view<float> view(g.data(), g.size());
      if constexpr (!dense) {
        const bool w1 = which == part::w1_rows && f_.w1[k].compress;
        if (w1 || (which == part::w2 && f_.compress_w2)) {
          comm_type& comm = w1 ? *comm1_ : *comm2_;
          state_type& state = w1 ? w1_states_[k] : *state2_;
          if (start)
            pending_.push_back(comm.iallreduce(view, state, squall::avg_op{}));
          else
            comm.allreduce(view, state, squall::avg_op{});
          return;
        }
      }
      if (start)
        pending_.push_back(dense_.iallreduce(view, squall::avg_op{}));
      else
        dense_.allreduce(view, squall::avg_op{});
    }
    void finish() override {
      for (squall::request& r : pending_) r.wait();
      pending_.clear();
    }
    std::uint64_t bytes_sent() const override {
      std::uint64_t sent = dense_.bytes_sent_total();
      if constexpr (!dense) sent += comm1_->bytes_sent_total() + comm2_->bytes_sent_total();
      return sent;
    }
    double across(double v, bool sum) override {
      if (sum)
        dense_.allreduce(squall::host_view<double>(&v, 1), squall::sum_op{});
      else
        dense_.allreduce(squall::host_view<double>(&v, 1), squall::max_op{});
      return v;
    }
    void max_over_ranks(std::vector<float>& v) override {
      dense_.allreduce(squall::host_view<float>(v), squall::max_op{});
    }
    void set_ratio(double ratio) override {
      if constexpr (!dense) {
        for (comm_type* comm : {&*comm1_, &*comm2_}) {
          C c = comm->compressor();
          if (double* r = topk_ratio(c)) *r = ratio;
          comm->set_compressor(c);
        }
      }
    }
    void mask_sent(float* velocity) override {
      if constexpr (masks) {
        for (std::size_t k = 0; k < f_.w1.size(); ++k)
          mask(w1_states_[k], velocity + f_.w1[k].from, f_.w1[k].compress);
        mask(*state2_, velocity + f_.w1.back().from + f_.w1.back().count, f_.compress_w2);
      }
    }

   private:
    // Where this rank sent its value (the residual is exactly 0 there after a top-k encode or
    // count sketch's second round; threshold sends +-tau and leaves a remainder, so it is not
    // masked), its velocity starts again from 0, so that stale momentum is not sent twice.
    static void mask(state_type& state, float* v, bool compressed) {
      if constexpr (masks) {
        if (!compressed) return;
        const auto r = state.residual().residual();
        for (std::size_t i = 0; i < r.count(); ++i) {
          if (r.data()[i] == 0.0f) v[i] = 0.0f;
        }
      }
    }

    dense_type& dense_;
    std::optional<comm_type>& comm1_;
    std::optional<comm_type>& comm2_;
    std::vector<state_type>& w1_states_;
    std::optional<state_type>& state2_;
    const facts& f_;
    std::vector<squall::request> pending_;  // with --overlap: this step's allreduces in flight
  } ex(dense_comm, comm1, comm2, w1_states, state2, f);
  return train_loop(me.rank, me.size, ex, f, s, data, train_count, test_count);
}

}  // namespace fashion_mnist
