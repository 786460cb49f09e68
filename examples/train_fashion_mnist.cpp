// SPDX-License-Identifier: Apache-2.0
// Synchronous data-parallel SGD with momentum on Fashion-MNIST, the gradients averaged by a
// squall allreduce whose compressor is chosen on the command line.
//
//   train_fashion_mnist [-n P] [--epochs E] [--batch B] [--lr LR] [--momentum M]
//                       [--schedule cosine|constant] [--warmup EPOCHS] [--masking on|off]
//                       [--sparsity-warmup EPOCHS] [--flush-denormals on|off]
//                       [--hidden H] [--compressor SPEC[,SPEC...]] [--train-subset N]
//                       [--test-subset N] [--data DIR] [--csv FILE] [--seed S]
//                       [--transport shm|mpi] [--require-accuracy FRACTION]
//                       [--overlap PIECES] [--registered on|off]
//
// SPEC is squall's compressor name (squall/compress/by_name.hpp): none, cast:bf16, int8,
// qsgd:4, terngrad, sign+ef, topk:0.01+ef, topk:0.001+ef@gtopk, randomk:0.01,
// count_sketch:16384, count_sketch:4096+ef@two_round, fetchsgd:16384, powersgd:4+ef, ... Each
// SPEC trains the same network from the same initial weights on P ranks: -n P forked processes
// joined by the shared-memory transport, or with --transport mpi the ranks mpiexec started (the
// same code, squall::mpi_transport in place of squall::shm_transport). Rank r trains on its B
// images of each global batch of P x B; the gradients of the two weight matrices go through the
// compressed allreduce on the ring topology (each with its own state: residual, PowerSGD's Q
// viewed as the layer's matrix), the 266 biases through a dense one on the automatic topology,
// and so does a matrix whose fixed-size payload would not be smaller than its values (a wide
// count sketch of W2), and with `none` every tensor. On the shared-memory transport the
// gradients lie in registered memory (--registered on, the default there; off: on the heap),
// so that a dense allreduce reads the peers' gradients where they are, with plain loads (direct's
// one-shot, which the automatic topology picks on one host). With error feedback the momentum is
// applied before the allreduce (DGC's momentum correction), without it after; FetchSGD
// (fetchsgd:COLS) keeps the momentum (--momentum) and the error in its sketches, so its result is
// the step itself. With --overlap K the allreduces are non-blocking and overlap backward: W2's
// starts as soon as backward has computed it, W1's gradient is computed in K blocks of rows, each
// block's allreduce (with a compression state of its own) started as soon as it is done, then the
// biases'; the step waits for them all before the update (DDP's and Horovod's overlap; over
// MPI it needs MPI_THREAD_MULTIPLE, the communicators' progress threads calling at once).
// Without it (0, the default) the same parts are reduced blocking, W1 whole.
// A learning rate or momentum other than the defaults (0.05, 0.9) is part of the name each run
// prints and writes ("sign:0+ef@gather lr 0.02", "randomk:0.1+ef lr 0.1 momentum 0.5"), so that
// runs at several settings append to one CSV and summarize apart (examples/summarize_seeds.py).
// After each epoch: the mean training loss, the accuracy on the test images (split across the
// ranks), the wall time, the time in the gradient allreduces (with --overlap: waiting for them,
// what backward did not hide) and the bytes this rank sent for them since the start, the most of
// any rank. At the end every rank's weights are compared bit for bit. The compressed allreduces
// check their inputs (squall::options::check_finite): a non-finite gradient on any rank stops every
// rank with an error naming it. The images come from Debian's
// dataset-fashion-mnist (/usr/share/datasets/fashion-mnist), $SQUALL_FASHION_MNIST or --data.
// --flush-denormals on sets the SSE control register's flush-to-zero and denormals-are-zero
// bits in every rank (as torch.set_flush_denormal(True) does): with qsgd:4 the epochs grew
// from 1.1 to 2.2 s over five epochs, subnormal floats costing the CPU a microcode assist per
// operation (the velocity of coordinates whose decoded gradient stays 0, multiplied by the
// momentum step after step), and stay at 1.05 s with it; off (the default) keeps IEEE
// arithmetic, and with it the figures docs/performance.md measured.
// The training loop is fashion_mnist/train.hpp, instantiated for every compressor in
// train_shm.cpp and train_mpi.cpp (one translation unit per transport); this file parses the
// command line and starts them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#if defined(__SSE__)
#include <pmmintrin.h>  // _MM_SET_DENORMALS_ZERO_MODE
#include <xmmintrin.h>  // _MM_SET_FLUSH_ZERO_MODE
#endif

