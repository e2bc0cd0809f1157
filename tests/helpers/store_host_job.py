"""One rank of the bench's StoreHost under the launcher (test_bench_nccl_launcher): barriers
that hold the early ranks, max and sum across ranks, and no round's keys left behind. Prints
``ok RANK LEFT`` (LEFT: keys of finished rounds still in the store)."""
import time

from collectives.bench.timing import STORE_PREFIX, StoreHost
from collectives.rendezvous import rendezvous


def main():
    store, rank, size = rendezvous("env://", timeout=30)
    host = StoreHost(store, rank, size, timeout=30)
    for k in range(5):
        time.sleep(0.05 * rank * (k % 2))         # stagger: a barrier must hold the early ones
        store.add("entered/%d" % k, 1)
        host.barrier()
        entered = int(store.add("entered/%d" % k, 0))
        assert entered == size, (k, entered)
        t = host.max(0.5 + rank + k / 3)
        w = host.sum(rank * 10 + k)
        assert t == 0.5 + (size - 1) + k / 3, t
        assert w == 10 * size * (size - 1) // 2 + size * k, w
    host.barrier()      # round 16: each rank drops its round-15 key
    host.barrier()      # round 17: every rank is past 16, so rounds 1-15 are all gone
    rounds = ["%s/%d/%s" % (STORE_PREFIX, r, part) for r in range(1, 16)
              for part in ["arrived", "release"] + [str(q) for q in range(size)]]
    print("ok", rank, sum(store.check([key]) for key in rounds))
    host.close()


if __name__ == "__main__":
    main()
