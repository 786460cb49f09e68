// SPDX-License-Identifier: Apache-2.0
// The role concepts accept conforming policies and reject each missing piece. The one-line
// diagnostics of check_<role>() are shown by tests/compile_fail/.

#include <squall/backend/host.hpp>
#include <squall/compress/none.hpp>
#include <squall/compress/traits.hpp>
#include <squall/concepts.hpp>
#include <squall/topology/automatic.hpp>
#include <squall/topology/hierarchical.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <string_view>

namespace {

// Minimal conforming shapes, written from the concepts' text, not from any squall model.
struct done_completion {
  done_completion() = default;
  done_completion(done_completion&&) = default;
  done_completion& operator=(done_completion&&) = default;
  void wait() {}
  bool test() { return true; }
};

struct shaped_transport {
  using memory_space = squall::host_memory;
  int rank() const { return 0; }
  int size() const { return 1; }
  done_completion send(int, squall::buffer_view<const std::byte>) { return {}; }
  done_completion recv(int, squall::buffer_view<std::byte>) { return {}; }
  done_completion barrier() { return {}; }
};

struct shaped_direct_transport : shaped_transport {
  squall::buffer_view<std::byte> peer_view(int) { return {}; }
};

struct transport_without_barrier {
  using memory_space = squall::host_memory;
  int rank() const { return 0; }
  int size() const { return 1; }
  done_completion send(int, squall::buffer_view<const std::byte>) { return {}; }
  done_completion recv(int, squall::buffer_view<std::byte>) { return {}; }
};

struct transport_with_bool_send : shaped_transport {
  bool send(int, squall::buffer_view<const std::byte>) { return true; }
};

struct shaped_topology {
  static constexpr std::string_view name = "shaped";
  squall::schedule allreduce_schedule(int, int, std::size_t) const { return {}; }
};

struct shaped_compressor {
  static constexpr std::string_view name = "shaped";
  static constexpr squall::aggregation_set aggregations{squall::aggregation::gather};
  std::size_t max_payload_bytes(squall::dtype, std::size_t count) const { return count; }
};

struct backend_without_sync {
  using memory_space = squall::host_memory;
  static constexpr std::string_view name = "nosync";
};

}  // namespace

TEST_SUITE("concepts") {
  TEST_CASE("conforming policies model their roles") {
    static_assert(squall::completion<done_completion>);
    static_assert(squall::transport<shaped_transport>);
    static_assert(!squall::direct_transport<shaped_transport>);
    static_assert(squall::direct_transport<shaped_direct_transport>);
    static_assert(squall::topology<shaped_topology>);
    static_assert(squall::topology<squall::ring_topology>);
    static_assert(squall::topology<squall::tree_topology>);
    static_assert(squall::topology<squall::direct_topology>);
    static_assert(squall::topology<squall::halving_doubling_topology>);
    static_assert(squall::topology<squall::hierarchical_topology<>>);
    static_assert(squall::topology<squall::automatic_topology>);
    static_assert(squall::compressor<shaped_compressor>);
    static_assert(squall::compressor<squall::identity_compressor>);
    static_assert(squall::backend<squall::host_backend>);
    static_assert(squall::compressor_for<squall::identity_compressor, float, squall::host_backend>);
    static_assert(squall::check_transport<shaped_transport>());
    static_assert(squall::check_topology<shaped_topology>());
    static_assert(squall::check_compressor<shaped_compressor>());
    static_assert(squall::check_backend<squall::host_backend>());
    CHECK(squall::host_backend::name == "host");
  }

  TEST_CASE("each missing or wrong piece is rejected") {
    static_assert(!squall::transport<transport_without_barrier>);
    static_assert(!squall::transport_has_barrier<transport_without_barrier>);
    static_assert(!squall::transport<transport_with_bool_send>);
    static_assert(!squall::transport<int>);
    static_assert(!squall::backend<backend_without_sync>);
    static_assert(squall::backend_has_memory_space<backend_without_sync>);
    static_assert(!squall::backend_has_synchronize<backend_without_sync>);
    static_assert(!squall::topology<shaped_compressor>);
    static_assert(!squall::compressor<shaped_topology>);
    static_assert(!squall::compressor_for<shaped_compressor, float, squall::host_backend>);
    static_assert(!squall::completion<int>);
    CHECK(true);
  }

  TEST_CASE("compression traits follow the declared aggregations") {
    using identity = squall::compression_traits<squall::identity_compressor>;
    static_assert(identity::linear && identity::fixed_size);
    using shaped = squall::compression_traits<shaped_compressor>;
    static_assert(!shaped::linear && !shaped::fixed_size);
    static_assert(shaped::aggregations.size() == 1 &&
                  shaped::aggregations[0] == squall::aggregation::gather);
    static_assert(!shaped::majority_vote);
    // a set keeps its order and drops repeats
    constexpr squall::aggregation_set set{squall::aggregation::per_hop, squall::aggregation::gather,
                                          squall::aggregation::per_hop};
    static_assert(set.size() == 2 && set[0] == squall::aggregation::per_hop);
    static_assert(set.contains(squall::aggregation::gather));
    static_assert(!set.contains(squall::aggregation::linear));
    CHECK(set.names() == "per_hop, gather");
    CHECK(squall::identity_compressor::name == "none");
  }
}
