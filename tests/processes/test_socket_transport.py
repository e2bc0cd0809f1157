"""The socket transport with real processes: delivery, FIFO per tag, ANY_SOURCE, 64 MiB
messages (posted first and unexpected), the host executor's ring all_reduce, a killed peer, a
timeout, a wrong secret, and garbage clients during setup."""
import os
import signal
import socket
import time

import numpy as np
import pytest

from collectives.algorithms.schedule import build_plan
from collectives.errors import CollectiveError, CollectiveTimeout, TransportError
from collectives.executors.host import execute
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp
from collectives.store import TCPStore
from collectives.transports.socket import ANY_SOURCE
from socket_ranks import STORE_SECRET, ok, run_ranks

# -- delivery --------------------------------------------------------------------------------

def _exchange(t):
    """Every rank sends 30 numbered messages of varied sizes to every other, one tag."""
    reqs, inbox = [], {}
    for peer in range(t.size):
        if peer == t.rank:
            continue
        inbox[peer] = [np.empty(1 + (i * 37) % 300, np.int64) for i in range(30)]
        reqs += [t.irecv(buf, peer, 7) for buf in inbox[peer]]
    for peer in range(t.size):
        if peer != t.rank:
            for i in range(30):
                n = 1 + (i * 37) % 300
                reqs.append(t.isend(np.full(n, t.rank * 1000 + i, np.int64), peer, 7))
    t.wait_all(reqs, 20)
    for peer, bufs in inbox.items():
        for i, buf in enumerate(bufs):
            if not (buf == peer * 1000 + i).all():
                raise AssertionError(f"rank {t.rank}: message {i} from {peer} out of order")
    # and to itself
    mine = np.empty(3, np.float64)
    r = t.irecv(mine, t.rank, 8)
    t.wait_all([t.isend(np.arange(3.0), t.rank, 8), r], 5)
    return mine.tolist()


@pytest.mark.parametrize("size", [1, 2, 4])
def test_fifo_per_tag(size):
    assert ok(run_ranks(size, _exchange), size) == [[0.0, 1.0, 2.0]] * size


def _any_source(t):
    if t.rank == 0:
        bufs = [np.empty(4, np.int32) for _ in range(t.size - 1)]
        reqs = [t.irecv(b, ANY_SOURCE, 3) for b in bufs]
        t.wait_all(reqs, 20)
        return sorted((r.source, int(b[0])) for r, b in zip(reqs, bufs))
    time.sleep(0.05 * t.rank)          # some arrive before, some after the receive is posted
    t.send(np.full(4, t.rank * 10, np.int32), 0, 3, 20)
    return None


def test_any_source_sets_source():
    assert ok(run_ranks(3, _any_source), 3)[0] == [(1, 10), (2, 20)]


