// SPDX-License-Identifier: Apache-2.0
// The compressed allgather (communicator::allgather with a compression_state), ranks as
// threads over inproc_transport, 1 to 4 ranks: every rank bitwise the same; block q bitwise
// decode(encode(rank q's input)) computed serially with rank q's stream (through a serially
// kept residual with error feedback); counts 0, 1, P + 1, 1009; a wrong output size or state
// refused.
#include <squall/algorithm/communicator.hpp>
#include <squall/compress/cast.hpp>
#include <squall/compress/error_feedback.hpp>
#include <squall/compress/homomorphic.hpp>
#include <squall/compress/quantize.hpp>
#include <squall/compress/sketch.hpp>
#include <squall/compress/sparsify.hpp>
#include <squall/compress/state.hpp>
#include <squall/topology/direct.hpp>
#include <squall/topology/ring.hpp>
#include <squall/topology/tree.hpp>
#include <squall/transport/inproc.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/compressed_reference.hpp"
#include "../support/data.hpp"
#include "../support/deferred_backend.hpp"
#include "../support/thread_ranks.hpp"

namespace {

using squall::inproc_transport;
using squall::test::run_ranks;

constexpr squall::collective_tuning tiny_pieces{.chunk_bytes = 64, .pipeline_depth = 3};
constexpr squall::collective_tuning peer_memory{
    .chunk_bytes = 64, .pipeline_depth = 3, .peer_memory_bytes = 1, .window_copy_bytes = 0};

std::vector<float> input_of(int r, int s, std::size_t count) {
  auto v = squall::test::random_values<float>(
      count, 700 + 31 * static_cast<std::uint64_t>(r) + static_cast<std::uint64_t>(s));
  for (auto& x : v) x /= 8;
  return v;
}

/// Every rank's gathered output of each of `steps` steps, kernels on `Backend`.
template <class Topology, class C, class Backend>
std::vector<std::vector<std::vector<float>>> run_on(int p, const C& c, std::size_t count, int steps,
                                                    const squall::collective_tuning& tuning,
                                                    std::size_t window) {
  std::vector<std::vector<std::vector<float>>> outs(static_cast<std::size_t>(p));
  run_ranks(
      p,
      [&](inproc_transport& t) {
        const int r = t.rank();
        using comm_type = squall::communicator<inproc_transport, Topology, C, Backend>;
        comm_type comm(std::move(t), {}, c, {}, tuning);
        auto state = comm.template make_state<float>(count);
        for (int s = 0; s < steps; ++s) {
          const std::vector<float> in = input_of(r, s, count);
          std::vector<float> out(count * static_cast<std::size_t>(p), -1.0f);
          comm.allgather(typename comm_type::template view<const float>(in.data(), in.size()),
                         typename comm_type::template view<float>(out.data(), out.size()), state);
          outs[static_cast<std::size_t>(r)].push_back(std::move(out));
        }
      },
      {}, window);
  return outs;
}

/// `run_on` on host_backend, and on the deferred backend (kernels queued until the ordering
/// points) and the deferred device backend (payloads staged through host memory), whose
/// outputs must be bitwise the host's; returns the host's.
template <class Topology, class C>
std::vector<std::vector<std::vector<float>>> run(int p, const C& c, std::size_t count, int steps,
                                                 const squall::collective_tuning& tuning,
                                                 std::size_t window) {
  auto host = run_on<Topology, C, squall::host_backend>(p, c, count, steps, tuning, window);
  const auto require_same = [&](const std::vector<std::vector<std::vector<float>>>& other) {
    for (std::size_t r = 0; r < host.size(); ++r) {
      for (std::size_t s = 0; s < host[r].size(); ++s) {
        CAPTURE(r);
        CAPTURE(s);
        const auto& a = host[r][s];
        const auto& b = other[r][s];
        REQUIRE(a.size() == b.size());
        REQUIRE((a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0));
      }
    }
  };
  if constexpr (squall::test::with_deferred) {
    require_same(
        run_on<Topology, C, squall::test::deferred_backend>(p, c, count, steps, tuning, window));
    require_same(run_on<Topology, C, squall::test::deferred_device_backend>(p, c, count, steps,
                                                                            tuning, window));
  }
  return host;
}

template <class Topology, class C>
void check(const C& c) {
  constexpr int steps = 3;
  for (int p = 1; p <= 4; ++p) {
    for (const std::size_t count :
         {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(p) + 1, std::size_t{1009}}) {
      for (int variant = 0; variant < 2; ++variant) {  // messages; peers' memory
        CAPTURE(squall::compressor_label<C>());
        CAPTURE(p);
        CAPTURE(count);
        CAPTURE(variant);
        const auto outs = variant == 0 ? run<Topology>(p, c, count, steps, tiny_pieces, 4096)
                                       : run<Topology>(p, c, count, steps, peer_memory, 0);
        // serially: each rank's payload encoded on its own, residuals kept with error feedback
        std::vector<std::vector<float>> residual(static_cast<std::size_t>(p),
                                                 std::vector<float>(count, 0.0f));
        for (int s = 0; s < steps; ++s) {
          CAPTURE(s);
          std::vector<float> want;
          for (int q = 0; q < p; ++q) {
            std::vector<float> in = input_of(q, s, count);
            std::vector<float> block;
            if constexpr (squall::is_error_feedback<C>) {
              auto& res = residual[static_cast<std::size_t>(q)];
              for (std::size_t i = 0; i < count; ++i) res[i] = res[i] + in[i];
              block = squall::test::decoded_payload(c.inner, res, static_cast<std::uint64_t>(s), q);
              for (std::size_t i = 0; i < count; ++i) res[i] = res[i] - block[i];
            } else if constexpr (std::is_same_v<C, squall::homomorphic_compressor>) {
              // against the range all ranks agreed, fields of one rank
              std::vector<std::vector<float>> all;
              for (int o = 0; o < p; ++o) all.push_back(input_of(o, s, count));
              auto r = squall::test::hq_agreed(c, all, static_cast<std::uint64_t>(s));
              r.ranks = 1;
              const auto payload = squall::test::hq_payload(c, in, static_cast<std::uint64_t>(s),
                                                            static_cast<std::uint32_t>(q), r);
              block.assign(count, 0.0f);
              c.decode(squall::host_backend{}, squall::host_view<const std::byte>(payload),
                       squall::host_view<float>(block));
            } else {
              block = squall::test::decoded_payload(c, in, static_cast<std::uint64_t>(s), q);
            }
            want.insert(want.end(), block.begin(), block.end());
          }
          for (int r = 0; r < p; ++r) {
            CAPTURE(r);
            const auto& got = outs[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
            REQUIRE(got.size() == want.size());
            REQUIRE((got.empty() || std::memcmp(got.data(), want.data(), got.size() * 4) == 0));
          }
        }
      }
    }
  }
}

}  // namespace

TEST_SUITE("compressed_allgather") {
  TEST_CASE("block q is decode(encode(rank q's input)), every rank bitwise alike") {
    check<squall::ring_topology>(squall::cast_compressor<squall::float16>{});
    check<squall::direct_topology>(squall::randomk_compressor{.ratio = 0.1, .seed = 4});
    check<squall::tree_topology>(squall::count_sketch_compressor<3, 64>{.seed = 5});
    check<squall::ring_topology>(squall::int8_compressor{.bucket = 64});
    check<squall::direct_topology>(squall::qsgd_compressor<4>{.bucket = 64, .seed = 3});
    check<squall::ring_topology>(squall::sign_vote_compressor{});
    check<squall::ring_topology>(squall::topk_compressor{.ratio = 0.1});
    check<squall::tree_topology>(squall::threshold_compressor{.tau = 0.5});
    check<squall::ring_topology>(squall::powersgd_compressor{.rank = 2, .columns = 0, .seed = 1});
    check<squall::ring_topology>(squall::identity_compressor{});
    check<squall::tree_topology>(squall::homomorphic_compressor{.bits = 3, .seed = 2});
  }

  TEST_CASE("error feedback: the residual keeps what each payload left out") {
    check<squall::ring_topology>(squall::error_feedback<squall::topk_compressor>{{.ratio = 0.05}});
    check<squall::direct_topology>(squall::error_feedback<squall::sign_compressor>{{.bucket = 64}});
  }

  TEST_CASE("a wrong output size or state is refused") {
    std::string what = "(nothing thrown)";
    try {
      run_ranks(2, [](inproc_transport& t) {
        squall::communicator<inproc_transport, squall::ring_topology, squall::topk_compressor> comm(
            std::move(t));
        auto state = comm.make_state<float>(4);
        std::vector<float> in(4, 1.0f);
        std::vector<float> out(7);
        comm.allgather(squall::host_view<const float>(in), squall::host_view<float>(out), state);
      });
    } catch (const squall::invalid_argument& e) {
      what = e.what();
    }
    CHECK(what.find("7 elements where 8 are needed") != std::string::npos);
    what = "(nothing thrown)";
    try {
      run_ranks(1, [](inproc_transport& t) {
        squall::communicator<inproc_transport, squall::ring_topology, squall::topk_compressor> comm(
            std::move(t));
        auto state = comm.make_state<float>(5);
        std::vector<float> in(4, 1.0f);
        std::vector<float> out(4);
        comm.allgather(squall::host_view<const float>(in), squall::host_view<float>(out), state);
      });
    } catch (const squall::invalid_argument& e) {
      what = e.what();
    }
    CHECK(what.find("state of 5 elements used for blocks of 4") != std::string::npos);
  }
}
