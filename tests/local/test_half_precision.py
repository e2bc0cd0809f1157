"""float16 and bfloat16 reductions round at every hop of the schedule: each reduction step
adds in float32 and rounds the partial sum to the dtype (it travels in the dtype), so a sum
over p ranks is rounded p-1 times, in the algorithm's order, the same bits on every rank; it
is not the float32 sum rounded once (what the README once said)."""
import numpy as np
import pytest

import collectives as dist
from collectives.kernels.reduce import BFLOAT16
from local_ranks import spawn

SIZE = 4
COUNT = 999                       # blocks of 250, 250, 250, 249 around the ring


def _inputs(dtype):
    rng = np.random.default_rng(7)
    return [(rng.standard_normal(COUNT) * 10).astype(dtype) for _ in range(SIZE)]


def _ring_hop_by_hop(inputs):
    """The ring all_reduce's sums: block b starts on rank b and gathers ranks b+1, b+2, ...
    one hop each, every partial sum rounded to the dtype (numpy's float16 and ml_dtypes'
    bfloat16 addition: the float32 sum rounded once, per addition)."""
    dtype = inputs[0].dtype
    q, r = divmod(COUNT, SIZE)
    bounds = np.cumsum([0] + [q + (1 if i < r else 0) for i in range(SIZE)])
    out = np.empty(COUNT, dtype)
    for b in range(SIZE):
        lo, hi = bounds[b], bounds[b + 1]
        acc = inputs[b][lo:hi].copy()
        for hop in range(1, SIZE):
            acc = (acc.astype(np.float32) + inputs[(b + hop) % SIZE][lo:hi].astype(np.float32)
                   ).astype(dtype)
        out[lo:hi] = acc
    return out


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
def test_ring_all_reduce_rounds_each_hop_to_the_dtype(dtype):
    inputs = _inputs(dtype)

    def fn(rank):
        x = inputs[rank].copy()
        dist.all_reduce(x, algorithm="ring")
        return x
    results = spawn(SIZE, fn)
    expected = _ring_hop_by_hop(inputs)
    for rank, got in enumerate(results):
        assert got.tobytes() == expected.tobytes(), rank
    once = sum(a.astype(np.float32) for a in inputs).astype(dtype)
    differs = int(np.count_nonzero(expected.astype(np.float32) != once.astype(np.float32)))
    assert differs > COUNT // 10, differs          # rounded per hop, visibly not once