#if SQUALL_EXAMPLE_WITH_MPI
#include <mpi.h>
#endif

#include "fashion_mnist/train.hpp"

// OpenBLAS runs one thread per rank (the ranks are the parallelism); declared weak so that any
// other CBLAS links too.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace {

constexpr bool with_mpi = SQUALL_EXAMPLE_WITH_MPI != 0;

using fashion_mnist::settings;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "train_fashion_mnist: %s\nusage: train_fashion_mnist [-n P] [--epochs E] [--batch B] "
      "[--lr LR] [--momentum M] [--schedule cosine|constant] [--warmup EPOCHS] [--masking on|off] "
      "[--sparsity-warmup EPOCHS] [--flush-denormals on|off] "
      "[--hidden H] "
      "[--compressor SPEC[,SPEC...]] "
      "[--train-subset N] [--test-subset N] [--data DIR] [--csv FILE] [--seed S] "
      "[--transport shm|mpi] [--require-accuracy FRACTION] [--overlap PIECES] "
      "[--registered on|off]\n"
      "SPEC: %s\n",
      why.c_str(), squall::compressor_usage().c_str());
  std::exit(2);
}

double number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= 0))
    usage(flag + ": '" + text + "' is not a number >= 0");
  return v;
}

settings parse(int argc, char** argv) {
  settings s;
  std::string compressors = "none";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage("help");
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "-n")
      s.ranks = static_cast<int>(number(a, v));
    else if (a == "--epochs")
      s.epochs = static_cast<int>(number(a, v));
    else if (a == "--batch")
      s.batch = static_cast<std::size_t>(number(a, v));
    else if (a == "--lr")
      s.lr = static_cast<float>(number(a, v));
    else if (a == "--momentum")
      s.momentum = static_cast<float>(number(a, v));
    else if (a == "--warmup")
      s.warmup = number(a, v);
    else if (a == "--sparsity-warmup")
      s.sparsity_warmup = static_cast<int>(number(a, v));
    else if (a == "--masking") {
      if (v != "on" && v != "off") usage("--masking takes on or off");
      s.masking = v == "on";
    } else if (a == "--flush-denormals") {
      if (v != "on" && v != "off") usage("--flush-denormals takes on or off");
      s.flush_denormals = v == "on";
    } else if (a == "--schedule") {
      if (v != "cosine" && v != "constant") usage("--schedule takes cosine or constant");
      s.cosine = v == "cosine";
    } else if (a == "--hidden")
      s.hidden = static_cast<std::size_t>(number(a, v));
    else if (a == "--compressor" || a == "-c")
      compressors = v;
    else if (a == "--train-subset")
      s.train_subset = static_cast<std::size_t>(number(a, v));
    else if (a == "--test-subset")
      s.test_subset = static_cast<std::size_t>(number(a, v));
    else if (a == "--data")
      s.data = v;
    else if (a == "--csv")
      s.csv = v;
    else if (a == "--seed")
      s.seed = static_cast<std::uint64_t>(number(a, v));
    else if (a == "--transport") {
      if (v != "shm" && v != "mpi") usage("--transport takes shm or mpi");
      if (v == "mpi" && !with_mpi) usage("--transport mpi: this build has no MPI");
      s.transport = v;
    } else if (a == "--require-accuracy")
      s.require_accuracy = number(a, v);
    else if (a == "--overlap")
      s.overlap = static_cast<std::size_t>(number(a, v));
    else if (a == "--registered") {
      if (v != "on" && v != "off") usage("--registered takes on or off");
      s.registered = v == "on";
    } else
      usage("unknown option " + a);
  }
  if (s.ranks < 1 || s.ranks > 64) usage("-n must be 1..64");
  if (s.epochs < 1) usage("--epochs must be at least 1");
  if (s.batch < 1) usage("--batch must be at least 1");
  if (s.hidden < 1) usage("--hidden must be at least 1");
  if (s.momentum >= 1) usage("--momentum must be below 1");
  if (s.overlap > 784) usage("--overlap: at most 784 pieces (W1's rows)");
  if (s.registered == true && s.transport != "shm")
    usage("--registered on: registered memory is the shm transport's (--transport shm)");
  for (std::size_t at = 0; at <= compressors.size();) {
    const std::size_t comma = std::min(compressors.find(',', at), compressors.size());
    try {
      const auto choice = squall::parse_compressor(compressors.substr(at, comma - at));
      squall::visit_compressor(choice, [](auto) {});  // checks the parameter before any fork
      s.compressors.push_back(choice);
    } catch (const squall::error& e) {
      usage(e.what());
    }
    at = comma + 1;
  }
  return s;
}