def _large(t, unexpected):
    n = 64 << 20
    if t.rank == 0:
        data = (np.arange(n // 8, dtype=np.int64) * 7).view(np.uint8)
        t.send(data, 1, 1, 30)
        return None
    buf = np.zeros(n, np.uint8)
    if unexpected:
        time.sleep(0.5)                  # the message is (mostly) in before the receive
    t.recv(buf, 0, 1, 30)
    return bool((buf.view(np.int64) == np.arange(n // 8, dtype=np.int64) * 7).all())


@pytest.mark.parametrize("unexpected", [False, True])
def test_64_mib_message(unexpected):
    assert ok(run_ranks(2, _large, unexpected), 2)[1] is True


def _ring_all_reduce(t, count):
    arr = np.arange(count, dtype=np.float32) + t.rank
    plan = build_plan("all_reduce", "ring", t.rank, t.size, count)
    execute(plan, t, {"output": arr}, reducer(ReduceOp.SUM, arr.dtype), tag=1, timeout=30)
    return arr


@pytest.mark.parametrize("size,count", [(2, 1000), (3, 1001), (4, 5)])
def test_executor_ring_all_reduce(size, count):
    outs = ok(run_ranks(size, _ring_all_reduce, count), size)
    expected = sum(np.arange(count, dtype=np.float32) + r for r in range(size))
    for out in outs:
        np.testing.assert_array_equal(out, expected)


def _mismatch(t):
    if t.rank == 0:
        t.send(np.zeros(10, np.uint8), 1, 2, 5)
        return None
    try:
        t.recv(np.zeros(4, np.uint8), 0, 2, 5)
    except CollectiveError as exc:
        return str(exc)
    return "no error"


def test_size_mismatch_is_an_error():
    msg = ok(run_ranks(2, _mismatch), 2)[1]
    assert "10 bytes" in msg and "expects 4" in msg


# -- faults ----------------------------------------------------------------------------------

def _killed(t):
    if t.rank == t.size - 1:
        time.sleep(0.3)                  # on purpose: die while the others are mid-collective
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        # wait on a rank that is alive but silent: the failure must still surface
        t.recv(np.zeros(1), (t.rank + 1) % (t.size - 1), 5, 30)
    except TransportError as exc:
        return time.monotonic() - t0, str(exc)
    return None


def test_killed_peer_fails_every_rank_quickly():
    got = run_ranks(3, _killed)
    for rank in (0, 1):
        status, value = got[rank]
        assert status == "ok" and value is not None, value
        elapsed, message = value
        assert elapsed < 5 and "rank 2" in message, message


def _timeout(t):
    if t.rank == 1:
        time.sleep(1.0)                  # a peer that never arrives, on purpose
        return None
    try:
        t.recv(np.zeros(1), 1, 9, 0.3)
    except CollectiveTimeout as exc:
        return str(exc)


def test_timeout_names_rank_peer_and_tag():
    msg = ok(run_ranks(2, _timeout), 2)[0]
    assert "rank 0" in msg and "rank 1" in msg and "tag 9" in msg


def test_wrong_secret_is_refused():
    env = {0: {"COLLECTIVES_SECRET": "the-right-job-secret"},
           1: {"COLLECTIVES_SECRET": "the-wrong-job-secret"},
           "setup_timeout": 3}
    got = run_ranks(2, _ring_all_reduce, 10, env=env)
    assert {s for s, _ in got.values()} == {"error"}
    assert any("secret" in v[1] for _, v in got.values()), got


def test_garbage_during_setup_does_not_hurt():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=20, secret=STORE_SECRET)
    env = {1: {"DELAY": "1"}}
    import threading

    def pester():
        addr = store.get("collectives/socket/1/addr/0").decode()
        host, port = addr.rsplit(":", 1)
        try:
            silent = socket.create_connection((host, int(port)))
        except OSError:
            return                       # too late: the asserts below will say so
        for payload in (os.urandom(500), b"COLLv1\x00\x00" + os.urandom(73)):  # a whole reply
            try:
                with socket.create_connection((host, int(port))) as s:
                    s.sendall(payload)
                    s.recv(100)
            except OSError:
                pass
        time.sleep(2)
        silent.close()

    threading.Thread(target=pester, daemon=True).start()
    got = run_ranks(2, _delayed_all_reduce, env=env, store=store)
    outs = ok(got, 2)
    store.close()
    for out, refused in outs:
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) * 2 + 1)
    assert len(outs[0][1]) >= 2, outs[0][1]      # both garbage clients were refused by rank 0
    assert any("magic" in r for r in outs[0][1]) and any("secret" in r for r in outs[0][1])


def _delayed_all_reduce(t):
    return _ring_all_reduce(t, 16), list(t.refused)


@pytest.fixture(autouse=True)
def _slow_second_rank(monkeypatch):
    # rank 1 of the garbage test creates its transport a moment late (via DELAY), so the
    # garbage reaches rank 0's listener while it is still accepting
    import collectives.transports.socket as sock_mod
    original = sock_mod.SocketTransport._connect_mesh

    def delayed(self, store):
        if os.environ.get("DELAY"):
            time.sleep(float(os.environ["DELAY"]))
        return original(self, store)
    monkeypatch.setattr(sock_mod.SocketTransport, "_connect_mesh", delayed)


def _any_source_from_self(transport):
    buf = np.zeros(3)
    req = transport.irecv(buf, ANY_SOURCE, 9)          # posted first: the send matches it
    transport.isend(np.full(3, 5.0), transport.rank, 9)
    transport.wait_all([req], 10)
    return req.source, buf.tolist()


def test_any_source_receive_matched_by_a_send_to_self_names_this_rank():
    got = run_ranks(2, _any_source_from_self)
    assert got == {0: ("ok", (0, [5.0] * 3)), 1: ("ok", (1, [5.0] * 3))}, got


# -- every frame authenticated (two transports in threads of this process) ----------------------

def _data_frame(tag, payload):
    from collectives.transports.socket import HEADER
    return HEADER.pack(0, bytes(HEADER.size - 17), tag, len(payload)) + payload


def _frames_from_a_relay(t0):
    """Frames a relay between the ranks could write: one without a tag (it holds no key), one
    sealed by rank 0 whose payload it then rewrote, and one of rank 0's frames replayed."""
    payload = np.full(4, 1000.0, np.float32).tobytes()
    frame = _data_frame(7, np.ones(4, np.float32).tobytes())
    tag = bytes(t0._peers[1].auth.seal(frame[:-16], frame[-16:]))
    return {
        "no tag": [_data_frame(7, payload) + bytes(16)],
        "payload rewritten": [frame[:-16] + payload + tag],
        "replayed": [frame + tag, frame + tag],
    }


@pytest.mark.parametrize("case", ["no tag", "payload rewritten", "replayed"])
def test_a_frame_not_sealed_by_the_peer_fails_the_transport(case):
    from socket_ranks import inject, transport_pair
    store, (t0, t1) = transport_pair()
    try:
        frames = _frames_from_a_relay(t0)[case]
        inject(t0, 1, frames, sealed=False)
        got = np.zeros(4, np.float32)
        with pytest.raises(TransportError) as info:
            for _ in frames:
                t1.recv(got, 0, 7, 5)
                assert got.tolist() == [1.0] * 4      # only rank 0's own frame ever lands
        assert "from rank 0 failed authentication" in str(info.value), str(info.value)
    finally:
        t0.close(timeout=2)
        t1.close(timeout=2)
        store.close()
