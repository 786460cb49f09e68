// SPDX-License-Identifier: Apache-2.0
// squall-mpi-bench: a plain MPI program (no squall headers) that times MPI_Allreduce,
// MPI_Allgather, MPI_Reduce_scatter_block or MPI_Bcast of float data, or their non-blocking
// forms started and waited for at once (MPI_Iallreduce + MPI_Wait, ...), or MPI_Allgatherv,
// MPI_Iallgatherv and MPI_Reduce_scatter with every rank's block alike (allgatherv,
// iallgatherv, reduce_scatterv) or, with --blocks uneven, the last rank's one float shorter
// (reduce_scatterv: squall's own split), with --blocks reversed, in reverse rank order,
// against the MPI library's own PMPI_* of the same calls, interleaved in one run. Run it with
// libsquall_mpi.so preloaded (scripts/bench.sh does: SQUALL_BENCH=interpose) and the "squall"
// column is the interposed call; without it both columns are MPI's.
//
//   mpiexec -n P env LD_PRELOAD=libsquall_mpi.so squall-mpi-bench [--op allreduce|iallreduce|
//       allgather|iallgather|allgatherv|iallgatherv|reduce_scatter|ireduce_scatter|
//       reduce_scatterv|bcast|ibcast|barrier|ibarrier] [--blocks alike|uneven|reversed] [-b 4K]
//       [-e 256M] [-f 4] [--reps 5] [--warmup N] [--cold BYTES] [--thread single|multiple]
//
// Sizes from -b to -e, each -f times the last. Per size (bytes of the whole result, as nccl-tests
// counts): the time of one call (best of
// --reps timed loops, each the slowest rank's mean), busbw of the squall column, the ratio MPI
// time / squall time (> 1: squall faster), and #wrong: elements of the squall result that
// differ from PMPI's (the data are small integers, so every sum is exact in any order).
//
// As osu_allreduce, each timed loop follows untimed warm-up calls of the same column (--warmup,
// default 10, as OSU's skip for large messages): the
// columns alternate, so without them a loop's first calls would pay for the caches the other
// library's loop left. --cold BYTES measures the opposite case, a call after the program's own
// work: before every call each rank writes BYTES of other memory (untimed, then a barrier),
// and the call alone is timed. --thread multiple starts MPI with MPI_THREAD_MULTIPLE, which
// libsquall_mpi needs to take the non-blocking forms across hosts.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <string>
#include <vector>