#if SQUALL_EXAMPLE_WITH_MPI
/// MPI_Init and MPI_Finalize around main's body, when --transport mpi.
struct mpi_session {
  bool on = false;
  // with `threads`, MPI_THREAD_MULTIPLE: the communicators' progress threads call MPI at the
  // same time (--overlap)
  mpi_session(int& argc, char**& argv, bool wanted, bool threads) : on(wanted) {
    if (!on) return;
    if (!threads) {
      MPI_Init(&argc, &argv);
      return;
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr,
                   "train_fashion_mnist: --overlap over MPI needs MPI_THREAD_MULTIPLE, "
                   "which this MPI does not provide\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    if (on) MPI_Finalize();
  }
  static int rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  const settings s = parse(argc, argv);
  if (s.flush_denormals) {  // before the ranks start: forked ranks and threads inherit it
#if defined(__SSE__)
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#else
    usage("--flush-denormals needs an x86 CPU with SSE");
#endif
  }
  bool leader = true;  // prints the header and writes the CSV's
#if SQUALL_EXAMPLE_WITH_MPI
  const mpi_session mpi(argc, argv, s.transport == "mpi", s.overlap > 0);
  if (mpi.on) leader = mpi_session::rank() == 0;
#endif
  if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
  fashion_mnist::dataset data;
  try {
    data = fashion_mnist::load(fashion_mnist::directory(s.data));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    return 2;
  }
  const std::size_t train_count =
      s.train_subset == 0 ? data.train.count : std::min(s.train_subset, data.train.count);
  const std::size_t test_count =
      s.test_subset == 0 ? data.test.count : std::min(s.test_subset, data.test.count);
  int ranks = s.ranks;
#if SQUALL_EXAMPLE_WITH_MPI
  if (mpi.on) MPI_Comm_size(MPI_COMM_WORLD, &ranks);
#endif
  if (leader) {
    std::printf(
        "# train_fashion_mnist: %d ranks (%s), %zu training and %zu test images, 784-%zu-10, "
        "batch %zu per rank, lr %g, momentum %g, %d epochs\n",
        ranks, s.transport.c_str(), train_count, test_count, s.hidden, s.batch,
        static_cast<double>(s.lr), static_cast<double>(s.momentum), s.epochs);
  }
  if (leader && !s.csv.empty()) {
    std::FILE* f = std::fopen(s.csv.c_str(), "a");
    if (f == nullptr) usage("cannot write " + s.csv);
    if (std::ftell(f) == 0) {
      std::fprintf(f,
                   "compressor,ranks,batch,epoch,train_loss,test_accuracy,wall_s,comm_s,wire_bytes_"
                   "per_rank\n");
    }
    std::fclose(f);
  }
#if SQUALL_EXAMPLE_WITH_MPI
  if (s.transport == "mpi") return fashion_mnist::train_over_mpi(s, data, train_count, test_count);
#endif
  return fashion_mnist::train_over_shm(s, data, train_count, test_count);
}
