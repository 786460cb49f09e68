# SPDX-License-Identifier: Apache-2.0
"""squall's collectives from Python: dense and compressed allreduce of NumPy arrays and CPU
torch tensors, without copies.

    import numpy as np, squall
    comm = squall.Communicator()                      # the job of squall-run, mpiexec or torchrun
    x = np.ones(1000, np.float32)
    comm.allreduce(x)                                 # in place: x = sum over ranks
    sparse = squall.Communicator(compressor="topk:0.01+ef")
    state = sparse.make_state(x.size)                 # one per tensor, kept by the caller
    sparse.allreduce(x, state, op="avg")
    request = comm.iallreduce(x); ...; request.wait()

Every rank must make the same communicators in the same order and call the same collectives
in the same order (as in MPI). Each communicator has a transport of its own: a shared-memory
job of the ranks of this host ("shm", started by squall-run, mpiexec or torchrun), or a
duplicate of MPI_COMM_WORLD ("mpi"). Compressor names are squall-bench's ("none", "cast:bf16",
"topk:0.01+ef", "powersgd:4+ef", ...). squall's errors are raised as `squall.Error` (a
RuntimeError) with squall's message, bad arguments as ValueError or TypeError.
"""

import atexit

from . import _squall

atexit.register(_squall._finish_mpi)

Error = _squall.Error
Request = _squall.Request
State = _squall.State
has_mpi = _squall.has_mpi

__all__ = ["Communicator", "Error", "Request", "State", "has_mpi"]


_torch_formats = {}  # torch dtype -> the buffer protocol's format, filled at the first tensor


def _array(x):
    """`x` as the binding takes it, sharing its memory: a NumPy array (anything with the buffer
    protocol) as it is; a CPU torch tensor as (tensor, address, count, format), checked here
    (cheaper than its NumPy view: the call's overhead is part of a small allreduce's time)."""
    if type(x).__module__.startswith("torch"):
        if not _torch_formats:
            import torch

            _torch_formats.update({torch.float32: "f", torch.float64: "d",
                                   torch.int32: "i", torch.int64: "q"})
        if not x.is_cpu:
            raise TypeError("squall: a torch tensor on %s; CPU tensors only" % x.device)
        if not x.is_contiguous():
            raise ValueError("squall: the torch tensor must be contiguous")
        form = _torch_formats.get(x.dtype)
        if form is None:
            raise TypeError("squall: torch tensors of float32, float64, int32 or int64 only, "
                            "not %s" % x.dtype)
        return (x, x.data_ptr(), x.numel(), form)
    return x


class Communicator:
    """One squall communicator: `transport` "shm" (default) or "mpi", `compressor` a name as in
    squall-bench ("none" by default: the dense collectives only)."""

    def __init__(self, transport="shm", compressor="none"):
        self._comm = _squall.Communicator(transport, compressor)
        self.compressor = compressor

    @property
    def rank(self):
        return self._comm.rank

    @property
    def size(self):
        return self._comm.size

    @property
    def bytes_sent(self):
        """The bytes this rank has sent in this communicator's collectives so far."""
        return self._comm.bytes_sent

    def make_state(self, count, columns=0):
        """A compression state for a tensor of `count` float32 elements (error feedback's
        residual, PowerSGD's Q, the step); one per tensor, used for it in every call.
        `columns` (PowerSGD only) views the tensor as a matrix of rows of that many elements:
        a layer's weight of shape (out, in, ...) as `columns=weight[0].numel()`, as torch's
        PowerSGD hook does; 0 is the default near-square view of the flat tensor."""
        return self._comm.make_state(count, columns)

    # ---- non-blocking: each returns a Request (wait(), test()) -----------------------------

    def iallreduce(self, data, state=None, op="sum"):
        """Starts the allreduce of `data` in place (op: sum, avg, min, max); with `state`, the
        compressed allreduce (float32, sum or avg)."""
        if state is None:
            return self._comm.iallreduce(_array(data), op)
        return self._comm.iallreduce_compressed(_array(data), state, op)

    def ireduce_scatter(self, data, op="sum"):
        """Starts the reduce-scatter of `data` in place: this rank's block
        (`block(data.size)`) holds the result."""
        return self._comm.ireduce_scatter(_array(data), op)

    def iallgather(self, input, output):
        """Starts the allgather: `output` = every rank's `input`, in rank order."""
        return self._comm.iallgather(_array(input), _array(output))

    def ibroadcast(self, data, root):
        return self._comm.ibroadcast(_array(data), root)

    def ibarrier(self):
        return self._comm.ibarrier()

    # ---- blocking: the same collectives, run on the calling thread (the GIL released) ------

    def allreduce(self, data, state=None, op="sum"):
        if state is None:
            self._comm.allreduce(_array(data), op)
        else:
            self._comm.allreduce_compressed(_array(data), state, op)
        return data

    def reduce_scatter(self, data, op="sum"):
        self._comm.reduce_scatter(_array(data), op)
        return data

    def allgather(self, input, output):
        self._comm.allgather(_array(input), _array(output))
        return output

    def broadcast(self, data, root):
        self._comm.broadcast(_array(data), root)
        return data

    def barrier(self):
        self._comm.barrier()

    def block(self, count):
        """(offset, count) of this rank's block of a reduce-scatter of `count` elements."""
        return self._comm.block_offset(count), self._comm.block_count(count)
