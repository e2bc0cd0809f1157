"""The socket transport's same-host shared-memory path with real processes: which pairs take
it, messages around the threshold and far larger than the ring (also a 4 KiB ring that wraps
thousands of times), receives posted before and after arrival, any-source, many tags both
ways, the facade's all_reduce / all_gather / reduce_scatter with every algorithm, a size
mismatch, SIGKILL of either end mid-transfer, malformed frames, and /dev/shm left clean.
Cross-memory attach is off here (it would carry the payloads instead of the ring)."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import collectives as dist
from collectives.algorithms import capabilities
from collectives.errors import CollectiveError, TransportError
from collectives.store import TCPStore
from collectives.transports import create
from collectives.transports import socket as sock_mod
from collectives.transports.socket.shm import SHM_DIR
from collectives.transports.socket import ANY_SOURCE, HEADER, SHM_CHUNK, SHM_CREDIT, SHM_MSG
from test_socket_transport import CTX, STORE_SECRET, ok, run_ranks

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm here")


@pytest.fixture(autouse=True)
def ring_not_direct_reads(monkeypatch):
    """These tests are about the ring: keep cross-memory attach (test_socket_cma.py) off, or
    same-host payloads would bypass the ring (ranks fork from here and inherit it)."""
    monkeypatch.setenv("COLLECTIVES_SOCKET_CMA", "0")

KIB, MIB = 1 << 10, 1 << 20


def _pattern(nbytes, seed):
    return ((np.arange(nbytes, dtype=np.uint64) * 2654435761 + seed) >> 7).astype(np.uint8)


def _names(t):
    """This rank's ring names: they must already be gone from /dev/shm."""
    return [ring.name for p in t._peers.values() for ring in (p.shm_out, p.shm_in) if ring]


def _gone(names):
    return [n for n in names if os.path.exists(os.path.join(SHM_DIR, n))]


# -- which pairs take shared memory -------------------------------------------------------------

def _who(t):
    return t.shm_peers, _names(t)


def test_same_host_pairs_use_shared_memory_and_unlink_at_once():
    outs = ok(run_ranks(3, _who), 3)
    for rank, (peers, names) in enumerate(outs):
        assert peers == [r for r in range(3) if r != rank]
        assert len(names) == 4 and not _gone(names)


@pytest.mark.parametrize("off", [{0: {}, 1: {}}, {1: {}}])
def test_shm_off_on_either_side_keeps_the_pair_on_tcp(off):
    env = {r: {"COLLECTIVES_SOCKET_SHM": "0"} for r in off}
    outs = ok(run_ranks(2, _who, env=env), 2)
    assert outs == [([], []), ([], [])]


# -- delivery -------------------------------------------------------------------------------

SIZES = [64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 1, 3 * MIB + 7, 40 * MIB, 999_983]


def _sizes(t, sizes, late):
    """Rank 0 sends every size to rank 1 on its own tag; rank 1 posts the ``late`` ones after
    the data is (mostly) in, the rest first."""
    if t.rank == 0:
        reqs = [t.isend(_pattern(n, i), 1, 10 + i) for i, n in enumerate(sizes)]
        t.wait_all(reqs, 60)
        t.recv(np.zeros(1), 1, 99, 60)
        return t.shm_peers
    bufs = [np.zeros(n, np.uint8) for n in sizes]
    reqs = [t.irecv(b, 0, 10 + i) for i, b in enumerate(bufs) if i not in late]
    time.sleep(0.3)
    reqs += [t.irecv(b, 0, 10 + i) for i, b in enumerate(bufs) if i in late]
    t.wait_all(reqs, 60)
    t.send(np.zeros(1), 0, 99, 60)
    return [bool((b == _pattern(len(b), i)).all()) for i, b in enumerate(bufs)]


def test_sizes_around_the_threshold_and_far_above_the_ring():
    outs = ok(run_ranks(2, _sizes, SIZES, {1, 4, 5}), 2)
    assert outs[0] == [1]
    assert outs[1] == [True] * len(SIZES)


def test_tiny_ring_wraps_many_times():
    env = {r: {"COLLECTIVES_SOCKET_SHM_BYTES": "4K", "COLLECTIVES_SOCKET_SHM_MIN": "1000"}
           for r in range(2)}
    sizes = [999, 1000, 4095, 4096, 4097, 12_345, 3 * MIB + 1]
    outs = ok(run_ranks(2, _sizes, sizes, {2, 6}, env=env), 2)
    assert outs[0] == [1] and outs[1] == [True] * len(sizes)


def _any_source(t):
    n = 200 * KIB + 3
    if t.rank == 0:
        bufs = [np.empty(n, np.uint8) for _ in range(t.size - 1)]
        reqs = [t.irecv(b, ANY_SOURCE, 3) for b in bufs]
        t.wait_all(reqs, 30)
        return sorted((r.source, bool((b == _pattern(n, r.source)).all())) for r, b in zip(reqs, bufs))
    time.sleep(0.1 * (t.rank - 1))
    t.send(_pattern(n, t.rank), 0, 3, 30)
    return None


def test_any_source_over_shared_memory():
    assert ok(run_ranks(3, _any_source), 3)[0] == [(1, True), (2, True)]


