"""One TCPStore client used by many threads: it holds as many connections as calls run at
once (keeping a couple idle), never one per thread that ever called, so short-lived threads
cannot fill the server's connection budget (4 x world size + 64) and lock honest clients
out; a get blocked in one thread still never stalls the others."""
import os
import subprocess
import sys
import threading

import pytest

from collectives.store import StoreGone, TCPStore
from socket_ranks import STORE_SECRET

THREADS, WAVE = 120, 10
HANDFUL = 4             # connections one client may hold between calls (a couple, and slack)


def _connections_to(port) -> int:
    """This process's open TCP sockets whose far end is ``port``: the clients' ends."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                    inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith("socket:[") and target[8:-1] in inodes
    return count


@pytest.fixture
def client(tcp_store):
    store = TCPStore("127.0.0.1", tcp_store.port, timeout=10, secret=STORE_SECRET)
    yield store
    store.close()


def test_short_lived_threads_do_not_keep_a_connection_each(tcp_store, client):
    port = tcp_store.port
    assert THREADS > tcp_store._server.max_clients      # one each would lock the server
    errors = []

    def one_call(i):
        try:
            client.set(f"thread/{i}", str(i))
            assert client.get(f"thread/{i}") == str(i).encode()
        except Exception as exc:                        # reported below
            errors.append(f"thread {i}: {exc!r}")

    for start in range(0, THREADS, WAVE):
        wave = [threading.Thread(target=one_call, args=(i,))
                for i in range(start, start + WAVE)]
        for thread in wave:
            thread.start()
        for thread in wave:
            thread.join(30)
        assert not errors, errors
        # the fixture's master holds one more connection
        held = _connections_to(port)
        assert held <= HANDFUL + 1, f"{held} connections after {start + WAVE} threads"
    honest = TCPStore("127.0.0.1", port, timeout=5, secret=STORE_SECRET)
    honest.set("honest", "1")
    assert client.get("honest") == b"1"
    honest.close()


def test_a_get_blocked_in_one_thread_does_not_stall_the_others(client):
    got = {}
    blocked = threading.Thread(target=lambda: got.update(late=client.get("late")))
    blocked.start()
    client.wait([])                  # nothing asked: answered at once, on another connection
    for i in range(20):
        client.set(f"other/{i}", "x")
        assert client.get(f"other/{i}") == b"x"
    assert blocked.is_alive()
    client.set("late", "1")
    blocked.join(30)
    assert got == {"late": b"1"}


SERVER = """
import sys
from collectives.store import TCPStore
store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=30, secret=sys.argv[1])
print(store.port, flush=True)
sys.stdin.read()
"""


def test_a_server_gone_fails_every_later_call_at_once(tmp_path):
    server = subprocess.Popen([sys.executable, "-c", SERVER, STORE_SECRET], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, timeout=30, secret=STORE_SECRET)
        client.set("k", "v")
    finally:
        server.kill()
        server.wait()
    with pytest.raises(StoreGone):
        client.get("k")
    with pytest.raises(StoreGone):      # not a new connection retried until the timeout
        client.set("k", "v")
    client.close()
