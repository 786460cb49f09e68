// SPDX-License-Identifier: Apache-2.0
// The error hierarchy names operation, rank and peer, and carries a categorised code.

#include <squall/core/error.hpp>
#include <squall/core/options.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

TEST_SUITE("error") {
  TEST_CASE("messages name the operation, the rank and the peer") {
    try {
      throw squall::timeout_error({.operation = "allreduce", .rank = 2, .peer = 3},
                                  "no data after 5 s");
    } catch (const squall::error& e) {
      const std::string what = e.what();
      CHECK(what.find("allreduce") != std::string::npos);
      CHECK(what.find("rank 2") != std::string::npos);
      CHECK(what.find("peer 3") != std::string::npos);
      CHECK(what.find("no data after 5 s") != std::string::npos);
      CHECK(e.operation() == "allreduce");
      CHECK(e.rank() == 2);
      CHECK(e.peer() == 3);
      CHECK(e.code() == squall::errc::timeout);
      CHECK(e.code().category().name() == std::string("squall"));
    }
  }

  TEST_CASE("each kind of error has its own type and code") {
    const squall::error_context where{.operation = "shm attach", .rank = 0};
    CHECK_THROWS_AS(throw squall::peer_failure(where, "x"), squall::peer_failure);
    CHECK_THROWS_AS(throw squall::mismatch_error(where, "x"), squall::mismatch_error);
    CHECK_THROWS_AS(throw squall::invalid_argument(where, "x"), std::system_error);
    CHECK(squall::peer_failure(where, "x").code() == squall::errc::peer_failure);
    CHECK(squall::mismatch_error(where, "x").code() == squall::errc::mismatch);
    CHECK(squall::invalid_argument(where, "x").code() == squall::errc::invalid_argument);
    const std::string no_peer = squall::invalid_argument(where, "bad").what();
    CHECK(no_peer.find("(rank 0)") != std::string::npos);
    CHECK(no_peer.find("peer") == std::string::npos);
  }

  TEST_CASE("errors from MPI, CUDA and system calls keep their category") {
    const squall::error mpi(std::error_code(15, squall::mpi_category()), {.operation = "send"},
                            "MPI_ERR_TRUNCATE");
    CHECK(mpi.code().category().name() == std::string("mpi"));
    CHECK(mpi.code().value() == 15);
    const squall::error shm(std::error_code(ENOSPC, squall::shm_category()),
                            {.operation = "shm create"}, "fallocate");
    CHECK(std::string(shm.what()).find("No space left") != std::string::npos);
    CHECK(squall::cuda_category().name() == std::string("cuda"));
  }
}

TEST_SUITE("options") {
  TEST_CASE("the deadline: explicit, else SQUALL_TIMEOUT_S, else 300 s") {
    using namespace std::chrono_literals;
    unsetenv("SQUALL_TIMEOUT_S");
    CHECK(squall::options{}.resolved_deadline() == 300s);
    setenv("SQUALL_TIMEOUT_S", "2.5", 1);
    CHECK(squall::options{}.resolved_deadline() == 2500ms);
    CHECK(squall::options{.deadline = 7s}.resolved_deadline() == 7s);
    for (const char* bad : {"", "abc", "0", "-1", "5s", "inf", "nan", "1e10"}) {
      setenv("SQUALL_TIMEOUT_S", bad, 1);
      CHECK_THROWS_WITH_AS(squall::options{}.resolved_deadline(),
                           doctest::Contains("SQUALL_TIMEOUT_S"), squall::invalid_argument);
    }
    unsetenv("SQUALL_TIMEOUT_S");
    CHECK_THROWS_AS(squall::options{.deadline = 0s}.resolved_deadline(), squall::invalid_argument);
    CHECK(squall::options{}.check_mismatch);
  }
}
