# SPDX-License-Identifier: Apache-2.0
"""A DDP communication hook that runs squall's (compressed) allreduce on each gradient bucket.

    import squall.torch
    state = squall.torch.HookState(compressor="topk:0.01+ef")   # every rank alike
    model = torch.nn.parallel.DistributedDataParallel(model)    # a gloo process group
    model.register_comm_hook(state, squall.torch.allreduce_hook)

The hook starts the bucket's allreduce (the mean over ranks) on squall's progress thread and
returns a torch future at once, so the backward pass goes on while the bucket travels; one
waiter thread per state completes the futures in the order the buckets were started (squall
runs them in that order). Each bucket keeps its compression state (error feedback's residual,
PowerSGD's Q), keyed by the bucket's index; when DDP rebuilds its buckets (after the first
iteration) a bucket whose size changed gets a fresh state.
"""

import queue
import threading

import torch

from . import Communicator


class HookState:
    """What `allreduce_hook` needs: a squall communicator with `compressor` (squall-bench's
    names; "none": the dense allreduce) over `transport`, and the per-bucket states. Every
    rank must make it alike, in the same order as its other squall communicators."""

    def __init__(self, compressor="none", transport="shm"):
        self.comm = Communicator(transport=transport, compressor=compressor)
        self.compressor = compressor
        self.states = {}
        self._pending = queue.Queue()
        self._waiter = threading.Thread(target=self._complete, daemon=True)
        self._waiter.start()

    def _complete(self):
        while True:
            request, future, tensor = self._pending.get()
            try:
                request.wait()
                future.set_result(tensor)
            except Exception as e:  # squall's error reaches DDP through the future
                future.set_exception(e)

    def start(self, index, tensor):
        """Starts the mean over ranks of `tensor` (float32, contiguous) in place; returns a
        torch future that holds the tensor once done."""
        if self.comm.compressor == "none":
            request = self.comm.iallreduce(tensor, op="avg")
        else:
            state = self.states.get(index)
            if state is None or state.count != tensor.numel():
                state = self.comm.make_state(tensor.numel())
                self.states[index] = state
            request = self.comm.iallreduce(tensor, state, op="avg")
        future = torch.futures.Future()
        self._pending.put((request, future, tensor))
        return future


def allreduce_hook(state, bucket):
    """DDP communication hook: squall's allreduce (mean) of the bucket's flat buffer."""
    tensor = bucket.buffer()
    if tensor.dtype != torch.float32:
        raise TypeError("squall.torch.allreduce_hook: float32 gradients only, not %s" % tensor.dtype)
    return state.start(bucket.index(), tensor)
