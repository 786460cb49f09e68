# SPDX-License-Identifier: Apache-2.0
"""An unmodified mpi4py program: allreduce, allgather, reduce_scatter_block, allgatherv and
reduce_scatter (alike blocks) and bcast of NumPy arrays of several sizes and dtypes, each checked against NumPy's own sum of every rank's data
(exact: the data are small integers in every dtype). Prints one digest line per call, so
that a run with libsquall_mpi.so preloaded can be compared line by line with one without.
With --expect-squall it also checks, through ctypes, that the preloaded library took calls."""
import ctypes
import hashlib
import os
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def data(count, dtype, r, salt):
    i = np.arange(count, dtype=np.int64)
    return (((i * 7 + r * 13 + salt) % 1001) - 500).astype(dtype)


def digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


failures = 0


def check(name, got, expected):
    global failures
    ok = np.array_equal(got, expected)
    if not ok:
        failures += 1
        print(f"rank {rank}: {name}: wrong result", file=sys.stderr)
    if rank == 0:
        print(f"{name} {digest(got)}")


for dtype in (np.float32, np.float64, np.int32, np.int64):
    for count in (100, 5000, 262147):
        name = f"{np.dtype(dtype).name}x{count}"
        mine = data(count, dtype, rank, count % 11)
        exact = sum(data(count, np.float64, r, count % 11) for r in range(size)).astype(dtype)
        out = np.empty_like(mine)
        comm.Allreduce(mine, out, op=MPI.SUM)
        check(f"Allreduce sum {name}", out, exact)
        inplace = mine.copy()
        comm.Allreduce(MPI.IN_PLACE, inplace, op=MPI.MAX)
        check(f"Allreduce max in place {name}",
              inplace, np.max([data(count, dtype, r, count % 11) for r in range(size)], axis=0))
        gathered = np.empty(count * size, dtype=dtype)
        comm.Allgather(mine, gathered)
        check(f"Allgather {name}", gathered,
              np.concatenate([data(count, dtype, r, count % 11) for r in range(size)]))
        whole = data(count * size, dtype, rank, 3)
        block = np.empty(count, dtype=dtype)
        comm.Reduce_scatter_block(whole, block, op=MPI.SUM)
        total = sum(data(count * size, np.float64, r, 3) for r in range(size)).astype(dtype)
        check(f"Reduce_scatter_block {name}", block, total[rank * count:(rank + 1) * count])
        gathered_v = np.empty(count * size, dtype=dtype)
        comm.Allgatherv(mine, [gathered_v, [count] * size])
        check(f"Allgatherv {name}", gathered_v,
              np.concatenate([data(count, dtype, r, count % 11) for r in range(size)]))
        block_v = np.empty(count, dtype=dtype)
        comm.Reduce_scatter(whole, block_v, recvcounts=[count] * size, op=MPI.SUM)
        check(f"Reduce_scatter {name}", block_v, total[rank * count:(rank + 1) * count])
        for root in range(size):
            buffer = data(count, dtype, rank, root)
            comm.Bcast(buffer, root=root)
            check(f"Bcast root {root} {name}", buffer, data(count, dtype, root, root))
comm.Barrier()

if "--expect-squall" in sys.argv:
    counts = getattr(ctypes.CDLL(None), "squall_mpi_counts", None)
    if counts is None:
        failures += 1
        print(f"rank {rank}: libsquall_mpi.so is not loaded", file=sys.stderr)
    else:
        handled, passed = ctypes.c_ulonglong(), ctypes.c_ulonglong()
        on = counts(ctypes.byref(handled), ctypes.byref(passed), None)
        if on != 1 or handled.value == 0:
            failures += 1
            print(f"rank {rank}: squall took {handled.value} calls (on: {on})", file=sys.stderr)
        elif rank == 0:
            print(f"squall took {handled.value} calls, MPI {passed.value}", file=sys.stderr)
    # SQUALL_MPI_SHARED_HEAP: NumPy's large arrays come from squall's shared heap, and the
    # peers' were reached through mappings
    if os.environ.get("SQUALL_MPI_SHARED_HEAP", "0") != "0" and size > 1:
        mappings = ctypes.CDLL(None).squall_mpi_shared_heap_mappings
        mappings.restype = ctypes.c_ulonglong
        if mappings() == 0:
            failures += 1
            print(f"rank {rank}: no peer's shared-heap array was mapped", file=sys.stderr)
failures = comm.allreduce(failures)
sys.exit(1 if failures else 0)
