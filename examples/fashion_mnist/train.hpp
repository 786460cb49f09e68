// SPDX-License-Identifier: Apache-2.0
#pragma once
// The training of train_fashion_mnist.cpp: its settings, one rank's training loop (templated on
// the transport and the compressor) and the two runners that visit every --compressor, one
// translation unit per transport (train_shm.cpp, train_mpi.cpp), compiled side by side: each
// instantiates the loop for every compressor.
#include <squall/compress/by_name.hpp>
#include <squall/squall.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>  // memcmp
#include <numeric>
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
  bool cosine = true;       // --schedule cosine|constant
  double warmup = 0;        // --warmup EPOCHS
  bool masking = true;      // --masking on|off
  int sparsity_warmup = 0;  // --sparsity-warmup EPOCHS (DGC)
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

/// Who this rank is, and how it makes a transport for each of its two communicators.
template <class Transport, class Make>
struct rank_of_job {
  int rank = 0;
  int size = 1;
  Make make;  // Transport make(std::string_view part): "w1" or "w2"
};

/// One rank's training with compressor C; returns its exit code: 0, 3 if the ranks' weights
/// differ, 4 if the final test accuracy is below --require-accuracy.
template <class Transport, class Make, class C>
int train(const rank_of_job<Transport, Make>& me, C compressor,
          const squall::compressor_choice& choice, const settings& s,
          const fashion_mnist::dataset& data, std::size_t train_count, std::size_t test_count) {
  using comm_type = squall::communicator<Transport, squall::ring_topology, C>;
  constexpr bool dense = std::is_same_v<C, squall::identity_compressor>;
  const fashion_mnist::mlp model{.hidden = s.hidden};
  const squall::collective_tuning tuning = choice.tuned({});
  // one communicator per weight matrix, so that PowerSGD sees each as its layer's matrix
  C c1 = compressor, c2 = compressor;
  set_columns(c1, model.hidden);
  set_columns(c2, model.classes);
  // FetchSGD keeps the momentum in sketch space, after the sum: it gets --momentum, and the
  // tensors it compresses take its result as the step (no velocity of their own)
  constexpr bool sketch_momentum = requires { c1.momentum = 0.9; };
  if constexpr (sketch_momentum) c1.momentum = c2.momentum = static_cast<double>(s.momentum);
  // a NaN or infinity in a gradient stops every rank at once, naming it, before it can enter
  // a payload, the sum or an error-feedback residual
  const squall::options opts{.check_finite = true};
  comm_type comm1(me.make("w1"), {}, c1, opts, tuning);
  comm_type comm2(me.make("w2"), {}, c2, opts, tuning);
  // A tensor whose fixed-size payload is not smaller than its dense bytes goes dense: a
  // 3 x 4096 count sketch of W2's 2,560 values would send 4.8 times their bytes.
  const auto worth = [&](const comm_type& comm, std::size_t count) {
    if constexpr (dense)
      return false;
    else if constexpr (!squall::compression_traits<squall::inner_compressor_t<C>>::fixed_size)
      return true;
    else if constexpr (requires {
                         squall::inner_of(comm.compressor())
                             .max_payload_bytes(squall::dtype::float32, count, 1u);
                       })  // hq: its size on these ranks, not its bound for any number
      return squall::inner_of(comm.compressor())
                 .max_payload_bytes(squall::dtype::float32, count,
                                    static_cast<std::uint32_t>(comm.size())) <
             count * sizeof(float);
    else
      return comm.compressor().max_payload_bytes(squall::dtype::float32, count) <
             count * sizeof(float);
  };
  // W1 as `pieces` blocks of rows, each reduced on its own, with its own state (with
  // --overlap K, K pieces, each started as soon as backward has it; else one, the matrix)
  struct w1_piece {
    std::size_t from = 0, count = 0;  // in the flat gradient
    bool compress = false;
    typename comm_type::template state_type<float> state;
  };
  const std::size_t pieces = std::max<std::size_t>(s.overlap, 1);
  std::vector<w1_piece> w1_pieces;
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t from = fashion_mnist::w1_row(model, k, pieces) * model.hidden;
    const std::size_t count = fashion_mnist::w1_row(model, k + 1, pieces) * model.hidden - from;
    const bool compress = worth(comm1, count);
    w1_pieces.push_back(
        {from, count, compress, comm1.template make_state<float>(compress ? count : 0)});
  }
  const bool compress1 = w1_pieces.front().compress;
  const bool compress2 = worth(comm2, model.w2_count());
  auto state2 = comm2.template make_state<float>(compress2 ? model.w2_count() : 0);

  C warm_template = compressor;
  const double* target_ratio = topk_ratio(warm_template);
  const double target = target_ratio != nullptr ? *target_ratio : 0;
  // the name printed and written to the CSV: the compressor's, its warm-up and a learning rate
  // or momentum other than the default (so that runs at several settings summarize apart)
  const bool warms = s.sparsity_warmup > 0 && target_ratio != nullptr && target < 0.25;
  char rate[64] = "";
  if (s.lr != default_lr || s.momentum != default_momentum) {
    std::snprintf(rate, sizeof rate,
                  s.momentum != default_momentum ? " lr %g momentum %g" : " lr %g",
                  static_cast<double>(s.lr), static_cast<double>(s.momentum));
  }
  const std::string label =
      choice.text + (warms ? " warm-up " + std::to_string(s.sparsity_warmup) : std::string()) +
      rate + (s.overlap > 0 ? " overlap " + std::to_string(s.overlap) : std::string());
  if (me.rank == 0) {
    std::printf("# %s: W1 (%zu values%s) %s, W2 (%zu) %s, biases (%zu) dense\n", label.c_str(),
                model.w1_count(),
                s.overlap > 0 ? (", " + std::to_string(pieces) + " pieces").c_str() : "",
                compress1 ? "compressed" : "dense", model.w2_count(),
                compress2 ? "compressed" : "dense", model.bias_count());
  }
  // Momentum: with error feedback each rank keeps its own velocity and compresses that, the
  // residual holding what it has not sent yet (DGC's momentum correction, Lin et al., ICLR
  // 2018), so that what is sent over the steps adds up to the dense run's velocities; without,
  // the velocity of the averaged gradient (an unbiased quantizer's noise is not multiplied by
  // 1 / (1 - momentum)). For the dense allreduce the two are the same sums.
  constexpr bool local_momentum = squall::is_error_feedback<C>;
  // DGC's momentum factor masking (sparse-class compressors with error feedback): where this
  // rank sent its value (the residual is exactly 0 there after a top-k encode; threshold sends
  // +-tau and leaves a remainder, so it is not masked), its velocity starts again from 0, so
  // that stale momentum is not sent twice.
  const auto mask_sent = [&](auto& state, float* v, bool compressed) {
    if constexpr (local_momentum) {
      if (!compressed) return;
      const auto r = state.residual().residual();
      for (std::size_t i = 0; i < r.count(); ++i) {
        if (r.data()[i] == 0.0f) v[i] = 0.0f;
      }
    }
  };
  // Per step: a linear warm-up from 0 over the first `warmup` epochs (Goyal et al., 2017),
  // then cosine decay to 0 (Loshchilov and Hutter, SGDR, 2017), or constant.
  const auto learning_rate = [&](int epoch, std::size_t step, std::size_t steps) {
    const double at =
        static_cast<double>(epoch) * static_cast<double>(steps) + static_cast<double>(step) + 1;
    const double warm = s.warmup * static_cast<double>(steps);
    if (at < warm) return static_cast<float>(s.lr * at / warm);
    if (!s.cosine) return s.lr;
    const double t =
        (at - warm) / (static_cast<double>(s.epochs) * static_cast<double>(steps) - warm + 1);
    return static_cast<float>(0.5 * s.lr * (1 + std::cos(3.141592653589793 * t)));
  };
  std::vector<float> params = model.initial_parameters(s.seed);
  std::vector<float> grads(params.size()), velocity(params.size(), 0.0f);
  fashion_mnist::workspace ws;
  const std::size_t per_step = s.batch * static_cast<std::size_t>(me.size);
  const std::size_t steps = train_count / per_step;
  if (steps == 0) throw squall::invalid_argument({}, "fewer training images than one global batch");
  std::vector<std::size_t> order(train_count);
  std::vector<float> batch_x(s.batch * model.inputs);
  std::vector<std::uint8_t> batch_y(s.batch);
  std::uint64_t wire_bytes = 0;  // this rank's, for the gradients, since the start
  double comm_seconds = 0;       // this epoch's: in blocking allreduces or waiting for requests
  std::vector<squall::request> pending;  // with --overlap: this step's allreduces in flight

  // The mean of gradient part `g` over the ranks (with error feedback, of this rank's velocity
  // of it): blocking, or (--overlap) started on the communicator's progress thread as soon as
  // backward has the part, waited for before the update. `state` is unused when not `compress`.
  auto reduce = [&](comm_type& comm, std::span<float> g, auto& state, bool compress) {
    if constexpr (local_momentum) {
      float* v = velocity.data() + (g.data() - grads.data());
      for (std::size_t i = 0; i < g.size(); ++i) {
        v[i] = s.momentum * v[i] + g[i];
        g[i] = v[i];
      }
    }
    const squall::host_view<float> view(g.data(), g.size());
    if (s.overlap > 0) {
      if constexpr (!dense) {
        if (compress) {
          pending.push_back(comm.iallreduce(view, state, squall::avg_op{}));
          return;
        }
      }
      pending.push_back(comm.iallreduce(view, squall::avg_op{}));
      return;
    }
    const auto start = clock_type::now();
    if constexpr (dense)
      comm.allreduce(view, squall::avg_op{});
    else if (compress)
      comm.allreduce(view, state, squall::avg_op{});
    else
      comm.allreduce(view, squall::avg_op{});
    comm_seconds += std::chrono::duration<double>(clock_type::now() - start).count();
  };
  auto across = [&](double v, bool sum) {
    if (sum)
      comm1.allreduce(squall::host_view<double>(&v, 1), squall::sum_op{});
    else
      comm1.allreduce(squall::host_view<double>(&v, 1), squall::max_op{});
    return v;
  };

  bool diverged = false;
  double final_accuracy = 0;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    const auto epoch_start = clock_type::now();
    if (warms) {  // every rank alike, between calls
      for (comm_type* comm : {&comm1, &comm2}) {
        C c = comm->compressor();
        *topk_ratio(c) = warmup_density(target, epoch, s.sparsity_warmup);
        comm->set_compressor(c);
      }
    }
    comm_seconds = 0;
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 shuffle(s.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle);  // the same order on every rank
    double loss_sum = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t first = step * per_step + static_cast<std::size_t>(me.rank) * s.batch;
      for (std::size_t b = 0; b < s.batch; ++b) {
        const std::size_t img = order[first + b];
        std::copy_n(data.train.values.data() + img * model.inputs, model.inputs,
                    batch_x.data() + b * model.inputs);
        batch_y[b] = data.train.labels[img];
      }
      loss_sum += fashion_mnist::forward(model, params, batch_x.data(), batch_y.data(), s.batch, ws)
                      .loss_sum;
      const std::uint64_t sent_before = comm1.bytes_sent_total() + comm2.bytes_sent_total();
      fashion_mnist::backward(model, params, batch_x.data(), batch_y.data(), s.batch, ws, grads,
                              pieces, [&](fashion_mnist::part part, std::size_t k) {
                                switch (part) {
                                  case fashion_mnist::part::w2:
                                    return reduce(comm2, model.w2(grads), state2, compress2);
                                  case fashion_mnist::part::w1_rows: {
                                    w1_piece& piece = w1_pieces[k];
                                    return reduce(comm1,
                                                  std::span(grads.data() + piece.from, piece.count),
                                                  piece.state, piece.compress);
                                  }
                                  case fashion_mnist::part::biases:
                                    return reduce(comm1, model.biases(grads), state2, false);
                                }
                              });
      if (!pending.empty()) {
        const auto start = clock_type::now();
        for (squall::request& r : pending) r.wait();
        pending.clear();
        comm_seconds += std::chrono::duration<double>(clock_type::now() - start).count();
      }
      wire_bytes += comm1.bytes_sent_total() + comm2.bytes_sent_total() - sent_before;
      // the sparse-set compressors (topk, threshold): the ones gTop-k merges
      if constexpr (local_momentum && squall::compression_traits<C>::aggregations.contains(
                                          squall::aggregation::gtopk)) {
        if (s.masking) {
          for (w1_piece& piece : w1_pieces)
            mask_sent(piece.state, velocity.data() + piece.from, piece.compress);
          mask_sent(state2, velocity.data() + model.w1_count(), compress2);
        }
      }
      const float lr = learning_rate(epoch - 1, step, steps);
      // FetchSGD's results are the steps themselves (its momentum is in the sketches)
      const auto apply = [&](std::size_t from, std::size_t to, bool stepped) {
        for (std::size_t i = from; i < to; ++i) {
          if (stepped) {
            params[i] -= lr * grads[i];
            continue;
          }
          if constexpr (!local_momentum) velocity[i] = s.momentum * velocity[i] + grads[i];
          params[i] -= lr * (local_momentum ? grads[i] : velocity[i]);
        }
      };
      const std::size_t w2_end = model.w1_count() + model.w2_count();
      for (const w1_piece& piece : w1_pieces)
        apply(piece.from, piece.from + piece.count, sketch_momentum && piece.compress);
      apply(model.w1_count(), w2_end, sketch_momentum && compress2);
      apply(w2_end, params.size(), false);
    }
    // the test images, split across the ranks
    const std::size_t lo =
        test_count * static_cast<std::size_t>(me.rank) / static_cast<std::size_t>(me.size);
    const std::size_t hi =
        test_count * static_cast<std::size_t>(me.rank + 1) / static_cast<std::size_t>(me.size);
    std::size_t correct = 0;
    for (std::size_t at = lo; at < hi; at += 256) {
      const std::size_t n = std::min<std::size_t>(256, hi - at);
      correct += fashion_mnist::forward(model, params, data.test.values.data() + at * model.inputs,
                                        data.test.labels.data() + at, n, ws)
                     .correct;
    }
    const double wall = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    const double loss = across(loss_sum, true) / static_cast<double>(steps * per_step);
    const double accuracy =
        across(static_cast<double>(correct), true) / static_cast<double>(test_count);
    const double wall_max = across(wall, false);
    const double comm_max = across(comm_seconds, false);
    const double bytes_max = across(static_cast<double>(wire_bytes), false);
    diverged = !std::isfinite(loss);
    final_accuracy = accuracy;
    if (me.rank == 0) {
      std::printf(
          "%-22s epoch %2d  loss %.4f  test accuracy %6.2f%%  wall %6.2f s  comm %6.2f s  "
          "wire %10.3f MB/rank\n",
          label.c_str(), epoch, loss, 100 * accuracy, wall_max, comm_max, bytes_max / 1e6);
      std::fflush(stdout);
      if (!s.csv.empty()) {
        std::FILE* f = std::fopen(s.csv.c_str(), "a");
        if (f == nullptr) throw std::runtime_error("cannot append to " + s.csv);
        std::fprintf(f, "%s,%d,%zu,%d,%.6f,%.6f,%.4f,%.4f,%.0f\n", label.c_str(), me.size, s.batch,
                     epoch, loss, accuracy, wall_max, comm_max, bytes_max);
        std::fclose(f);
      }
      if (diverged) {
        std::printf("%-22s diverged (the training loss is not finite): stopping this run\n",
                    label.c_str());
      }
    }
    if (diverged) break;  // every rank saw the same summed loss; a finding, not a failure
  }
  if (diverged) return final_accuracy < s.require_accuracy ? 4 : 0;
  // every rank holds the same weights: compare with the elementwise max over ranks
  std::vector<float> highest = params;
  comm1.allreduce(squall::host_view<float>(highest), squall::max_op{});
  const bool same = std::memcmp(highest.data(), params.data(), params.size() * sizeof(float)) == 0;
  const double differing = across(same ? 0.0 : 1.0, true);
  if (me.rank == 0) {
    std::printf("%-22s weights identical on all %d ranks: %s\n", label.c_str(), me.size,
                differing == 0 ? "yes" : "NO");
  }
  if (differing != 0) return 3;
  if (final_accuracy < s.require_accuracy) {
    if (me.rank == 0) {
      std::printf("%-22s final test accuracy %.2f%% is below --require-accuracy %.2f%%\n",
                  label.c_str(), 100 * final_accuracy, 100 * s.require_accuracy);
    }
    return 4;
  }
  return 0;
}

}  // namespace fashion_mnist
