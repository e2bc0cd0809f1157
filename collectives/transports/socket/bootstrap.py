"""Bootstrap: a full mesh of authenticated TCP connections, one per pair of ranks.

Every rank listens on the interface that routes to the master address (loopback when the
master is local), publishes ``host:port`` in the store, connects to every lower rank and
accepts every higher one; each connection opens with the job-secret handshake
(``collectives.auth``) and is refused and logged if it fails. The handshake also yields the
connection's frame keys: every frame after it carries a tag (``auth.FrameAuth``), so a relay
planted through the store (which need not be authenticated) can forward the handshake but
neither read the keys nor alter a frame. The key is $COLLECTIVES_SECRET
or, without it, the per-user secret file (``auth.job_secret``); it never travels in the store:
a store need not be authenticated (torch's TCPStore, a user's own), and whoever could read it
would join the mesh. Connections get TCP_NODELAY and a keepalive that notices a dead host in
about 4 s.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
import time

from ... import debug, settings
from ...auth import AuthenticationError, client_handshake, job_secret, serve_handshake
from ...errors import CollectiveTimeout, TransportError

log = logging.getLogger("collectives.transports.socket")

SOCKET_BUFFER = settings.SOCKET_BUFFER()   # 0: kernel autotuning


def connect(rank, size, store, timeout, refused):
    """Connect ``rank`` to every other rank of the job: dial each lower rank, accept each
    higher one (``_Acceptor``). Returns ({peer: (socket, its FrameAuth)}, the store namespace
    of this join, the setup deadline); refused connections are appended to ``refused`` (for
    diagnosis) and logged."""
    generation = store.add(f"collectives/socket/generation/{rank}", 1)
    ns = f"collectives/socket/{generation}"
    secret = job_secret()
    context = f"transport|{ns}|{size}"
    host = bind_host(store)
    listener = socket.create_server((host, 0), backlog=max(16, size))
    listener.settimeout(0.2)
    acceptor = _Acceptor(listener, rank, set(range(rank + 1, size)), secret, context, refused)
    store.set(f"{ns}/addr/{rank}", f"{host}:{listener.getsockname()[1]}")
    started = time.monotonic()
    deadline = started + timeout
    disagree = (f"it also fails where the ranks disagree on the world size ({size} here) or "
                f"on how many times they have joined this store ({generation} here)")
    socks: dict[int, tuple] = {}
    try:
        for peer in range(rank):
            addr = store_get(store, f"{ns}/addr/{peer}", timeout).decode()
            socks[peer] = _dial_lower(addr, rank, peer, deadline, secret, context, disagree)
        acceptor.wait(timeout - (time.monotonic() - started), timeout)
    finally:
        acceptor.close()
    for peer, (sock, frames) in acceptor.accepted.items():
        sock.settimeout(None)
        socks[peer] = sock, frames
    for sock, _ in socks.values():
        tune(sock)
    return socks, ns, deadline


def _dial_lower(addr, rank, peer, deadline, secret, context, disagree):
    """(socket, FrameAuth) of the connection to the lower rank ``peer`` listening at
    ``addr``, its handshake done; TransportError when it fails (``disagree``: the likely
    causes where both ends are of this job)."""
    h, p = addr.rsplit(":", 1)
    sock = dial(h, int(p), rank, peer, deadline)
    try:
        who, frames = client_handshake(sock, secret, context, rank)
    except (AuthenticationError, OSError) as exc:
        sock.close()
        raise TransportError(f"socket transport rank {rank}: handshake with rank "
                             f"{peer} at {addr} failed: {exc}; {disagree}") from None
    if who != peer:
        raise TransportError(f"socket transport rank {rank}: {addr} answered as "
                             f"rank {who}, expected {peer}")
    return sock, frames


class _Acceptor:
    """Accepts the connections of the ranks above this one (``expected``) on ``listener``,
    on a thread of its own, each handshake on a thread too: a connection that fails it, or
    claims a rank not expected or already connected, is refused, appended to ``refused`` and
    logged. ``accepted``: {rank: (socket, FrameAuth)}."""

    def __init__(self, listener, rank, expected, secret, context, refused):
        self.listener, self.rank, self.expected = listener, rank, expected
        self.secret, self.context, self.refused = secret, context, refused
        self.lock = threading.Lock()
        self.accepted: dict[int, tuple] = {}
        self.done = threading.Event()
        if expected:
            threading.Thread(target=self._accept_loop, daemon=True).start()
        else:
            self.done.set()

    def _admit(self, conn, addr):
        try:
            conn.settimeout(5.0)
            who, frames = serve_handshake(conn, self.secret, self.context, self.rank)
            if who not in self.expected:
                raise AuthenticationError(f"claims rank {who}, which is not expected here")
            with self.lock:
                if who in self.accepted:
                    raise AuthenticationError(f"rank {who} is already connected")
                self.accepted[who] = conn, frames
                if len(self.accepted) == len(self.expected):
                    self.done.set()
        except (AuthenticationError, OSError) as exc:
            self.refused.append(f"{addr}: {exc}")
            log.warning("socket transport rank %d refused a connection from %s: %s",
                        self.rank, addr, exc)
            conn.close()

    def _accept_loop(self):
        while not self.done.is_set():
            try:
                conn, addr = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._admit, args=(conn, addr), daemon=True).start()

    def wait(self, left: float, timeout: float) -> None:
        """Until every expected rank is connected: CollectiveTimeout after ``left`` seconds
        (of the setup's ``timeout``), saying meanwhile (debug.Waiting) who is missing."""
        waiting = debug.Waiting(debug.logger(log.name), left)
        while not self.done.wait(waiting.step()):
            with self.lock:
                missing = sorted(self.expected - set(self.accepted))
            if waiting.expired():
                raise CollectiveTimeout(f"socket transport rank {self.rank}: ranks {missing} "
                                        f"did not connect within {timeout:.3g} s")
            waiting.report(f"socket transport rank {self.rank}: waiting for ranks "
                           f"{debug.ranks_text(missing)} to connect")

    def close(self) -> None:
        self.done.set()
        self.listener.close()


def store_get(store, key, timeout):
    """``store.get`` waiting up to the transport's timeout, not the store's own."""
    old = store._timeout
    store.set_timeout(timeout)
    try:
        return store.get(key)
    finally:
        store._timeout = old


def dial(host, port, rank, peer, deadline):
    pause = 0.01
    while True:
        try:
            return socket.create_connection((host, port), timeout=5.0)
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise TransportError(f"socket transport rank {rank}: cannot reach rank "
                                     f"{peer} at {host}:{port}: {exc}") from None
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if SOCKET_BUFFER:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)


def bind_host(store) -> str:
    """The address to listen on: $COLLECTIVES_SOCKET_HOST, else the local interface that routes
    to the master (the store's host or $MASTER_ADDR), loopback when the master is local."""
    explicit = settings.SOCKET_HOST()
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR")
    inner = store
    while master is None and inner is not None:
        master = getattr(inner, "host", None)
        inner = getattr(inner, "underlying_store", None)
    if not master:
        return "127.0.0.1"
    try:
        ip = socket.getaddrinfo(master, None, socket.AF_INET)[0][4][0]
    except OSError:
        return "127.0.0.1"
    if ipaddress.ip_address(ip).is_loopback:
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((ip, 9))          # no packet is sent: this only asks the routing table
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def host_identity() -> bytes:
    """Boot id, hostname, network namespace and uid: equal on both sides of a pair only when
    they can share /dev/shm (a second network namespace, as in the two-hosts test, counts as
    another host, so that pair keeps its real network path)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError as exc:
        log.info("socket transport: no host identity (%s), shared memory is off", exc)
        return b""
    return f"{boot}|{socket.gethostname()}|{netns}|{os.getuid()}".encode()
