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

Per layer (the default for PowerSGD, `per_layer=True` for any compressor): each gradient of
the bucket of two or more dimensions is compressed on its own, PowerSGD viewing a weight of
shape (out, in, ...) as its out x (in ...) matrix, as torch's PowerSGD hook does (the flat
bucket as one near-square matrix mixes the layers and loses their low-rank structure); the
vectors (biases), and matrices PowerSGD would not shrink by `min_compression_rate`, take the
dense mean. A bucket's states are kept under its index, made afresh when its layout changes.
"""

import queue
import re
import threading

import torch

from . import Communicator


def _powersgd_rank(compressor):
    """PowerSGD's rank r in a compressor name ("powersgd:4+ef" -> 4), or None for another."""
    match = re.match(r"powersgd(?::(\d+))?(?:[+@/]|$)", compressor)
    if match is None:
        return None
    return int(match.group(1) or 4)


class HookState:
    """What `allreduce_hook` needs: a squall communicator with `compressor` (squall-bench's
    names; "none": the dense allreduce) over `transport`, and the per-bucket states. Every
    rank must make it alike, in the same order as its other squall communicators.

    `per_layer` (None: True for PowerSGD, else False) compresses each gradient of two or more
    dimensions on its own and sends the others dense; `min_compression_rate` (PowerSGD per
    layer) sends a layer dense unless its factors are that many times smaller (torch's
    rule)."""

    def __init__(self, compressor="none", transport="shm", per_layer=None,
                 min_compression_rate=2.0):
        self.comm = Communicator(transport=transport, compressor=compressor)
        self.compressor = compressor
        self.powersgd_rank = _powersgd_rank(compressor)
        if per_layer is None:
            per_layer = self.powersgd_rank is not None
        self.per_layer = bool(per_layer) and compressor != "none"
        # the dense means of the per-layer hook (a compressing communicator runs no others)
        self.dense = Communicator(transport=transport) if self.per_layer else None
        self.min_compression_rate = float(min_compression_rate)
        self.states = {}
        self._pending = queue.Queue()
        self._waiter = threading.Thread(target=self._complete, daemon=True)
        self._waiter.start()

    @property
    def bytes_sent(self):
        """The bytes this rank has sent in the hook's allreduces so far."""
        return self.comm.bytes_sent + (self.dense.bytes_sent if self.dense is not None else 0)

    def _complete(self):
        while True:
            requests, future, tensor = self._pending.get()
            try:
                for request in requests:
                    request.wait()
                future.set_result(tensor)
            except Exception as e:  # squall's error reaches DDP through the future
                future.set_exception(e)

    def _bucket_states(self, index, views):
        """The states of bucket `index`, one per (count, columns) of `views`; all fresh where
        the bucket's layout changed (DDP rebuilt its buckets)."""
        kept = self.states.get(index)
        if kept is None or kept[0] != views:
            kept = (views, [self.comm.make_state(count, columns) for count, columns in views])
            self.states[index] = kept
        return kept[1]

    def _view(self, gradient):
        """(count, columns) of the state the per-layer hook compresses `gradient` with, or None
        where it takes the dense mean (vectors; matrices PowerSGD would not shrink)."""
        if gradient.dim() < 2:
            return None
        if self.powersgd_rank is None:
            return (gradient.numel(), 0)
        rows = gradient.shape[0]
        columns = gradient.numel() // rows
        if (rows + columns) * self.powersgd_rank * self.min_compression_rate >= rows * columns:
            return None
        return (gradient.numel(), columns)

    def start(self, index, tensor, gradients=None):
        """Starts the mean over ranks of `tensor` (float32, contiguous) in place; returns a
        torch future that holds the tensor once done. Per layer, `gradients` are the
        bucket's views of `tensor`, one per parameter (`GradBucket.gradients()`)."""
        if self.comm.compressor == "none":
            requests = [self.comm.iallreduce(tensor, op="avg")]
        elif not self.per_layer or gradients is None:
            state, = self._bucket_states(index, ((tensor.numel(), 0),))
            requests = [self.comm.iallreduce(tensor, state, op="avg")]
        else:
            views = [self._view(g) for g in gradients]
            states = iter(self._bucket_states(index, tuple(v for v in views if v is not None)))
            requests = []
            for gradient, view in zip(gradients, views):
                flat = gradient.view(-1)
                if view is None:
                    requests.append(self.dense.iallreduce(flat, op="avg"))
                else:
                    requests.append(self.comm.iallreduce(flat, next(states), op="avg"))
        future = torch.futures.Future()
        self._pending.put((requests, future, tensor))
        return future


def allreduce_hook(state, bucket):
    """DDP communication hook: squall's allreduce (mean) of the bucket's flat buffer, or of
    each of its gradients (per layer)."""
    tensor = bucket.buffer()
    if tensor.dtype != torch.float32:
        raise TypeError("squall.torch.allreduce_hook: float32 gradients only, not %s"
                        % tensor.dtype)
    gradients = None
    if state.per_layer:
        gradients = bucket.gradients()
        begin, end = tensor.data_ptr(), tensor.data_ptr() + 4 * tensor.numel()
        for gradient in gradients:  # views of the buffer, which the future returns
            at = gradient.data_ptr()
            if at < begin or at + 4 * gradient.numel() > end or not gradient.is_contiguous():
                raise RuntimeError("squall.torch.allreduce_hook: a bucket gradient that is not "
                                   "a contiguous view of the bucket's buffer")
    return state.start(bucket.index(), tensor, gradients)
