# SPDX-License-Identifier: Apache-2.0
# The Python package under every rank of a job: `squall-run -n 2 python3 -m pytest ...` or
# `mpiexec -n 3 python3 -m pytest ...` (ctest collective.python.*). Every rank runs the same
# tests in the same order (they are collective); each rank's input is a function of its rank,
# so every rank computes the expected result with NumPy, exactly (small integers).
import os

import numpy as np
import pytest
import torch

import squall


@pytest.fixture(scope="module")
def comm():
    return squall.Communicator()


def inputs(rank, n, dtype, salt=0):
    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + rank * 13 + salt) % 61 - 30).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("n", [1, 1000, 70001])
@pytest.mark.parametrize("op", ["sum", "min", "max", "avg"])
def test_allreduce_against_numpy(comm, dtype, n, op):
    if op == "avg" and np.issubdtype(dtype, np.integer):
        with pytest.raises(ValueError, match="avg"):
            comm.allreduce(inputs(comm.rank, n, dtype), op=op)
        return
    everyone = np.stack([inputs(r, n, dtype) for r in range(comm.size)])
    want = {"sum": everyone.sum(0), "min": everyone.min(0), "max": everyone.max(0),
            "avg": everyone.sum(0) / comm.size}[op].astype(dtype)
    x = inputs(comm.rank, n, dtype)
    assert comm.allreduce(x, op=op) is x  # in place
    np.testing.assert_array_equal(x, want)


def test_torch_tensors_in_place_without_copies(comm):
    t = torch.arange(1000, dtype=torch.float32) + comm.rank
    view = t[:]  # shares t's memory
    comm.allreduce(t)
    expected = torch.arange(1000, dtype=torch.float32) * comm.size + sum(range(comm.size))
    assert torch.equal(view, expected)
    with pytest.raises(ValueError, match="contiguous"):
        comm.allreduce(torch.zeros(10, 10).t())
    for dtype in (torch.float64, torch.int32, torch.int64):
        t = torch.arange(70001, dtype=dtype) % 97 - comm.rank
        comm.allreduce(t, op="max")
        assert torch.equal(t, torch.arange(70001, dtype=dtype) % 97)
        comm.iallreduce(t).wait()
        assert torch.equal(t, (torch.arange(70001, dtype=dtype) % 97) * comm.size)
    with pytest.raises(TypeError, match="torch.float16"):
        comm.allreduce(torch.zeros(10, dtype=torch.float16))
    with pytest.raises(TypeError, match="not list"):
        comm.allreduce([1.0, 2.0])


def test_reduce_scatter_allgather_broadcast(comm):
    n = 3001 * comm.size
    x = inputs(comm.rank, n, np.float32, 1)
    comm.reduce_scatter(x)
    offset, count = comm.block(n)
    want = sum(inputs(r, n, np.float32, 1) for r in range(comm.size))
    np.testing.assert_array_equal(x[offset:offset + count], want[offset:offset + count])
    mine = inputs(comm.rank, 777, np.int64, 2)
    out = np.zeros(777 * comm.size, np.int64)
    comm.allgather(mine, out)
    np.testing.assert_array_equal(out, np.concatenate([inputs(r, 777, np.int64, 2)
                                                       for r in range(comm.size)]))
    for root in range(comm.size):
        y = inputs(comm.rank, 5000, np.float64, root)
        comm.broadcast(y, root)
        np.testing.assert_array_equal(y, inputs(root, 5000, np.float64, root))


def test_nonblocking_in_flight_waited_in_reverse(comm):
    arrays = [inputs(comm.rank, n, np.float32, n % 5) for n in (10, 100000, 3, 65536)]
    requests = [comm.iallreduce(a) for a in arrays]
    for r in reversed(requests):
        r.wait()
    for a, n in zip(arrays, (10, 100000, 3, 65536)):
        np.testing.assert_array_equal(a, sum(inputs(r, n, np.float32, n % 5)
                                             for r in range(comm.size)))
    # a blocking call made while requests are in flight runs after them, on every rank
    big = inputs(comm.rank, 1 << 20, np.float64, 1)
    small = inputs(comm.rank, 1000, np.int32, 2)
    request = comm.iallreduce(big)
    comm.allreduce(small, op="min")
    np.testing.assert_array_equal(small, np.min([inputs(r, 1000, np.int32, 2)
                                                 for r in range(comm.size)], axis=0))
    request.wait()
    np.testing.assert_array_equal(big, sum(inputs(r, 1 << 20, np.float64, 1)
                                           for r in range(comm.size)))
    r = comm.ibarrier()
    while not r.test():
        pass
    r.wait()


