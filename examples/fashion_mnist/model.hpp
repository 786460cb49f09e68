// SPDX-License-Identifier: Apache-2.0
// A fully connected network 784-H-10 (ReLU, softmax cross-entropy), forward and backward over
// a mini-batch as matrix products through CBLAS (OpenBLAS on Debian). Every parameter lives in
// one flat vector, [W1 | W2 | b1 | b2], and so does its gradient, so that the training loop
// reduces the two weight matrices and the biases as three views of one buffer.
#pragma once

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace fashion_mnist {

struct mlp {
  std::size_t inputs = 784;
  std::size_t hidden = 256;
  std::size_t classes = 10;

  std::size_t w1_count() const { return inputs * hidden; }
  std::size_t w2_count() const { return hidden * classes; }
  std::size_t bias_count() const { return hidden + classes; }
  std::size_t parameter_count() const { return w1_count() + w2_count() + bias_count(); }

  // views of a flat parameter (or gradient) vector
  template <class V>
  auto w1(V& p) const {
    return std::span(p.data(), w1_count());
  }
  template <class V>
  auto w2(V& p) const {
    return std::span(p.data() + w1_count(), w2_count());
  }
  template <class V>
  auto biases(V& p) const {
    return std::span(p.data() + w1_count() + w2_count(), bias_count());
  }

  /// He-initialized weights (normal, variance 2 / fan-in), zero biases; the same on every rank
  /// for the same seed.
  std::vector<float> initial_parameters(std::uint64_t seed) const {
    std::vector<float> p(parameter_count(), 0.0f);
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / static_cast<float>(inputs)));
    for (float& w : w1(p)) w = n1(gen);
    std::normal_distribution<float> n2(0.0f, std::sqrt(2.0f / static_cast<float>(hidden)));
    for (float& w : w2(p)) w = n2(gen);
    return p;
  }
};

/// The activations of one batch, kept between forward and backward.
struct workspace {
  std::vector<float> z1, a1, z2;  // B x H, B x H, B x C (z2 becomes the softmax)
  std::vector<float> d1;          // B x H
  void resize(const mlp& m, std::size_t batch) {
    z1.resize(batch * m.hidden);
    a1.resize(batch * m.hidden);
    z2.resize(batch * m.classes);
    d1.resize(batch * m.hidden);
  }
};

/// What one forward pass found: the summed cross-entropy and the count of right answers.
struct batch_result {
  double loss_sum = 0;
  std::size_t correct = 0;
};

/// Forward over `batch` rows of `x` (batch x inputs); leaves the softmax in `ws.z2`.
inline batch_result forward(const mlp& m, const std::vector<float>& p, const float* x,
                            const std::uint8_t* labels, std::size_t batch, workspace& ws) {
  ws.resize(m, batch);
  const int b = static_cast<int>(batch), n = static_cast<int>(m.inputs),
            h = static_cast<int>(m.hidden), c = static_cast<int>(m.classes);
  const float* w1 = p.data();
  const float* w2 = w1 + m.w1_count();
  const float* b1 = w2 + m.w2_count();
  const float* b2 = b1 + m.hidden;
  // z1 = x W1 + b1; a1 = relu(z1)
  for (std::size_t r = 0; r < batch; ++r) std::copy(b1, b1 + m.hidden, ws.z1.data() + r * m.hidden);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, h, n, 1.0f, x, n, w1, h, 1.0f,
              ws.z1.data(), h);
  for (std::size_t i = 0; i < ws.z1.size(); ++i) ws.a1[i] = std::max(ws.z1[i], 0.0f);
  // z2 = a1 W2 + b2, then softmax in place
  for (std::size_t r = 0; r < batch; ++r)
    std::copy(b2, b2 + m.classes, ws.z2.data() + r * m.classes);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, c, h, 1.0f, ws.a1.data(), h, w2, c,
              1.0f, ws.z2.data(), c);
  batch_result out;
  for (std::size_t r = 0; r < batch; ++r) {
    float* z = ws.z2.data() + r * m.classes;
    const float top = *std::max_element(z, z + m.classes);
    double total = 0;
    for (std::size_t k = 0; k < m.classes; ++k) total += std::exp(static_cast<double>(z[k] - top));
    const std::size_t guess = static_cast<std::size_t>(std::max_element(z, z + m.classes) - z);
    out.correct += guess == labels[r] ? 1 : 0;
    out.loss_sum += std::log(total) - static_cast<double>(z[labels[r]] - top);
    for (std::size_t k = 0; k < m.classes; ++k) {
      z[k] = static_cast<float>(std::exp(static_cast<double>(z[k] - top)) / total);
    }
  }
  return out;
}

