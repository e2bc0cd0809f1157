"""Ranks of the socket transport as forked processes of the test: ``run_ranks(size, fn, *args)``
runs ``fn(transport, *args)`` on every rank (a fresh TCPStore, or the one given) and returns
what each returned or raised; ``ok`` asserts every rank returned and gives the values.

Also the cases that the shared-memory and cross-memory-attach tests both run (the same
traffic, each path turned on by its own settings)."""
import multiprocessing
import os
import signal
import threading
import time
import traceback

import numpy as np

import collectives as dist
from collectives.algorithms import capabilities
from collectives.errors import CollectiveError, TransportError
from collectives.store import TCPStore
from collectives.transports import create
from collectives.transports.socket.shm import SHM_DIR
from collectives.transports.socket import wire

CTX = multiprocessing.get_context("fork")
STORE_SECRET = "store-secret-of-the-tests"


def _rank_main(rank, size, port, fn, args, results, env):
    os.environ.update(env.get(rank, {}))
    try:
        store = TCPStore("127.0.0.1", port, timeout=20, secret=STORE_SECRET)
        transport = create("socket", rank=rank, world_size=size, store=store,
                           timeout=float(env.get("setup_timeout", 20)))
        out = fn(transport, *args)
        transport.close()
        results.put((rank, "ok", out))
    except BaseException as exc:            # report everything to the parent
        results.put((rank, "error", (type(exc).__name__, str(exc), traceback.format_exc())))
    results.close()
    results.join_thread()               # flush before os._exit skips the feeder thread
    os._exit(0)


def run_ranks(size, fn, *args, env=None, limit=60, store=None):
    """Run fn(transport, *args) on ``size`` forked ranks; {rank: (status, value)}."""
    own = store is None
    store = store or TCPStore("127.0.0.1", 0, is_master=True, timeout=20, secret=STORE_SECRET)
    results = CTX.Queue()
    procs = [CTX.Process(target=_rank_main, args=(r, size, store.port, fn, args, results, env or {}))
             for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + limit
    try:
        while len(got) < size and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.2)
                got[rank] = (status, value)
            except Exception:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        if own:
            store.close()
    return got


def ok(got, size):
    assert len(got) == size, f"missing ranks: {sorted(set(range(size)) - set(got))}"
    for rank, (status, value) in sorted(got.items()):
        assert status == "ok", f"rank {rank} failed: {value[2]}"
    return [got[r][1] for r in range(size)]



# -- cases the shared-memory and cross-memory-attach tests share -------------------------------

KIB, MIB = 1 << 10, 1 << 20


def pattern(nbytes, seed):
    return ((np.arange(nbytes, dtype=np.uint64) * 2654435761 + seed) >> 7).astype(np.uint8)


def ring_names(t):
    """This rank's ring names: they must already be gone from /dev/shm."""
    return [ring.name for p in t._peers.values() for ring in (p.shm_out, p.shm_in) if ring]


def gone_from_shm(names):
    return [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]


def send_sizes(t, sizes, late):
    """Rank 0 sends every size to rank 1 on its own tag; rank 1 posts the ``late`` ones after
    the data is (mostly) in, the rest first."""
    if t.rank == 0:
        reqs = [t.isend(pattern(n, i), 1, 10 + i) for i, n in enumerate(sizes)]
        t.wait_all(reqs, 60)
        t.recv(np.zeros(1), 1, 99, 60)
        return t.shm_peers
    bufs = [np.zeros(n, np.uint8) for n in sizes]
    reqs = [t.irecv(b, 0, 10 + i) for i, b in enumerate(bufs) if i not in late]
    time.sleep(0.3)     # makes the late path likely; the test holds for either order
    reqs += [t.irecv(b, 0, 10 + i) for i, b in enumerate(bufs) if i in late]
    t.wait_all(reqs, 60)
    t.send(np.zeros(1), 0, 99, 60)
    return [bool((b == pattern(len(b), i)).all()) for i, b in enumerate(bufs)]


def many_tags(t):
    """Both ranks stream 24 messages each way at once (TCP- and ring-sized mixed, one tag
    each, receives posted in reverse order): frames of both kinds and credits interleave."""
    peer = 1 - t.rank
    sizes = [(i * 7919) % (300 * KIB) + (i % 3) * 2 * MIB + 1 for i in range(24)]
    bufs = [np.zeros(n, np.uint8) for n in sizes]
    reqs = [t.irecv(bufs[i], peer, 100 + i) for i in reversed(range(24))]
    reqs += [t.isend(pattern(n, 1000 * t.rank + i), peer, 100 + i) for i, n in enumerate(sizes)]
    t.wait_all(reqs, 60)
    return all((b == pattern(len(b), 1000 * peer + i)).all() for i, b in enumerate(bufs))


