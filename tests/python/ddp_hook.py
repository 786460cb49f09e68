# SPDX-License-Identifier: Apache-2.0
# squall.torch.allreduce_hook under torch DDP (CPU, gloo), every rank of `squall-run -n P`
# (ctest collective.python_ddp_hook): the same small model, data and seed trained three ways
# for 30 steps: DDP's own allreduce, squall's hook with no compressor (the mean: parameters
# must match DDP's to float rounding), and squall's hook with bf16, top-k 10% + error feedback
# and PowerSGD (the loss must fall by 10% and end within 10% of DDP's). DDP's bucket rebuild after
# the first step is exercised (one bucket of the whole model, then two of other sizes: each gets
# a fresh state). PowerSGD rank 4 + error feedback runs per layer: a state for each weight
# PowerSGD shrinks, in the weight's own out x in view; the biases and the 4 x 512 weight dense.
# Exit 0 on success; the failing check is printed.
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import squall.torch as sqt

rank = int(os.environ["SQUALL_RANK"])
size = int(os.environ["SQUALL_WORLD_SIZE"])
job = os.environ.get("SQUALL_JOB", "ddp")
dist.init_process_group("gloo", init_method="file:///tmp/squall-ddp-%s" % job, rank=rank,
                        world_size=size)
torch.set_num_threads(1)


def train(hook_state):
    torch.manual_seed(0)
    # above DDP's first bucket (1 MB), so that the rebuilt buckets are two of new sizes
    model = nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 4))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, sqt.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(32, 4, generator=teacher)
    losses = []
    for step in range(30):
        x = torch.randn(64, 32, generator=g)
        y = (x @ w).argmax(1)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def fail(what):
    print("rank %d: FAILED: %s" % (rank, what), flush=True)
    sys.exit(1)


reference, ref_losses = train(None)
dense_state = sqt.HookState()
dense, dense_losses = train(dense_state)
for a, b in zip(reference, dense):
    if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
        fail("squall's dense hook: parameters differ from DDP's by %g" % (a - b).abs().max())
if dense_state.bytes_sent == 0:
    fail("the hook never ran")
if len(dense_state.states) != 0:
    fail("the dense hook kept compression states")
for name in ("cast:bf16", "topk:0.1+ef", "powersgd:4+ef"):
    state = sqt.HookState(compressor=name)
    _, losses = train(state)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    ref_last = sum(ref_losses[-3:]) / 3
    print("rank %d: %s loss %.3f -> %.3f (DDP: %.3f), %d bucket states" %
          (rank, name, first, last, ref_last, len(state.states)), flush=True)
    if not last < 0.9 * first:
        fail("%s: the loss did not fall (%.3f -> %.3f)" % (name, first, last))
    if last > 1.1 * ref_last + 0.02:
        fail("%s: the loss ended at %.3f, DDP's at %.3f" % (name, last, ref_last))
    if len(state.states) < 2:
        fail("%s: fewer than two buckets had a state" % name)
    if name.startswith("powersgd"):  # per layer: the two large weights, in their own view
        views = sorted(v for layout, _ in state.states.values() for v in layout)
        if views != [(32 * 512, 32), (512 * 512, 512)]:
            fail("%s: per-layer states of %s, not the two weights' views" % (name, views))
dist.destroy_process_group()
if rank == 0:
    try:
        os.remove("/tmp/squall-ddp-%s" % job)
    except FileNotFoundError:
        pass
print("rank %d: ddp hook passed" % rank, flush=True)
