# SPDX-License-Identifier: Apache-2.0
"""PyTorch DDP on Fashion-MNIST (a small CNN, CPU, gloo) with one gradient hook after another:
torch's own allreduce, torch's fp16 and PowerSGD hooks, and squall's hook with compressors.
Every rank of `squall-run -n P` (or torchrun) runs it; rank 0 prints, per hook and epoch, the
test accuracy, the seconds per epoch (slowest rank) and the gradient bytes this rank sent per
step (squall's hooks: counted by squall; torch's: the ring allreduce's 2 (P-1)/P of the bucket
bytes, fp16 half of that, PowerSGD from its matrices' shapes, computed, not measured).

    build/release/squall-run -n 4 env PYTHONPATH=$PWD/build/release/python \\
        /usr/bin/python3 examples/ddp_fashion_mnist.py --epochs 2 --hooks default,fp16,powersgd,none,cast:bf16
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

import squall.torch as sqt

DATA = "/usr/share/datasets/fashion-mnist"


def idx(name):
    with gzip.open(os.path.join(DATA, name)) as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def model_of():
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--train", type=int, default=60000, help="training images used")
    p.add_argument("--seed", type=int, default=0, help="the model's initialization and the "
                   "epochs' shuffles")
    p.add_argument("--hooks", default="default,fp16,powersgd,none,cast:bf16,topk:0.01+ef,"
                   "powersgd:4+ef", help="default, fp16, powersgd (torch's), or a squall "
                   "compressor name (squall's hook; none: its dense allreduce; PowerSGD per "
                   "layer, 'whole:powersgd:4+ef' on the whole bucket as one matrix)")
    args = p.parse_args()
    rank = int(os.environ.get("SQUALL_RANK", os.environ.get("RANK", "0")))
    size = int(os.environ.get("SQUALL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", rank=rank, world_size=size)
    else:
        dist.init_process_group("gloo", init_method="file:///tmp/squall-ddp-fm-%s" %
                                os.environ.get("SQUALL_JOB", "job"), rank=rank, world_size=size)
    torch.set_num_threads(1)
    x_train = torch.from_numpy(idx("train-images-idx3-ubyte.gz")[:args.train].astype(np.float32)
                               / 255.0).unsqueeze(1)
    y_train = torch.from_numpy(idx("train-labels-idx1-ubyte.gz")[:args.train].astype(np.int64))
    x_test = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz").astype(np.float32)
                              / 255.0).unsqueeze(1)
    y_test = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    steps = len(x_train) // (args.batch * size)
    if rank == 0:
        print("# DDP Fashion-MNIST: %d ranks, batch %d per rank, %d steps per epoch, lr %g"
              % (size, args.batch, steps, args.lr))
        print("%-16s %5s %9s %8s %14s" % ("hook", "epoch", "accuracy", "s/epoch",
                                           "bytes/step/rank"))
    for hook in args.hooks.split(","):
        torch.manual_seed(args.seed)
        model = model_of()
        ddp = nn.parallel.DistributedDataParallel(model)
        n_params = sum(q.numel() for q in model.parameters())
        state = None
        if hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif hook == "powersgd":
            ddp.register_comm_hook(powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=2),
                powerSGD_hook.powerSGD_hook)
        elif hook.startswith("whole:"):  # the whole bucket as one tensor, not per layer
            state = sqt.HookState(compressor=hook[len("whole:"):], per_layer=False)
            ddp.register_comm_hook(state, sqt.allreduce_hook)
        elif hook != "default":
            state = sqt.HookState(compressor=hook)
            ddp.register_comm_hook(state, sqt.allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        for epoch in range(1, args.epochs + 1):
            order = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(1000 * args.seed + epoch))
            sent_before = state.bytes_sent if state is not None else 0
            dist.barrier()
            start = time.perf_counter()
            ddp.train()
            for step in range(steps):
                pick = order[(step * size + rank) * args.batch:(step * size + rank + 1) * args.batch]
                loss = nn.functional.cross_entropy(ddp(x_train[pick]), y_train[pick])
                opt.zero_grad()
                loss.backward()
                opt.step()
            seconds = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            ddp.eval()
            with torch.no_grad():
                correct = (model(x_test).argmax(1) == y_test).sum().item()
            if state is not None:
                per_step = (state.bytes_sent - sent_before) / steps
            else:
                ring = 2 * (size - 1) / size * 4  # bytes a ring allreduce sends per float
                low_rank = sum((q.shape[0] + q.numel() // q.shape[0]) * 4 if q.dim() > 1
                               else q.numel() for q in model.parameters())
                per_step = {"default": ring * n_params, "fp16": ring * n_params / 2,
                            "powersgd": ring * low_rank}[hook]
            if rank == 0:
                print("%-16s %5d %8.2f%% %8.1f %14.0f" % (hook, epoch, 100.0 * correct / len(y_test),
                                                        seconds.item(), per_step), flush=True)
    dist.destroy_process_group()
    if rank == 0:
        try:
            os.remove("/tmp/squall-ddp-fm-%s" % os.environ.get("SQUALL_JOB", "job"))
        except FileNotFoundError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
