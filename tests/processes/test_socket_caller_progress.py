"""Caller-driven progress in the socket transport (``transports/socket/engine.py``, "Who reads the
sockets"), with real processes: a thread blocked in wait_all reads the sockets itself while the
progress thread stays parked. What must still hold: async requests complete with nobody in
wait_all (small and large, over TCP, after a caller has just driven progress), two threads
waiting at once on one transport, a peer killed while the caller polls, a timeout raised on
time naming the peer, and the same exchanges with the mode turned off."""
import threading
import time

import numpy as np
import pytest

from collectives.errors import CollectiveTimeout, TransportError
from collectives.transports.socket import ANY_SOURCE
from socket_ranks import ok, run_ranks

TCP_ONLY = {r: {"COLLECTIVES_SOCKET_SHM": "0"} for r in range(2)}
MIB = 1 << 20


def _test_until_done(requests, limit=5.0):
    """Poll ``test()`` only (never wait_all) until every request is done; seconds taken."""
    t0 = time.monotonic()
    while not all(r.test() for r in requests):
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"not done after {limit} s with nobody in wait_all")
        time.sleep(0.0005)
    return time.monotonic() - t0


def _async_without_waiter(t, nbytes):
    peer = 1 - t.rank
    # a caller drives progress first, so the progress thread is parked on its lease
    for i in range(20):
        got = np.empty(4, np.float64)
        t.wait_all([t.irecv(got, peer, i), t.isend(np.full(4, float(t.rank)), peer, i)], 10)
        if got[0] != peer:
            return f"exchange {i} got {got[0]}"
    send = np.full(nbytes // 8, t.rank + 1.0)
    got = np.zeros(nbytes // 8)
    # large over TCP: the socket refuses most of it, so EVENT_WRITE must be watched by the
    # progress thread; the peer's receive is posted late so the bytes also wait in the socket
    requests = [t.isend(send, peer, 100)]
    time.sleep(0.05)                   # a late receive on purpose (either order must work)
    requests.append(t.irecv(got, peer, 100))
    seconds = _test_until_done(requests)
    if not (got == peer + 1.0).all():
        return "wrong data"
    return seconds


@pytest.mark.parametrize("nbytes", [4096, 8 * MIB])
def test_async_requests_complete_with_no_caller_waiting(nbytes):
    for seconds in ok(run_ranks(2, _async_without_waiter, nbytes, env=TCP_ONLY), 2):
        assert isinstance(seconds, float), seconds
        assert seconds < 2.0, seconds


def _two_threads(t, rounds):
    peer, errors = 1 - t.rank, []

    def worker(tag, source):
        try:
            for i in range(rounds):
                got = np.empty(256, np.int64)
                mine = np.arange(256, dtype=np.int64) + 1000 * tag + i + 7 * t.rank
                t.wait_all([t.irecv(got, source, tag), t.isend(mine, peer, tag)], 10)
                if got[0] != 1000 * tag + i + 7 * peer or got[-1] != got[0] + 255:
                    errors.append(f"tag {tag} round {i}: got {got[0]}")
                    return
        except Exception as exc:       # reported through ``errors``
            errors.append(repr(exc))
    threads = [threading.Thread(target=worker, args=(tag, src))
               for tag, src in ((1, peer), (2, ANY_SOURCE))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return errors or "ok"


def test_two_threads_waiting_at_once():
    # each thread's messages are often read by the other one, whichever holds the token
    assert ok(run_ranks(2, _two_threads, 300), 2) == ["ok", "ok"]


def _killed_while_polling(t):
    # a few exchanges first: a caller takes the token only once the progress thread has left
    # the selector (it stays in it, for up to a second, while no caller has come by)
    _exchanges(t, 5)
    if t.rank == 1:
        time.sleep(0.3)
        import os
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    seen = []

    def watch():                       # who held the token while the caller waited
        me = main
        for _ in range(200):
            seen.append(t._poller == me)
            time.sleep(0.005)
    main = threading.get_ident()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        t.recv(np.zeros(1), 1, 5, 30)
    except TransportError as exc:
        return time.monotonic() - t0, str(exc), any(seen)
    return None


def test_peer_killed_while_the_caller_polls():
    status, value = run_ranks(2, _killed_while_polling)[0]
    assert status == "ok" and value is not None, value
    elapsed, message, caller_polled = value
    assert caller_polled, "the waiting thread never held the progress token"
    assert elapsed < 5 and "rank 1" in message, (elapsed, message)


def _timeout_while_polling(t):
    _exchanges(t, 5)                   # so the caller, not the progress thread, polls
    if t.rank == 1:
        time.sleep(1.0)                # a peer that never arrives, on purpose
        return None
    t0 = time.monotonic()
    try:
        t.recv(np.zeros(1), 1, 9, 0.3)
    except CollectiveTimeout as exc:
        return time.monotonic() - t0, str(exc)


def test_timeout_while_polling_is_on_time_and_names_the_peer():
    elapsed, message = ok(run_ranks(2, _timeout_while_polling), 2)[0]
    assert 0.3 <= elapsed < 0.45, elapsed
    assert "rank 0" in message and "rank 1" in message and "tag 9" in message, message


def _exchanges(t, rounds):
    peer = 1 - t.rank
    for i in range(rounds):
        got = np.empty(1024, np.float32)
        t.wait_all([t.irecv(got, peer, i % 7), t.isend(np.full(1024, i + t.rank, np.float32),
                                                        peer, i % 7)], 10)
        if got[0] != i + peer:
            return f"round {i}: {got[0]}"
    return t._caller_progress


@pytest.mark.parametrize("mode", ["1", "0"])
def test_back_to_back_exchanges_in_both_modes(mode):
    env = {r: {"COLLECTIVES_SOCKET_CALLER_PROGRESS": mode} for r in range(2)}
    assert ok(run_ranks(2, _exchanges, 500, env=env), 2) == [mode == "1"] * 2
