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
from collectives.transports.socket import ANY_SOURCE, engine
from socket_ranks import ok, run_ranks

TCP_ONLY = {r: {"COLLECTIVES_SOCKET_SHM": "0"} for r in range(2)}
MIB = 1 << 20


def _test_until_done(requests, limit=20.0):
    """Poll ``test()`` only (never wait_all) until every request is done (a hang fails at
    ``limit`` seconds)."""
    deadline = time.monotonic() + limit
    while not all(r.test() for r in requests):
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {limit} s with nobody in wait_all")
        time.sleep(0.0005)


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
    _test_until_done(requests)
    return "ok" if (got == peer + 1.0).all() else "wrong data"


@pytest.mark.parametrize("nbytes", [4096, 8 * MIB])
def test_async_requests_complete_with_no_caller_waiting(nbytes):
    assert ok(run_ranks(2, _async_without_waiter, nbytes, env=TCP_ONLY), 2) == ["ok", "ok"]


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
    # the selector (it stays in it, for up to a second, while no caller has come by); a long
    # lease keeps the progress thread parked after them, so the receive below is the
    # caller's to poll however late this thread gets to it
    engine.CALLER_LEASE = 60.0
    _exchanges(t, 5)
    if t.rank == 1:
        t.recv(np.zeros(1), 0, 6, 30)  # rank 0's caller is polling in its receive: die now
        import os
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    seen = threading.Event()

    def watch():                       # once the caller holds the token, tell rank 1 to die
        deadline = time.monotonic() + 20
        while t._poller != main and time.monotonic() < deadline:
            time.sleep(0.0005)
        if t._poller == main:
            seen.set()
        t.isend(np.zeros(1), 1, 6)
    main = threading.get_ident()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        t.recv(np.zeros(1), 1, 5, 30)
    except TransportError as exc:
        return time.monotonic() - t0, str(exc), seen.is_set()
    return None


def test_peer_killed_while_the_caller_polls():
    status, value = run_ranks(2, _killed_while_polling)[0]
    assert status == "ok" and value is not None, value
    elapsed, message, caller_polled = value
    assert caller_polled, "the waiting thread never held the progress token"
    assert elapsed < 10 and "rank 1" in message, (elapsed, message)   # noticed, not timed out


def _timeout_while_polling(t):
    _exchanges(t, 5)                   # so the caller, not the progress thread, polls
    if t.rank == 1:
        t.recv(np.zeros(1), 0, 10, 60)  # never sends tag 9; stays until rank 0 is done
        return None
    t0 = time.monotonic()
    try:
        t.recv(np.zeros(1), 1, 9, 0.3)
        return "no timeout"
    except CollectiveTimeout as exc:
        elapsed, message = time.monotonic() - t0, str(exc)
    t.send(np.zeros(1), 1, 10, 10)     # the pair still works after the timeout
    return elapsed, message


def test_timeout_while_polling_is_raised_and_names_the_peer():
    """The peer stays connected, so only the timeout can end the receive: it must come, not
    before its 0.3 s (the job would be killed at 60 s without it)."""
    elapsed, message = ok(run_ranks(2, _timeout_while_polling), 2)[0]
    assert elapsed >= 0.3, elapsed
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
