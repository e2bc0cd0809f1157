"""The socket transport's cross-memory-attach path (``transports/socket/cma.py``) with real processes:
same-host pairs whose probe succeeded read each other's sends straight out of the sender's
memory (one copy), acknowledged over TCP. Which pairs take it and how to turn it off; sizes
around the threshold and large; receives posted before and after the announcement;
any-source; many tags both ways; the facade's collectives with every algorithm; a size
mismatch; SIGKILL of either end; malformed acknowledgements and announcements."""
import os

import numpy as np
import pytest

from collectives.errors import TransportError
from collectives.transports.socket import cma
from collectives.transports.socket import ADDRESS, CMA_ACK, CMA_MSG, HEADER
from socket_ranks import (KIB, MIB, inject, killed_mid_transfer, many_tags, ok, run_facade,
                          run_ranks, send_sizes, size_mismatch, transport_pair)


def _probe_works() -> bool:
    """Whether this machine lets one process read another's memory (ptrace rights, seccomp)."""
    if not cma.available():
        return False
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    pid = os.fork()
    if pid == 0:
        data = np.frombuffer(b"collectives-cma-probe", np.uint8).copy()
        os.write(from_child, str(cma.address(data)).encode())
        os.read(to_child, 1)            # stay alive until the parent has read
        os._exit(0)
    try:
        where = int(os.read(to_parent, 64))
        got = np.empty(21, np.uint8)
        cma.read(pid, where, got)
        return got.tobytes() == b"collectives-cma-probe"
    except (OSError, ValueError):
        return False
    finally:
        os.write(from_parent, b"x")
        os.waitpid(pid, 0)
        for fd in (to_parent, from_child, to_child, from_parent):
            os.close(fd)


pytestmark = pytest.mark.skipif(not _probe_works(),
                                reason="process_vm_readv between processes is not allowed here")


def _who(t):
    return t.cma_peers, t.shm_peers


def test_same_host_pairs_read_each_other_directly():
    outs = ok(run_ranks(3, _who), 3)
    for rank, (direct, ring) in enumerate(outs):
        others = [r for r in range(3) if r != rank]
        assert direct == others and ring == others


@pytest.mark.parametrize("off", [{0: {}, 1: {}}, {1: {}}])
def test_cma_off_on_either_side_keeps_the_ring(off):
    env = {r: {"COLLECTIVES_SOCKET_CMA": "0"} for r in off}
    outs = ok(run_ranks(2, _who, env=env), 2)
    assert outs == [([], [1]), ([], [0])]


SIZES = [64 * KIB - 1, 64 * KIB, 1, 3 * MIB + 7, 40 * MIB, 999_983]


def test_sizes_posted_before_and_after_the_announcement():
    outs = ok(run_ranks(2, send_sizes, SIZES, {1, 3, 4}), 2)
    assert outs[0] == [1]          # send_sizes returns shm_peers on rank 0: the pair is same-host
    assert outs[1] == [True] * len(SIZES)


def _any_source(t):
    if t.rank == 0:
        got = []
        for _ in range(2):
            buf = np.empty(2 * MIB, np.uint8)
            req = t.irecv(buf, -1, 5)
            t.wait_all([req], 30)
            got.append((req.source, int(buf[0]), int(buf[-1])))
        return sorted(got)
    t.send(np.full(2 * MIB, t.rank, np.uint8), 0, 5, 30)
    return None


def test_any_source_reads_from_whoever_announced():
    outs = ok(run_ranks(3, _any_source), 3)
    assert outs[0] == [(1, 1, 1), (2, 2, 2)]


def test_many_tags_both_directions():
    """Small (TCP) and large (direct-read) messages interleaved both ways on 24 tags."""
    assert ok(run_ranks(2, many_tags), 2) == [True, True]


def test_size_mismatch_is_a_clear_error_and_the_pair_still_works():
    message, after = ok(run_ranks(2, size_mismatch), 2)[1]
    assert f"{200 * KIB} bytes" in message and f"expects {100 * KIB}" in message, message
    assert after


@pytest.mark.parametrize("size,count", [(2, 300_001), (4, 40_000)])
def test_facade_collectives_every_algorithm(size, count):
    for peers, failures in run_facade(size, count):
        assert len(peers) == size - 1 and failures == [], failures


@pytest.mark.parametrize("victim", [0, 1])
def test_sigkill_during_direct_reads(victim):
    got = run_ranks(2, killed_mid_transfer, victim)
    status, value = got[1 - victim]
    assert status == "ok" and value is not None, value
    elapsed, message, _ = value
    assert elapsed < 5 and f"rank {victim}" in message, (elapsed, message)


@pytest.mark.parametrize("frames,what", [
    ([HEADER.pack(CMA_ACK, bytes(7), 0, 1)], "acknowledgement of 1 reads with 0 outstanding"),
    ([HEADER.pack(CMA_MSG, bytes(7), 5, 0) + ADDRESS.pack(0)], "direct-read announcement of 0 bytes"),
    ([HEADER.pack(CMA_MSG, bytes(7), 5, 64) + ADDRESS.pack(8)], "from its memory failed"),
])
def test_malformed_direct_read_frames_fail_the_transport_naming_the_peer(frames, what):
    store, (t0, t1) = transport_pair()
    try:
        assert t0.cma_peers == [1] and t1.cma_peers == [0]
        inject(t0, 1, frames)
        with pytest.raises(TransportError) as info:
            t1.recv(np.zeros(64, np.uint8), 0, 5, 5)
        assert "rank 0" in str(info.value) and what in str(info.value), str(info.value)
    finally:
        t0.close(timeout=2)
        t1.close(timeout=2)
        store.close()