namespace {

std::size_t parse_bytes(const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  const std::string suffix = end;
  const int shift = suffix.empty()  ? 0
                    : suffix == "K" ? 10
                    : suffix == "M" ? 20
                    : suffix == "G" ? 30
                                    : -1;
  if (end == text || shift < 0) {
    std::fprintf(stderr, "squall-mpi-bench: '%s' is not a size (digits, then K, M or G)\n", text);
    std::exit(2);
  }
  return static_cast<std::size_t>(value) << shift;
}

/// One collective on `count` floats of result, through MPI_* (interposed) or PMPI_*. A
/// broadcast sends `out` of rank 0.
int run_op(const std::string& op, const std::vector<float>& in, std::vector<float>& out, int count,
           bool mpi, int rank, int size, const std::string& blocks) {
  const int block = count / size;
  MPI_Request request = MPI_REQUEST_NULL;
  const auto wait = [&](int code) {  // the non-blocking forms: started and waited for at once
    if (code != MPI_SUCCESS) return code;
    return mpi ? PMPI_Wait(&request, MPI_STATUS_IGNORE) : MPI_Wait(&request, MPI_STATUS_IGNORE);
  };
  MPI_Comm world = MPI_COMM_WORLD;
  if (op == "allgatherv" || op == "iallgatherv" || op == "reduce_scatterv") {  // end to end
    std::vector<int> counts(static_cast<std::size_t>(size), block), displs(counts.size());
    if (blocks == "uneven" && size > 1) counts.back() = block - 1;
    for (std::size_t q = 0; q < displs.size(); ++q) {
      const std::size_t place = blocks == "reversed" ? displs.size() - 1 - q : q;
      displs[q] = static_cast<int>(place) * block;
    }
    const int mine = counts[static_cast<std::size_t>(rank)];
    if (op == "iallgatherv") {
      return wait(mpi ? PMPI_Iallgatherv(in.data(), mine, MPI_FLOAT, out.data(), counts.data(),
                                         displs.data(), MPI_FLOAT, world, &request)
                      : MPI_Iallgatherv(in.data(), mine, MPI_FLOAT, out.data(), counts.data(),
                                        displs.data(), MPI_FLOAT, world, &request));
    }
    if (op == "allgatherv") {
      return mpi ? PMPI_Allgatherv(in.data(), mine, MPI_FLOAT, out.data(), counts.data(),
                                   displs.data(), MPI_FLOAT, world)
                 : MPI_Allgatherv(in.data(), mine, MPI_FLOAT, out.data(), counts.data(),
                                  displs.data(), MPI_FLOAT, world);
    }
    return mpi ? PMPI_Reduce_scatter(in.data(), out.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                                     world)
               : MPI_Reduce_scatter(in.data(), out.data(), counts.data(), MPI_FLOAT, MPI_SUM,
                                    world);
  }
  if (op == "iallgather") {
    return wait(mpi ? PMPI_Iallgather(in.data(), block, MPI_FLOAT, out.data(), block, MPI_FLOAT,
                                      world, &request)
                    : MPI_Iallgather(in.data(), block, MPI_FLOAT, out.data(), block, MPI_FLOAT,
                                     world, &request));
  }
  if (op == "ireduce_scatter") {
    return wait(mpi ? PMPI_Ireduce_scatter_block(in.data(), out.data(), block, MPI_FLOAT, MPI_SUM,
                                                 world, &request)
                    : MPI_Ireduce_scatter_block(in.data(), out.data(), block, MPI_FLOAT, MPI_SUM,
                                                world, &request));
  }
  if (op == "ibcast") {
    return wait(mpi ? PMPI_Ibcast(out.data(), count, MPI_FLOAT, 0, world, &request)
                    : MPI_Ibcast(out.data(), count, MPI_FLOAT, 0, world, &request));
  }
  if (op == "allreduce") {
    return mpi ? PMPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)
               : MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  if (op == "allgather") {
    return mpi ? PMPI_Allgather(in.data(), block, MPI_FLOAT, out.data(), block, MPI_FLOAT,
                                MPI_COMM_WORLD)
               : MPI_Allgather(in.data(), block, MPI_FLOAT, out.data(), block, MPI_FLOAT,
                               MPI_COMM_WORLD);
  }
  if (op == "reduce_scatter") {
    return mpi ? PMPI_Reduce_scatter_block(in.data(), out.data(), block, MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD)
               : MPI_Reduce_scatter_block(in.data(), out.data(), block, MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
  }
  if (op == "iallreduce") {
    return wait(
        mpi ? PMPI_Iallreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, world, &request)
            : MPI_Iallreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, world, &request));
  }
  if (op == "barrier") return mpi ? PMPI_Barrier(MPI_COMM_WORLD) : MPI_Barrier(MPI_COMM_WORLD);
  if (op == "ibarrier") {
    return wait(mpi ? PMPI_Ibarrier(world, &request) : MPI_Ibarrier(world, &request));
  }
  return mpi ? PMPI_Bcast(out.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD)
             : MPI_Bcast(out.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  // --thread multiple: MPI_Init_thread(MPI_THREAD_MULTIPLE), under which libsquall_mpi takes
  // the non-blocking forms across hosts too
  bool multiple = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--thread") multiple = std::string(argv[i + 1]) == "multiple";
  }
  if (multiple) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "squall-mpi-bench: MPI gives thread level %d, not MULTIPLE\n", provided);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  } else {
    MPI_Init(&argc, &argv);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::string op = "allreduce";
  std::size_t first = 4096, last = std::size_t{256} << 20;
  int reps = 5;
  int warmup = 10;
  std::size_t cold = 0;  // bytes written between calls; 0: calls back to back
  std::size_t factor_step = 4;
  std::string blocks = "alike";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--op") {
      op = argv[i + 1];
    } else if (flag == "-b") {
      first = parse_bytes(argv[i + 1]);
    } else if (flag == "-e") {
      last = parse_bytes(argv[i + 1]);
    } else if (flag == "-f") {
      factor_step = std::max<std::size_t>(2, std::strtoull(argv[i + 1], nullptr, 10));
    } else if (flag == "--reps") {
      reps = std::max(1, std::atoi(argv[i + 1]));
    } else if (flag == "--warmup") {
      warmup = std::max(0, std::atoi(argv[i + 1]));
    } else if (flag == "--blocks") {
      blocks = argv[i + 1];
      if (blocks != "alike" && blocks != "uneven" && blocks != "reversed") {
        if (rank == 0) {
          std::fprintf(stderr, "squall-mpi-bench: --blocks alike, uneven or reversed\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else if (flag == "--cold") {
      cold = parse_bytes(argv[i + 1]);
    } else if (flag == "--thread") {
      if (std::string(argv[i + 1]) != "multiple" && std::string(argv[i + 1]) != "single") {
        if (rank == 0) std::fprintf(stderr, "squall-mpi-bench: --thread multiple or single\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    } else {
      if (rank == 0) std::fprintf(stderr, "squall-mpi-bench: unknown flag %s\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  // the blocking form (the -v forms: the block forms they equal)
  std::string base = op.size() > 1 && op[0] == 'i' ? op.substr(1) : op;
  if (base == "allgatherv" || base == "reduce_scatterv") base.pop_back();
  if (base != "allreduce" && base != "allgather" && base != "reduce_scatter" && base != "bcast" &&
      base != "barrier") {
    if (rank == 0) std::fprintf(stderr, "squall-mpi-bench: unknown --op %s\n", op.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const bool interposed = dlsym(RTLD_DEFAULT, "squall_mpi_counts") != nullptr;
  std::vector<char> junk(cold);
  if (base == "barrier") {  // libsquall_mpi takes a barrier once a call it took made its state
    std::vector<float> warm(1 << 20, 1.0f);
    MPI_Allreduce(MPI_IN_PLACE, warm.data(), static_cast<int>(warm.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    last = first;  // one row: a barrier has no size
  }
  // busbw factor, as nccl-tests: allreduce 2(P-1)/P, allgather and reduce-scatter (P-1)/P,
  // broadcast 1.
  const double p = size;
  const double factor = base == "allreduce" ? 2 * (p - 1) / p : base == "bcast" ? 1.0 : (p - 1) / p;
  if (rank == 0) {
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(host, &length);
    std::printf(
        "# squall-mpi-bench: %s%s of float32 sums, %d ranks on %s; squall column: %s\n", op.c_str(),
        blocks == "uneven"     ? " (the last rank's block one float shorter)"
        : blocks == "reversed" ? " (the blocks in reverse rank order)"
                               : "",
        size, host, interposed ? "libsquall_mpi.so (interposed MPI_*)" : "MPI_* (not interposed)");
    if (cold == 0) {
      std::printf("# calls back to back after %d warm-up calls\n", warmup);
    } else {
      std::printf("# cold: %zu bytes written before every call\n", cold);
    }
    std::printf("%12s %11s %11s %11s %10s %9s %7s\n", "bytes", "count", "MPI us", "squall us",
                "busbw GB/s", "MPI/squall", "#wrong");
  }
  for (std::size_t bytes = first; bytes <= last; bytes *= factor_step) {
    // Allgather and reduce-scatter need a whole block per rank; the others take any count.
    const bool per_rank = base == "allgather" || base == "reduce_scatter";
    const std::size_t per = per_rank ? static_cast<std::size_t>(size) : 1;
    const int count = static_cast<int>(bytes / sizeof(float) / per * per);
    if (count == 0) continue;
    const std::size_t input_count = base == "allgather" ? static_cast<std::size_t>(count / size)
                                                        : static_cast<std::size_t>(count);
    std::vector<float> in(input_count), out(static_cast<std::size_t>(count)),
        reference(static_cast<std::size_t>(count));
    for (std::size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank)) % 201) -
                                 100);
    }
    if (base == "bcast") {
      std::copy(in.begin(), in.end(), reference.begin());
      std::copy(in.begin(), in.end(), out.begin());
    }
    run_op(op, in, reference, count, true, rank, size, blocks);
    run_op(op, in, out, count, false, rank, size, blocks);
    long wrong = 0;
    for (std::size_t i = 0; i < out.size(); ++i) wrong += out[i] != reference[i] ? 1 : 0;
    const int iterations =
        static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / bytes, 3, 2000));
    double best[2] = {1e30, 1e30};  // [0]: MPI, [1]: squall
    for (int r = 0; r < reps; ++r) {
      for (int which = 0; which < 2; ++which) {
        std::vector<float>& target = which == 0 ? reference : out;
        double seconds = 0;
        if (cold == 0) {
          for (int i = 0; i < warmup; ++i) {
            run_op(op, in, target, count, which == 0, rank, size, blocks);
          }
          PMPI_Barrier(MPI_COMM_WORLD);
          const double start = MPI_Wtime();
          for (int i = 0; i < iterations; ++i)
            run_op(op, in, target, count, which == 0, rank, size, blocks);
          seconds = (MPI_Wtime() - start) / iterations;
        } else {
          for (int i = 0; i < iterations; ++i) {
            std::memset(junk.data(), (r + i) & 0xff, junk.size());
            PMPI_Barrier(MPI_COMM_WORLD);
            const double start = MPI_Wtime();
            run_op(op, in, target, count, which == 0, rank, size, blocks);
            seconds += MPI_Wtime() - start;
          }
          seconds /= iterations;
        }
        MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best[which] = std::min(best[which], seconds);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      const double result_bytes = static_cast<double>(count) * sizeof(float);
      std::printf("%12zu %11d %11.1f %11.1f %10.2f %9.2fx %7ld\n",
                  static_cast<std::size_t>(count) * 4, count, best[0] * 1e6, best[1] * 1e6,
                  result_bytes / best[1] * factor / 1e9, best[0] / best[1], wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
