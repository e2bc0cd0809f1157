"""The socket transport's same-host shared-memory path with real processes: which pairs take
it, messages around the threshold and far larger than the ring (also a 4 KiB ring that wraps
thousands of times), receives posted before and after arrival, any-source, many tags both
ways, the facade's all_reduce / all_gather / reduce_scatter with every algorithm, a size
mismatch, SIGKILL of either end mid-transfer, malformed frames, and /dev/shm left clean.
Cross-memory attach is off here (it would carry the payloads instead of the ring)."""
import os
import time

import numpy as np
import pytest

from collectives.errors import TransportError
from collectives.transports import socket as sock_mod
from collectives.transports.socket.shm import SHM_DIR
from collectives.transports.socket import ANY_SOURCE, HEADER, SHM_CHUNK, SHM_CREDIT, SHM_MSG
from socket_ranks import (KIB, MIB, gone_from_shm, inject, killed_mid_transfer, many_tags, ok,
                          pattern, ring_names, run_facade, run_ranks, send_sizes, size_mismatch,
                          transport_pair)

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason="no /dev/shm here")


@pytest.fixture(autouse=True)
def ring_not_direct_reads(monkeypatch):
    """These tests are about the ring: keep cross-memory attach (test_socket_cma.py) off, or
    same-host payloads would bypass the ring (ranks fork from here and inherit it)."""
    monkeypatch.setenv("COLLECTIVES_SOCKET_CMA", "0")

# -- which pairs take shared memory -------------------------------------------------------------

def _who(t):
    return t.shm_peers, ring_names(t)


def test_same_host_pairs_use_shared_memory_and_unlink_at_once():
    outs = ok(run_ranks(3, _who), 3)
    for rank, (peers, names) in enumerate(outs):
        assert peers == [r for r in range(3) if r != rank]
        assert len(names) == 4 and not gone_from_shm(names)


@pytest.mark.parametrize("off", [{0: {}, 1: {}}, {1: {}}])
def test_shm_off_on_either_side_keeps_the_pair_on_tcp(off):
    env = {r: {"COLLECTIVES_SOCKET_SHM": "0"} for r in off}
    outs = ok(run_ranks(2, _who, env=env), 2)
    assert outs == [([], []), ([], [])]


# -- delivery -------------------------------------------------------------------------------

SIZES = [64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 1, 3 * MIB + 7, 40 * MIB, 999_983]


def test_sizes_around_the_threshold_and_far_above_the_ring():
    outs = ok(run_ranks(2, send_sizes, SIZES, {1, 4, 5}), 2)
    assert outs[0] == [1]
    assert outs[1] == [True] * len(SIZES)


def test_tiny_ring_wraps_many_times():
    env = {r: {"COLLECTIVES_SOCKET_SHM_BYTES": "4K", "COLLECTIVES_SOCKET_SHM_MIN": "1000"}
           for r in range(2)}
    sizes = [999, 1000, 4095, 4096, 4097, 12_345, 3 * MIB + 1]
    outs = ok(run_ranks(2, send_sizes, sizes, {2, 6}, env=env), 2)
    assert outs[0] == [1] and outs[1] == [True] * len(sizes)


def _any_source(t):
    n = 200 * KIB + 3
    if t.rank == 0:
        bufs = [np.empty(n, np.uint8) for _ in range(t.size - 1)]
        reqs = [t.irecv(b, ANY_SOURCE, 3) for b in bufs]
        t.wait_all(reqs, 30)
        return sorted((r.source, bool((b == pattern(n, r.source)).all())) for r, b in zip(reqs, bufs))
    time.sleep(0.1 * (t.rank - 1))     # arrivals spread on purpose; any order must work
    t.send(pattern(n, t.rank), 0, 3, 30)
    return None


def test_any_source_over_shared_memory():
    assert ok(run_ranks(3, _any_source), 3)[0] == [(1, True), (2, True)]


def test_many_tags_both_directions():
    env = {r: {"COLLECTIVES_SOCKET_SHM_BYTES": "1M"} for r in range(2)}
    assert ok(run_ranks(2, many_tags, env=env), 2) == [True, True]


def test_size_mismatch_is_a_clear_error():
    message, after = ok(run_ranks(2, size_mismatch), 2)[1]
    assert f"{200 * KIB} bytes" in message and f"expects {100 * KIB}" in message, message
    assert after


# -- the facade -----------------------------------------------------------------------------

@pytest.mark.parametrize("size,count", [(2, 300_001), (3, 70_003), (4, 40_000)])
def test_facade_collectives_every_algorithm(size, count):
    for peers, failures in run_facade(size, count):
        assert len(peers) == size - 1 and failures == [], failures


# -- faults ---------------------------------------------------------------------------------

@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_during_a_large_transfer(victim):
    got = run_ranks(2, killed_mid_transfer, victim)
    survivor = 1 - victim
    status, value = got[survivor]
    assert status == "ok" and value is not None, value
    elapsed, message, names = value
    assert elapsed < 5 and f"rank {victim}" in message, (elapsed, message)
    assert len(names) == 2 and gone_from_shm(names) == []


# -- malformed frames (two transports in threads of this process) -----------------------------

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
    store, (t0, t1) = transport_pair()
    try:
        assert t0.shm_peers == [1] and t1.shm_peers == [0]
        inject(t0, 1, frames)
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
