# SPDX-License-Identifier: Apache-2.0
"""The time of one blocking allreduce from Python, to set beside the C++ call's (squall-bench
with the same communicator: shared memory, automatic topology, float32 sum in place) in the
same run. Run it under squall-run:

    squall-run -n 2 /usr/bin/python3 examples/python_call_overhead.py [--iters N] [--sizes 4K,64K]

For each size and each kind of buffer (a NumPy array; a CPU torch tensor when torch imports)
it prints the slowest rank's mean time per call over N calls, as squall-bench does, best of
5 trials. PYTHONPATH must reach the squall package (<build>/python, or pip-installed).
"""

import argparse
import time

import numpy as np

import squall


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--sizes", default="4K,64K")
    args = parser.parse_args()
    comm = squall.Communicator()
    kinds = [("numpy", lambda n: np.ones(n, np.float32))]
    try:
        import torch

        kinds.append(("torch", lambda n: torch.ones(n, dtype=torch.float32)))
    except ImportError:
        pass
    slowest = np.zeros(1, np.float64)
    for text in args.sizes.split(","):
        count = size_of(text) // 4
        for kind, make in kinds:
            x = make(count)
            for _ in range(min(args.iters, 2000)):  # warm-up
                comm.allreduce(x)
            best = float("inf")
            for _ in range(5):
                comm.barrier()
                start = time.perf_counter()
                for _ in range(args.iters):
                    comm.allreduce(x)
                slowest[0] = (time.perf_counter() - start) / args.iters
                comm.allreduce(slowest, op="max")
                best = min(best, slowest[0])
            if comm.rank == 0:
                print("python %-5s %6s allreduce, %d ranks: %.2f us per call"
                      % (kind, text, comm.size, best * 1e6), flush=True)


if __name__ == "__main__":
    main()
