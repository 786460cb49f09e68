// SPDX-License-Identifier: Apache-2.0
// squall-run: starts P ranks of a program on this host for the shared-memory transport.
//
//   squall-run -n P [--job NAME] [--] program [args...]
//
// Each rank runs `program args...` with SQUALL_JOB, SQUALL_RANK and SQUALL_WORLD_SIZE set,
// which `shm_transport()` reads. When a rank fails (non-zero exit or a signal), the others
// get SIGTERM, then SIGKILL a second later, and squall-run names the rank that failed first
// (one a signal killed before one that exited on seeing it die) and exits with its status
// (128 + signal for a signal). SIGINT, SIGTERM and SIGHUP sent to squall-run go to every rank
// (SIGKILL a second later), and it exits with 128 + that signal; if squall-run itself is
// killed, its ranks get SIGKILL (a parent-death signal).
#include <squall/transport/launch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

int usage(const char* message) {
  std::fprintf(stderr,
               "squall-run: %s\nusage: squall-run -n RANKS [--job NAME] [--] program [args...]\n",
               message);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0;
  squall::launch_options options;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "-n" || arg == "-np") && i + 1 < argc) {
      char* end = nullptr;
      const long value = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || value < 1 || value > 4096)
        return usage("-n needs a rank count in 1..4096");
      ranks = static_cast<int>(value);
    } else if (arg == "--job" && i + 1 < argc) {
      options.job = argv[++i];
    } else if (arg == "--") {
      ++i;
      break;
    } else if (!arg.empty() && arg[0] == '-') {
      return usage(("unknown option " + arg).c_str());
    } else {
      break;
    }
  }
  if (ranks == 0) return usage("missing -n RANKS");
  if (i >= argc) return usage("missing program");
  std::vector<char*> command(argv + i, argv + argc);
  command.push_back(nullptr);
  try {
    const auto result = squall::launch(
        ranks,
        [&](const squall::shm_job&) {
          execvp(command[0], command.data());
          std::fprintf(stderr, "squall-run: cannot run %s: %s\n", command[0], std::strerror(errno));
          return 127;
        },
        options);
    if (result.signal != 0) {
      std::fprintf(stderr, "squall-run: received signal %d, passed on to the ranks\n",
                   result.signal);
    } else if (!result.ok()) {
      std::fprintf(stderr, "squall-run: rank %d failed first, with status %d\n", result.failed_rank,
                   result.exit_code());
    }
    return result.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "squall-run: %s\n", e.what());
    return 1;
  }
}