def _many_tags(t):
    """Both ranks stream 24 messages each way at once (TCP- and ring-sized mixed, one tag
    each, receives posted in reverse order): frames of both kinds and credits interleave."""
    peer = 1 - t.rank
    sizes = [(i * 7919) % (300 * KIB) + (i % 3) * 2 * MIB + 1 for i in range(24)]
    bufs = [np.zeros(n, np.uint8) for n in sizes]
    reqs = [t.irecv(bufs[i], peer, 100 + i) for i in reversed(range(24))]
    reqs += [t.isend(_pattern(n, 1000 * t.rank + i), peer, 100 + i) for i, n in enumerate(sizes)]
    t.wait_all(reqs, 60)
    return all((b == _pattern(len(b), 1000 * peer + i)).all() for i, b in enumerate(bufs))


def test_many_tags_both_directions():
    env = {r: {"COLLECTIVES_SOCKET_SHM_BYTES": "1M"} for r in range(2)}
    assert ok(run_ranks(2, _many_tags, env=env), 2) == [True, True]


def _mismatch(t):
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


def test_size_mismatch_is_a_clear_error():
    message, after = ok(run_ranks(2, _mismatch), 2)[1]
    assert f"{200 * KIB} bytes" in message and f"expects {100 * KIB}" in message, message
    assert after


# -- the facade -----------------------------------------------------------------------------

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


@pytest.mark.parametrize("size,count", [(2, 300_001), (3, 70_003), (4, 40_000)])
def test_facade_collectives_every_algorithm(size, count):
    for peers, failures in run_facade(size, count):
        assert len(peers) == size - 1 and failures == [], failures


# -- faults ---------------------------------------------------------------------------------

def _killed_mid_transfer(t, victim):
    """Rank 0 streams 40 MiB messages to rank 1; ``victim`` SIGKILLs itself 0.3 s in. The
    survivor must raise TransportError within 5 s, and no ring name may remain."""
    names = _names(t)
    if t.rank == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    buf = _pattern(40 * MIB, 1) if t.rank == 0 else np.empty(40 * MIB, np.uint8)
    t0 = time.monotonic()
    try:
        for i in range(1000):
            (t.send if t.rank == 0 else t.recv)(buf, 1 - t.rank, i, 30)
            t0 = time.monotonic()
    except TransportError as exc:
        return time.monotonic() - t0, str(exc), names
    return None


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_during_a_large_transfer(victim):
    got = run_ranks(2, _killed_mid_transfer, victim)
    survivor = 1 - victim
    status, value = got[survivor]
    assert status == "ok" and value is not None, value
    elapsed, message, names = value
    assert elapsed < 5 and f"rank {victim}" in message, (elapsed, message)
    assert len(names) == 2 and _gone(names) == []


# -- malformed frames (two transports in threads of this process) -----------------------------

def _pair(env=None):
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


def _inject(t, peer, frame):
    p = t._peers[peer]
    with p.send_lock:
        p.sock.setblocking(True)
        p.sock.sendall(frame)
        p.sock.setblocking(False)


@pytest.mark.parametrize("frames,what", [
    ([HEADER.pack(SHM_CHUNK, bytes(7), 0, 100)], "chunk at offset 0"),
    ([HEADER.pack(SHM_MSG, bytes(7), 5, 1 << 20), HEADER.pack(SHM_CHUNK, bytes(7), (8 << 20) - 10, 100)],
     "chunk at offset"),
    ([HEADER.pack(SHM_MSG, bytes(7), 5, 1 << 20), HEADER.pack(SHM_CHUNK, bytes(7), 0, 2 << 20)], "chunk at offset 0"),
    ([HEADER.pack(SHM_CREDIT, bytes(7), 0, 1)], "credit of 1 bytes"),
    ([HEADER.pack(SHM_MSG, bytes(7), 5, sock_mod.MAX_MESSAGE + 1)], "announcement"),
    ([HEADER.pack(SHM_MSG, bytes(7), 5, 1 << 20), HEADER.pack(0, bytes(7), 5, 10)], "malformed frame"),
])
def test_malformed_shm_frames_fail_the_transport_naming_the_peer(frames, what):
    store, (t0, t1) = _pair()
    try:
        assert t0.shm_peers == [1] and t1.shm_peers == [0]
        _inject(t0, 1, b"".join(frames))
        with pytest.raises(TransportError) as info:
            t1.recv(np.zeros(8), 0, 77, 5)
        assert "rank 0" in str(info.value) and what in str(info.value), str(info.value)
    finally:
        t0.close(timeout=2)
        t1.close(timeout=2)
        store.close()


def _segments(t):
    return t.segment_bytes


def test_segments_only_where_some_pair_is_on_tcp():
    """Every pair on one host: whole messages on every rank; one rank off shared memory: every
    rank keeps cutting (both ends of a message must cut it alike)."""
    assert ok(run_ranks(3, _segments), 3) == [None, None, None]
    mixed = ok(run_ranks(3, _segments, env={2: {"COLLECTIVES_SOCKET_SHM": "0"}}), 3)
    assert mixed == [sock_mod.SEGMENT_BYTES] * 3 and sock_mod.SEGMENT_BYTES