/// The parts of the gradient `backward` completes, in the order it completes them.
enum class part {
  w2,       ///< W2's gradient (the output layer's, first)
  w1_rows,  ///< rows [w1_row(k), w1_row(k + 1)) of W1's gradient, k = 0, 1, ...
  biases,   ///< both biases (last)
};

/// The first row of piece `k` of W1 (inputs x hidden) cut into `pieces` row blocks.
inline std::size_t w1_row(const mlp& m, std::size_t k, std::size_t pieces) {
  return m.inputs * k / pieces;
}

/// The gradient of the batch's mean cross-entropy into `g` (flat, like the parameters), from
/// the activations `forward` left in `ws`. `ready(part, k)` is called as each part is complete
/// (k: the piece of W1's rows, of `pieces`), so that its allreduce can start while the rest is
/// computed: the overlap of backward and communication that DDP and Horovod do.
template <class Ready>
void backward(const mlp& m, const std::vector<float>& p, const float* x, const std::uint8_t* labels,
              std::size_t batch, workspace& ws, std::span<float> g, std::size_t pieces,
              Ready&& ready) {
  const int b = static_cast<int>(batch), n = static_cast<int>(m.inputs),
            h = static_cast<int>(m.hidden), c = static_cast<int>(m.classes);
  const float* w2 = p.data() + m.w1_count();
  float* gw1 = g.data();
  float* gw2 = gw1 + m.w1_count();
  float* gb1 = gw2 + m.w2_count();
  float* gb2 = gb1 + m.hidden;
  // d2 = (softmax - onehot) / B, in place of z2
  float* d2 = ws.z2.data();
  const float inv = 1.0f / static_cast<float>(batch);
  for (std::size_t r = 0; r < batch; ++r) {
    d2[r * m.classes + labels[r]] -= 1.0f;
    for (std::size_t k = 0; k < m.classes; ++k) d2[r * m.classes + k] *= inv;
  }
  // gW2 = a1^T d2; gb2 = column sums of d2
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, c, b, 1.0f, ws.a1.data(), h, d2, c, 0.0f,
              gw2, c);
  ready(part::w2, std::size_t{0});
  std::fill(gb2, gb2 + m.classes, 0.0f);
  for (std::size_t r = 0; r < batch; ++r) {
    for (std::size_t k = 0; k < m.classes; ++k) gb2[k] += d2[r * m.classes + k];
  }
  // d1 = (d2 W2^T) * relu'(z1)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, h, c, 1.0f, d2, c, w2, c, 0.0f,
              ws.d1.data(), h);
  for (std::size_t i = 0; i < ws.d1.size(); ++i) {
    if (ws.z1[i] <= 0.0f) ws.d1[i] = 0.0f;
  }
  // gW1 = x^T d1, a block of rows (input pixels) at a time; gb1 = column sums of d1
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t from = w1_row(m, k, pieces), to = w1_row(m, k + 1, pieces);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(to - from), h, b, 1.0f,
                x + from, n, ws.d1.data(), h, 0.0f, gw1 + from * m.hidden, h);
    ready(part::w1_rows, k);
  }
  std::fill(gb1, gb1 + m.hidden, 0.0f);
  for (std::size_t r = 0; r < batch; ++r) {
    for (std::size_t k = 0; k < m.hidden; ++k) gb1[k] += ws.d1[r * m.hidden + k];
  }
  ready(part::biases, std::size_t{0});
}

}  // namespace fashion_mnist
