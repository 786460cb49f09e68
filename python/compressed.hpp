// SPDX-License-Identifier: Apache-2.0
#pragma once
// The compressed communicator of every compressor squall names, over `Transport`
// (squall_python.hpp); included by one translation unit per transport.
#include <squall/algorithm/communicator.hpp>
#include <squall/topology/automatic.hpp>

#include <memory>
#include <type_traits>
#include <utility>

#include "squall_python.hpp"

namespace squall::python {

template <class Comm>
class compressed final : public compressed_base {
  using state_type = typename Comm::template state_type<float>;
  struct state final : state_base {
    explicit state(state_type s) : s(std::move(s)) {}
    std::size_t count() const override { return s.count(); }
    std::uint64_t step() const override { return s.step(); }
    state_type s;
  };

 public:
  template <class... A>
  explicit compressed(A&&... a) : comm_(std::forward<A>(a)...) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::unique_ptr<state_base> make_state(std::size_t n, std::size_t columns) override {
    if (columns == 0) return std::make_unique<state>(comm_.template make_state<float>(n));
    if constexpr (uses_low_rank<typename Comm::compressor_type>) {
      return std::make_unique<state>(
          comm_.template make_state<float>(n, powersgd_shape::of(n, columns)));
    } else {
      throw invalid_argument({.operation = "squall.Communicator.make_state"},
                             "columns (a matrix view) is PowerSGD's; this compressor takes none");
    }
  }
  squall::request allreduce(float* data, std::size_t n, state_base& s, bool avg,
                            bool now) override {
    auto& st = dynamic_cast<state&>(s).s;
    const squall::host_view<float> v(data, n);
    if (!now) return avg ? comm_.iallreduce(v, st, squall::avg_op{}) : comm_.iallreduce(v, st);
    if (avg)
      comm_.allreduce(v, st, squall::avg_op{});
    else
      comm_.allreduce(v, st);
    return {};
  }
  squall::request barrier(bool now) override {
    if (!now) return comm_.ibarrier();
    comm_.barrier();
    return {};
  }
  std::uint64_t bytes_sent() const override { return comm_.bytes_sent_total(); }

 private:
  Comm comm_;
};

/// The compressed communicator `choice` names over `transport` (made by `make_transport()`).
template <class Transport, class MakeTransport>
std::unique_ptr<compressed_base> compressed_over(const compressor_choice& choice,
                                                 MakeTransport&& make_transport) {
  const collective_tuning tuning = choice.tuned({});
  return visit_compressor(choice, [&]<class C>(C c) -> std::unique_ptr<compressed_base> {
    if constexpr (std::is_same_v<C, identity_compressor>) {
      throw invalid_argument({.operation = "squall.Communicator"}, "'none' compresses nothing");
    } else {
      using comm = communicator<Transport, automatic_topology, C>;
      return std::make_unique<compressed<comm>>(make_transport(), automatic_topology{}, c,
                                                options{}, tuning);
    }
  });
}

}  // namespace squall::python