def size_mismatch(t):
    if t.rank == 0:
        t.send(np.zeros(200 * KIB, np.uint8), 1, 2, 10)
        t.send(np.full(100 * KIB, 7, np.uint8), 1, 3, 10)
        return None
    try:
        t.recv(np.zeros(100 * KIB, np.uint8), 0, 2, 10)
        message = "no error"
    except CollectiveError as exc:
        message = str(exc)
    after = np.zeros(100 * KIB, np.uint8)
    t.recv(after, 0, 3, 10)            # the pair keeps working
    return message, bool((after == 7).all())


def _facade_rank(rank, size, port, count, results):
    try:
        store = TCPStore("127.0.0.1", port, timeout=20, secret=STORE_SECRET)
        dist.init_process_group("socket", store=store, rank=rank, world_size=size, timeout=60)
        try:
            results.put((rank, "ok", _facade(rank, size, count)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:            # report everything to the parent
        results.put((rank, "error", (type(exc).__name__, str(exc), repr(exc))))
    results.close()
    results.join_thread()
    os._exit(0)


def _facade(rank, size, count):
    """Every algorithm of three collectives through the facade, against numpy."""
    failures = []
    caps = capabilities()
    rng = np.random.default_rng(0)
    inputs = [rng.integers(-50, 50, count * size).astype(np.float32) for _ in range(size)]
    for algorithm in caps["all_reduce"]:
        x = inputs[rank].copy()
        dist.all_reduce(x, algorithm=algorithm)
        if not np.array_equal(x, sum(inputs)):
            failures.append(("all_reduce", algorithm))
    for algorithm in caps["all_gather"]:
        out = np.empty(count * size, np.float32)
        dist.all_gather_into_tensor(out, inputs[rank][:count], algorithm=algorithm)
        if not np.array_equal(out, np.concatenate([i[:count] for i in inputs])):
            failures.append(("all_gather", algorithm))
    for algorithm in caps["reduce_scatter"]:
        out = np.empty(count, np.float32)
        dist.reduce_scatter_tensor(out, inputs[rank], algorithm=algorithm)
        if not np.array_equal(out, sum(inputs)[rank * count:(rank + 1) * count]):
            failures.append(("reduce_scatter", algorithm))
    from collectives import state
    return state.world().transport.shm_peers, failures


def run_facade(size, count):
    """_facade_rank on ``size`` forked ranks: each rank's (shm peers, failures)."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=20, secret=STORE_SECRET)
    results = CTX.Queue()
    procs = [CTX.Process(target=_facade_rank, args=(r, size, store.port, count, results))
             for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(size):
            rank, status, value = results.get(timeout=60)
            got[rank] = (status, value)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        store.close()
    return ok(got, size)


def killed_mid_transfer(t, victim):
    """Rank 0 streams 40 MiB messages to rank 1; ``victim`` SIGKILLs itself 0.3 s in. The
    survivor must raise TransportError within 5 s, and no ring name may remain."""
    names = ring_names(t)
    if t.rank == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    buf = pattern(40 * MIB, 1) if t.rank == 0 else np.empty(40 * MIB, np.uint8)
    t0 = time.monotonic()
    try:
        for i in range(1000):
            (t.send if t.rank == 0 else t.recv)(buf, 1 - t.rank, i, 30)
            t0 = time.monotonic()
    except TransportError as exc:
        return time.monotonic() - t0, str(exc), names
    return None


def transport_pair(env=None):
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=20, secret=STORE_SECRET)
    out = [None, None]

    def make(rank):
        out[rank] = create("socket", rank=rank, world_size=2,
                           store=TCPStore("127.0.0.1", store.port, timeout=20, secret=STORE_SECRET),
                           timeout=20)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return store, out


def inject(t, peer, frames, sealed=True):
    """Write ``frames`` to ``peer`` as rank ``t.rank`` would (each closed by its tag, as a rank
    of the job holds the keys), or raw (``sealed=False``: as a relay that does not)."""
    p = t._peers[peer]
    with p.send_lock:
        p.sock.setblocking(True)
        for frame in frames:
            # as the transport seals them: a payload's header and payload apart, any other
            # frame (a CMA_MSG's address included) whole
            split = frame[0] in (wire.DATA, wire.ABORT) and len(frame) > wire.HEADER.size
            head, body = (frame[:wire.HEADER.size], frame[wire.HEADER.size:]) if split \
                else (frame, None)
            p.sock.sendall(frame + (bytes(p.auth.seal(head, body)) if sealed else b""))
        p.sock.setblocking(False)
