// SPDX-License-Identifier: Apache-2.0
// train_fashion_mnist's training loop, compiled once: the communicators of each transport and
// compressor are behind `exchange` (fashion_mnist/train.hpp).
#include "fashion_mnist/train.hpp"

namespace fashion_mnist {

int train_loop(int rank, int size, exchange& ex, const exchange::facts& f, const settings& s,
               const dataset& data, std::size_t train_count, std::size_t test_count) {
  const fashion_mnist::mlp model{.hidden = s.hidden};
  // the name printed and written to the CSV: the compressor's, its warm-up and a learning rate
  // or momentum other than the default (so that runs at several settings summarize apart)
  const bool warms = s.sparsity_warmup > 0 && f.has_ratio && f.target_ratio < 0.25;
  char rate[64] = "";
  if (s.lr != default_lr || s.momentum != default_momentum) {
    std::snprintf(rate, sizeof rate,
                  s.momentum != default_momentum ? " lr %g momentum %g" : " lr %g",
                  static_cast<double>(s.lr), static_cast<double>(s.momentum));
  }
  const std::size_t pieces = f.w1.size();
  const std::string label =
      f.label + (warms ? " warm-up " + std::to_string(s.sparsity_warmup) : std::string()) + rate +
      (s.overlap > 0 ? " overlap " + std::to_string(s.overlap) : std::string()) +
      (s.registered == false ? " registered off" : "");
  if (rank == 0) {
    std::printf("# %s: W1 (%zu values%s) %s, W2 (%zu) %s, biases (%zu) dense; gradients in %s\n",
                label.c_str(), model.w1_count(),
                s.overlap > 0 ? (", " + std::to_string(pieces) + " pieces").c_str() : "",
                f.w1.front().compress ? "compressed" : "dense", model.w2_count(),
                f.compress_w2 ? "compressed" : "dense", model.bias_count(),
                f.registered ? "registered memory" : "heap memory");
  }
  // Momentum: with error feedback each rank keeps its own velocity and compresses that, the
  // residual holding what it has not sent yet (DGC's momentum correction, Lin et al., ICLR
  // 2018), so that what is sent over the steps adds up to the dense run's velocities; without,
  // the velocity of the averaged gradient (an unbiased quantizer's noise is not multiplied by
  // 1 / (1 - momentum)). For the dense allreduce the two are the same sums.
  const bool local_momentum = f.local_momentum;
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
  const std::span<float> grads = f.gradients;  // registered memory, or the heap
  std::vector<float> velocity(params.size(), 0.0f);
  fashion_mnist::workspace ws;
  const std::size_t per_step = s.batch * static_cast<std::size_t>(size);
  const std::size_t steps = train_count / per_step;
  if (steps == 0) throw squall::invalid_argument({}, "fewer training images than one global batch");
  std::vector<std::size_t> order(train_count);
  std::vector<float> batch_x(s.batch * model.inputs);
  std::vector<std::uint8_t> batch_y(s.batch);
  std::uint64_t wire_bytes = 0;  // this rank's, for the gradients, since the start
  double comm_seconds = 0;       // this epoch's: in blocking allreduces or waiting for requests

  // The mean of gradient part `g` over the ranks (with error feedback, of this rank's velocity
  // of it): blocking, or (--overlap) started on the communicator's progress thread as soon as
  // backward has the part, waited for before the update.
  const auto reduce = [&](fashion_mnist::part part, std::size_t k, std::span<float> g) {
    if (local_momentum) {
      float* v = velocity.data() + (g.data() - grads.data());
      for (std::size_t i = 0; i < g.size(); ++i) {
        v[i] = s.momentum * v[i] + g[i];
        g[i] = v[i];
      }
    }
    if (s.overlap > 0) return ex.reduce(part, k, g, true);
    const auto start = clock_type::now();
    ex.reduce(part, k, g, false);
    comm_seconds += std::chrono::duration<double>(clock_type::now() - start).count();
  };

  bool diverged = false;
  double final_accuracy = 0;
  for (int epoch = 1; epoch <= s.epochs; ++epoch) {
    const auto epoch_start = clock_type::now();
    if (warms) ex.set_ratio(warmup_density(f.target_ratio, epoch, s.sparsity_warmup));
    comm_seconds = 0;
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 shuffle(s.seed * 1000003 + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), shuffle);  // the same order on every rank
    double loss_sum = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const std::size_t first = step * per_step + static_cast<std::size_t>(rank) * s.batch;
      for (std::size_t b = 0; b < s.batch; ++b) {
        const std::size_t img = order[first + b];
        std::copy_n(data.train.values.data() + img * model.inputs, model.inputs,
                    batch_x.data() + b * model.inputs);
        batch_y[b] = data.train.labels[img];
      }
      loss_sum += fashion_mnist::forward(model, params, batch_x.data(), batch_y.data(), s.batch, ws)
                      .loss_sum;
      const std::uint64_t sent_before = ex.bytes_sent();
      fashion_mnist::backward(
          model, params, batch_x.data(), batch_y.data(), s.batch, ws, grads, pieces,
          [&](fashion_mnist::part part, std::size_t k) {
            switch (part) {
              case fashion_mnist::part::w2:
                return reduce(part, k, model.w2(grads));
              case fashion_mnist::part::w1_rows:
                return reduce(part, k, std::span(grads.data() + f.w1[k].from, f.w1[k].count));
              case fashion_mnist::part::biases:
                return reduce(part, k, model.biases(grads));
            }
          });
      if (s.overlap > 0) {
        const auto start = clock_type::now();
        ex.finish();
        comm_seconds += std::chrono::duration<double>(clock_type::now() - start).count();
      }
      wire_bytes += ex.bytes_sent() - sent_before;
      if (f.masks && s.masking) ex.mask_sent(velocity.data());
      const float lr = learning_rate(epoch - 1, step, steps);
      // FetchSGD's results are the steps themselves (its momentum is in the sketches)
      const auto apply = [&](std::size_t from, std::size_t to, bool stepped) {
        for (std::size_t i = from; i < to; ++i) {
          if (stepped) {
            params[i] -= lr * grads[i];
            continue;
          }
          if (!local_momentum) velocity[i] = s.momentum * velocity[i] + grads[i];
          params[i] -= lr * (local_momentum ? grads[i] : velocity[i]);
        }
      };
      const std::size_t w2_end = model.w1_count() + model.w2_count();
      for (const exchange::piece& piece : f.w1)
        apply(piece.from, piece.from + piece.count, f.sketch_momentum && piece.compress);
      apply(model.w1_count(), w2_end, f.sketch_momentum && f.compress_w2);
      apply(w2_end, params.size(), false);
    }
    // the test images, split across the ranks
    const std::size_t lo =
        test_count * static_cast<std::size_t>(rank) / static_cast<std::size_t>(size);
    const std::size_t hi =
        test_count * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(size);
    std::size_t correct = 0;
    for (std::size_t at = lo; at < hi; at += 256) {
      const std::size_t n = std::min<std::size_t>(256, hi - at);
      correct += fashion_mnist::forward(model, params, data.test.values.data() + at * model.inputs,
                                        data.test.labels.data() + at, n, ws)
                     .correct;
    }
    const double wall = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    const double loss = ex.across(loss_sum, true) / static_cast<double>(steps * per_step);
    const double accuracy =
        ex.across(static_cast<double>(correct), true) / static_cast<double>(test_count);
    const double wall_max = ex.across(wall, false);
    const double comm_max = ex.across(comm_seconds, false);
    const double bytes_max = ex.across(static_cast<double>(wire_bytes), false);
    diverged = !std::isfinite(loss);
    final_accuracy = accuracy;
    if (rank == 0) {
      std::printf(
          "%-22s epoch %2d  loss %.4f  test accuracy %6.2f%%  wall %6.2f s  comm %6.2f s  "
          "wire %10.3f MB/rank\n",
          label.c_str(), epoch, loss, 100 * accuracy, wall_max, comm_max, bytes_max / 1e6);
      std::fflush(stdout);
      if (!s.csv.empty()) {
        std::FILE* file = std::fopen(s.csv.c_str(), "a");
        if (file == nullptr) throw std::runtime_error("cannot append to " + s.csv);
        std::fprintf(file, "%s,%d,%zu,%d,%.6f,%.6f,%.4f,%.4f,%.0f\n", label.c_str(), size, s.batch,
                     epoch, loss, accuracy, wall_max, comm_max, bytes_max);
        std::fclose(file);
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
  ex.max_over_ranks(highest);
  const bool same = std::memcmp(highest.data(), params.data(), params.size() * sizeof(float)) == 0;
  const double differing = ex.across(same ? 0.0 : 1.0, true);
  if (rank == 0) {
    std::printf("%-22s weights identical on all %d ranks: %s\n", label.c_str(), size,
                differing == 0 ? "yes" : "NO");
  }
  if (differing != 0) return 3;
  if (final_accuracy < s.require_accuracy) {
    if (rank == 0) {
      std::printf("%-22s final test accuracy %.2f%% is below --require-accuracy %.2f%%\n",
                  label.c_str(), 100 * final_accuracy, 100 * s.require_accuracy);
    }
    return 4;
  }
  return 0;
}

}  // namespace fashion_mnist
