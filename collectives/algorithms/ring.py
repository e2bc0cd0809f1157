"""Ring algorithms: every rank talks only to its neighbours, right = rank+1, left = rank-1.

all_reduce: reduce-scatter then all-gather around the ring; 2(p-1) steps of n/p elements.
Cost 2(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ: bandwidth-optimal, latency linear in p, so it wins
for large n. Uneven blocks (n not divisible by p, even n < p) are handled by ``partition``.
"""
from .schedule import algorithm, partition, sendrecv


@algorithm("all_reduce", "ring")
def all_reduce(rank, size, count):
    """Ring: reduce-scatter then all-gather; 2(p-1) steps of count/p elements each."""
    block = partition(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        yield sendrecv(right, block[(rank - s) % size], left, block[(rank - s - 1) % size],
                       reduce=True)
    for s in range(size - 1):
        yield sendrecv(right, block[(rank - s + 1) % size], left, block[(rank - s) % size])