def test_compressed_allreduce():
    bf16 = squall.Communicator(compressor="cast:bf16")
    rng = np.random.default_rng(7)
    everyone = rng.standard_normal((bf16.size, 50021)).astype(np.float32)
    x = everyone[bf16.rank].copy()
    state = bf16.make_state(x.size)
    bf16.allreduce(x, state, op="avg")
    exact = everyone.astype(np.float64).mean(0)
    bound = 2 * bf16.size * 2.0 ** -8 * np.abs(everyone).sum(0) / bf16.size
    assert np.all(np.abs(x - exact) <= bound)
    assert state.step == 1
    with pytest.raises(ValueError, match="compression state of 50021"):
        bf16.allreduce(np.zeros(10, np.float32), state)
    with pytest.raises(TypeError, match="float32"):
        bf16.allreduce(np.zeros(50021, np.float64), state)
    with pytest.raises(ValueError, match="dense collectives"):
        bf16.allreduce(np.zeros(10, np.float32))
    # error feedback: what top-k leaves out stays in the residual, so over steps the sum of
    # the results approaches the sum of the inputs
    topk = squall.Communicator(compressor="topk:0.1+ef")
    state = topk.make_state(4096)
    total_in = np.zeros(4096)
    total_out = np.zeros(4096)
    for step in range(30):
        g = np.random.default_rng(100 * step + topk.rank).standard_normal(4096).astype(np.float32)
        total_in += np.sum([np.random.default_rng(100 * step + r).standard_normal(4096)
                            .astype(np.float32) for r in range(topk.size)], axis=0)
        topk.allreduce(g, state)
        total_out += g
    assert state.step == 30
    assert np.abs(total_out - total_in).max() < 0.25 * np.abs(total_in).max()


def test_powersgd_layer_view():
    # each rank a rank-1 32 x 48 "layer": at rank 4 the sum of P <= 4 of them is exact in the
    # layer's own view (columns=48), not in the default near-square view of the 1536 elements
    psgd = squall.Communicator(compressor="powersgd:4")
    i = np.arange(32)[:, None]
    j = np.arange(48)[None, :]

    def layer(r):
        return (np.sin(0.3 * i * (r + 1) + r) * np.cos(0.45 * j * (r + 2))).astype(np.float32)

    exact = np.sum([layer(r).astype(np.float64) for r in range(psgd.size)], axis=0).ravel()
    own = psgd.make_state(32 * 48, columns=48)
    square = psgd.make_state(32 * 48)
    for step in range(2):
        x = layer(psgd.rank).ravel().copy()
        psgd.allreduce(x, own)
        assert np.abs(x - exact).max() <= 1e-4 * np.abs(exact).max()
    y = layer(psgd.rank).ravel().copy()
    psgd.allreduce(y, square)
    assert np.abs(y - exact).max() > 1e-2 * np.abs(exact).max()
    with pytest.raises(ValueError, match="PowerSGD"):
        squall.Communicator(compressor="cast:bf16").make_state(100, columns=10)


def test_errors_are_python_exceptions(comm):
    with pytest.raises(ValueError, match="root"):
        squall.Communicator().broadcast(np.zeros(10, np.float32), comm.size)
    with pytest.raises(TypeError, match="float32, float64, int32 or int64"):
        comm.allreduce(np.zeros(10, np.float16))
    with pytest.raises(ValueError, match="unknown compressor"):
        squall.Communicator(compressor="zip")
    with pytest.raises(ValueError, match="op"):
        comm.allreduce(np.zeros(10, np.float32), op="prod")


@pytest.mark.skipif(not squall.has_mpi or "OMPI_COMM_WORLD_SIZE" not in os.environ,
                    reason="not started by Open MPI's mpiexec")
def test_over_mpi():
    over_mpi = squall.Communicator(transport="mpi")
    x = inputs(over_mpi.rank, 10000, np.float64, 3)
    over_mpi.allreduce(x)
    np.testing.assert_array_equal(x, sum(inputs(r, 10000, np.float64, 3)
                                         for r in range(over_mpi.size)))
    sparse = squall.Communicator(transport="mpi", compressor="cast:fp16")
    y = inputs(over_mpi.rank, 1000, np.float32, 4)
    sparse.allreduce(y, sparse.make_state(1000))
    np.testing.assert_array_equal(y, sum(inputs(r, 1000, np.float32, 4)
                                         for r in range(over_mpi.size)))
