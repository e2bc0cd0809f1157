"""Rendezvous: turn an ``init_method`` into (store, rank, world_size), as torch does.

- ``env://`` (the default): MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
  (rank and world size may come from the arguments instead). Rank 0 runs the TCPStore server,
  unless the launcher already runs one ($COLLECTIVES_USE_AGENT_STORE=1, set by
  ``collectives.run``). Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent's store
  is torch's TCPStore: the ranks reach it through torch's client (without torch, an error at
  once saying what to do).
- ``tcp://host:port`` (``?rank=R&world_size=N`` accepted): same, with the address in the URL.
- ``file:///path``: a FileStore on a file every rank can see (created 0600; a symbolic link,
  another user's file, a file others may read and a file that is not a FileStore's are
  refused; a file left by an earlier job that is over is started afresh: see FileStore).
- an explicit ``store``: used as is; rank and world size must be given.

Then every rank checks in (``arrive``, which init_process_group calls): it publishes its
world size and returns once all ``world_size`` ranks have checked in. Ranks started with
different world sizes all get a ValueError naming both sizes and a rank of each, within
moments; a rank that never comes is named, in the log while the others wait
(``debug.Waiting``: INFO every 5 s with COLLECTIVES_DEBUG=INFO, WARNING once a minute after
30 s) and in the CollectiveTimeout at the end of the init timeout. So no transport starts its
set-up (NCCL's has no timeout of its own) before every rank is known to be there. Cost: five
store calls per rank, and one more per 5 s of waiting.

Rank 0 starts a new store server for each init (destroy_process_group closes it, freeing
the port). A rank that inits again can reach the previous server before rank 0 has closed
it: that server holds this rank's earlier check-in, so the rank tries again until rank 0's
new server answers.

Authentication: the TCP store and the transports use the job secret (``collectives.auth``):
$COLLECTIVES_SECRET, else this user's secret file, so ranks of one user on one host need no
setting. A master that is not a local address with no $COLLECTIVES_SECRET is warned about
once (every host then needs the same secret file). Missing settings raise ValueError naming
the variable. Cost: one TCP connection per rank.
"""
from __future__ import annotations

import errno
import os
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from . import debug, settings
from .auth import warn_if_remote
from .errors import CollectiveTimeout
from .store import FileStore, Store, StoreError, StoreGone, StoreTimeout, TCPStore
from .store.base import timeout_seconds

TORCH_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"       # torchrun's, written True/False
AGENT_STORE_ENV = (settings.USE_AGENT_STORE.name, TORCH_AGENT_STORE)
_PREFIX = "collectives/rendezvous"
_served: set = set()      # (host, port) of the store servers this process has run
_joined: set = set()      # and of rank 0's servers it has checked in at
_REBIND_SECONDS = 5.0
_FOLLOW_SECONDS = 2.0
LOGGER = "collectives.rendezvous"


def _int_setting(value, env_name, init_method):
    if value is not None and int(value) >= 0:
        return int(value)
    raw = os.environ.get(env_name)
    if raw is None or raw == "":
        raise ValueError(f"rendezvous {init_method!r}: {env_name.lower()} is not given and the "
                         f"environment variable {env_name} is not set")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"rendezvous {init_method!r}: environment variable {env_name}="
                         f"{raw!r} is not an integer") from None


def _check(rank, world_size, init_method):
    if world_size < 1:
        raise ValueError(f"rendezvous {init_method!r}: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rendezvous {init_method!r}: rank {rank} is out of range for world "
                         f"size {world_size}")


def _check_launcher_size(rank, world_size):
    """A world size given as an argument must be the launcher's ($WORLD_SIZE, where one set
    it): the ranks it did not start would never arrive, and the others would wait out the
    whole init timeout for them."""
    raw = os.environ.get("WORLD_SIZE", "")
    try:
        started = int(raw)
    except ValueError:
        return                  # not a launcher's (an unset or odd value is not relied on)
    if started != world_size:
        raise ValueError(f"init_process_group on rank {rank}: world_size={world_size} was "
                         f"given, but the launcher started {started} ranks (WORLD_SIZE="
                         f"{raw}): ranks the launcher did not start never arrive; leave "
                         f"world_size out (-1: the launcher's) or launch {world_size} ranks")


def _uses_agent_store() -> bool:
    return settings.USE_AGENT_STORE() or _uses_torch_agent_store()


def _uses_torch_agent_store() -> bool:
    """torchrun's agent runs torch's TCPStore (our launcher sets its own variable)."""
    return not settings.USE_AGENT_STORE() and \
        os.environ.get(TORCH_AGENT_STORE, "").lower() in ("1", "true", "yes")


def _tcp_store(host, port, rank, world_size, timeout):
    warn_if_remote(host, f"rendezvous on rank {rank}")
    # The server does not wait for every worker: arrive() does, naming the ranks missing.
    if _uses_torch_agent_store():
        return _torch_agent_store(host, port, rank, world_size, timeout)
    if _uses_agent_store():
        return TCPStore(host, port, world_size, timeout=timeout, wait_for_workers=False)
    if rank == 0:
        return _serve(host, port, world_size, timeout)
    return _join_server(host, port, rank, world_size, timeout)


def _torch_agent_store(host, port, rank, world_size, timeout):
    """The store of torchrun's agent: torch's TCPStore, whose protocol is not ours (our
    client would retry until the timeout, finding no server it can talk to), reached through
    torch's own client under our store interface. Without torch: an error at once, saying
    what to do."""
    try:
        import torch.distributed as torch_dist
        from .store.torch_store import NO_DEADLINE, TorchStore
    except ImportError as exc:
        raise RuntimeError(
            f"init_process_group on rank {rank}: {TORCH_AGENT_STORE} is set: the launcher "
            f"(torchrun) runs torch's TCPStore at {host}:{port}, which only torch's client "
            f"speaks, and torch does not import here ({exc}); install torch, or start the "
            f"job with `python -m collectives.run` (torchrun's flags), whose store is "
            f"ours") from None
    limit = NO_DEADLINE if timeout is None else timedelta(seconds=timeout)
    try:
        store = torch_dist.TCPStore(host, port, world_size, False, limit)
    except (RuntimeError, ValueError) as exc:   # torch's DistStoreError is a RuntimeError
        raise StoreError(f"init_process_group on rank {rank}: cannot reach torchrun's store "
                         f"(torch's TCPStore) at {host}:{port}: {exc}") from None
    return TorchStore(store, timeout)


def _serve(host, port, world_size, timeout):
    """Rank 0's store server. Where this process served one on that port before (init after
    destroy_process_group), the port may stay bound a moment after that server's close
    (until its accept loop wakes): retry briefly then, not on a port another process holds."""
    pause, deadline = 0.01, time.monotonic() + min(_REBIND_SECONDS, timeout or _REBIND_SECONDS)
    while True:
        try:
            store = TCPStore(host, port, world_size, is_master=True, timeout=timeout,
                             wait_for_workers=False)
            _served.add((host, port))
            return store
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or (host, port) not in _served or \
                    time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _join_server(host, port, rank, world_size, timeout):
    """A client of rank 0's store server, once it answers (saying meanwhile what it waits
    for). Rank 0 starts a new server for each init, so a server that already holds this
    rank's check-in is the previous one, not yet closed: it waits for the new one then."""
    waiting = debug.Waiting(debug.logger(LOGGER), timeout)
    pause = 0.01
    while True:
        what = "does not answer"
        try:
            store = TCPStore(host, port, world_size, timeout=max(waiting.step(), 0.01),
                             wait_for_workers=False)
        except StoreTimeout:
            store = None
        except StoreGone:               # the previous init's server, closed while we joined
            store, what = None, "was the previous init_process_group's, closing"
            time.sleep(min(0.01, max(waiting.step(), 0.0)))
        if store is not None:
            if not isinstance(store, Store):       # a stand-in for the class (tests)
                return store
            store.set_timeout(timeout)
            try:
                if (host, port) not in _joined or not store.check(_generation_key(rank)):
                    return store
                what = ("is still the one of the previous init_process_group: rank 0 has not "
                        "called destroy_process_group and init_process_group again")
            except StoreGone:           # the previous server, closed while we asked it
                what = "was the previous init_process_group's, closing"
            store.close()
        if waiting.expired():
            raise CollectiveTimeout(f"init_process_group on rank {rank}: rank 0's store "
                                    f"server at {host}:{port} {what}, after "
                                    f"{waiting.waited():.3g} s")
        waiting.report(f"init_process_group on rank {rank}: waiting for rank 0's store server "
                       f"at {host}:{port}, which {what}")
        if store is not None:                       # the old one answers at once: pace it
            time.sleep(min(pause, waiting.step()))
            pause = min(pause * 2, 0.2)


def _generation_key(rank) -> str:
    return f"{_PREFIX}/generation/{rank}"


def arrive(store, rank: int, world_size: int, timeout: float | None) -> None:
    """Check in and wait until every rank has, all with one world size (module notes).
    init_process_group calls it after ``rendezvous``."""
    if isinstance(store, TCPStore) and not store.is_master and not _uses_agent_store():
        _joined.add((store.host, store.port))
    generation = store.add(_generation_key(rank), 1)   # each init on one store
    ns = f"{_PREFIX}/{generation}"
    store.set(f"{ns}/rank/{rank}", str(world_size))
    mine = f"{world_size} {rank}".encode()
    first = store.compare_set(f"{ns}/world_size", b"", mine)
    outcome = f"{ns}/outcome"           # "ok", or why every rank fails: one value, one read
    if first != mine and int(first.split()[0]) != world_size:
        other_size, other_rank = map(int, first.split())
        store.compare_set(outcome, b"", f"mismatch {rank} {world_size} {other_rank} "
                                        f"{other_size}".encode())
        raise ValueError(_mismatch(rank, world_size, rank, world_size, other_rank, other_size))
    if store.add(f"{ns}/arrived", 1) == world_size:
        store.compare_set(outcome, b"", b"ok")
    # Rank 0 (whose process holds the store server, where there is one) times out first and
    # tells the others through the store, and leaves once they have read it (_told): its
    # exit takes the server away.
    waiting = debug.Waiting(debug.logger(LOGGER), timeout,
                            grace=0.0 if rank == 0 else _FOLLOW_SECONDS)
    missing = None
    try:
        while (value := _get(store, outcome, waiting.step())) is None:
            missing = _missing(store, ns, world_size)
            if waiting.expired():
                # the others learn it from the store at once, even if this rank (the
                # server's, perhaps) leaves before their own timeouts
                store.compare_set(outcome, b"", ("timeout " + ",".join(map(str, missing)))
                                  .encode())
                continue
            waiting.report(f"init_process_group on rank {rank}: waiting for ranks "
                           f"{debug.ranks_text(missing)} to arrive at the rendezvous, "
                           f"{world_size - len(missing)} of {world_size} are there")
    except StoreError as exc:
        awaited = "every rank" if missing is None else f"ranks {debug.ranks_text(missing)}"
        raise StoreError(f"init_process_group on rank {rank}: the store failed while waiting "
                         f"for {awaited} to arrive at the rendezvous: {exc}") from None
    what, *fields = value.decode().split(" ")
    if what == "mismatch":
        raise ValueError(_mismatch(rank, world_size, *map(int, fields)))
    if what == "timeout":
        missing = [int(r) for r in fields[0].split(",") if r] if fields else []
        _told(store, ns, rank, world_size - len(missing))
        limit = "the init timeout" if timeout is None else f"{timeout:.3g} s"
        raise CollectiveTimeout(
            f"init_process_group on rank {rank}: ranks {debug.ranks_text(missing)} did not "
            f"arrive at the rendezvous within {limit} ({world_size - len(missing)} of "
            f"{world_size} ranks did)")


def _told(store, ns, rank, present) -> None:
    """The timeout outcome read by every rank that arrived before any leaves with it. Rank
    0's process may hold the store server, and its exit closes it: a rank that was between
    two of its requests then met a closed store (StoreError) instead of the outcome. So each
    other rank says it read it, and rank 0 waits for them, at most as long as they would
    have followed it (_FOLLOW_SECONDS); a store that fails meanwhile changes nothing."""
    try:
        if rank != 0:
            if store.add(f"{ns}/told", 1) == present - 1:
                store.set(f"{ns}/all_told", "1")
        elif present > 1:
            _get(store, f"{ns}/all_told", _FOLLOW_SECONDS)
    except StoreError:
        pass


def _mismatch(rank, world_size, a, size_a, b, size_b) -> str:
    return (f"init_process_group on rank {rank} (world_size {world_size}): the ranks were "
            f"started with different world sizes: rank {a} with {size_a}, rank {b} with "
            f"{size_b}; give every rank the same WORLD_SIZE (or world_size=)")


def _get(store, key, seconds):
    """``key``'s value once it exists, or None after ``seconds`` (None: no limit)."""
    if isinstance(store, Store):
        return store._get(key, seconds)
    try:                                  # a store of another kind (torch's): public methods
        store.wait([key], timedelta(seconds=seconds if seconds is not None else 1e9))
    except Exception:
        if not store.check([key]):
            return None
    return store.get(key)


def _missing(store, ns, world_size) -> list[int]:
    keys = [f"{ns}/rank/{r}" for r in range(world_size)]
    if isinstance(store, Store):
        absent = set(store._wait(keys, 0.0))
    else:
        absent = {k for k in keys if not store.check([k])}
    return [r for r, k in enumerate(keys) if k in absent]


def rendezvous(init_method: str | None = None, rank: int | None = None,
               world_size: int | None = None, timeout=timedelta(minutes=30),
               store: Store | None = None):
    """Return ``(store, rank, world_size)``; the store is shared by every rank of the job."""
    timeout = timeout_seconds(timeout, "rendezvous")
    if store is not None:
        if init_method is not None:
            raise ValueError("rendezvous: give either init_method or store, not both")
        if rank is None or rank < 0 or world_size is None or world_size < 1:
            raise ValueError("rendezvous with an explicit store: rank and world_size must be given")
        _check(rank, world_size, "store")
        return store, rank, world_size

    init_method = init_method or "env://"
    url = urlparse(init_method)
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if rank is None or rank < 0:
        rank = int(query["rank"]) if "rank" in query else rank
    if world_size is None or world_size < 0:
        world_size = int(query["world_size"]) if "world_size" in query else world_size

    if url.scheme == "env":
        host = os.environ.get("MASTER_ADDR")
        if not host:
            raise ValueError("rendezvous 'env://': environment variable MASTER_ADDR is not set "
                             "(start the job with `python -m collectives.run` or torchrun, "
                             "which set it; under mpiexec the mpi and nccl backends need none)")
        port_raw = os.environ.get("MASTER_PORT")
        if not port_raw:
            raise ValueError("rendezvous 'env://': environment variable MASTER_PORT is not set")
        try:
            port = int(port_raw)
        except ValueError:
            raise ValueError(f"rendezvous 'env://': MASTER_PORT={port_raw!r} is not an integer") from None
        rank = _int_setting(rank, "RANK", init_method)
        world_size = _int_setting(world_size, "WORLD_SIZE", init_method)
        _check(rank, world_size, init_method)
        _check_launcher_size(rank, world_size)
        return _tcp_store(host, port, rank, world_size, timeout), rank, world_size

    if url.scheme == "tcp":
        if not url.hostname or not url.port:
            raise ValueError(f"rendezvous {init_method!r}: expected tcp://host:port")
        rank = _int_setting(rank, "RANK", init_method)
        world_size = _int_setting(world_size, "WORLD_SIZE", init_method)
        _check(rank, world_size, init_method)
        _check_launcher_size(rank, world_size)
        return _tcp_store(url.hostname, url.port, rank, world_size, timeout), rank, world_size

    if url.scheme == "file":
        path = url.path if not url.netloc else f"/{url.netloc}{url.path}"
        if not path:
            raise ValueError(f"rendezvous {init_method!r}: expected file:///path/to/file")
        rank = _int_setting(rank, "RANK", init_method)
        world_size = _int_setting(world_size, "WORLD_SIZE", init_method)
        _check(rank, world_size, init_method)
        _check_launcher_size(rank, world_size)
        return FileStore(path, world_size, timeout=timeout), rank, world_size

    raise ValueError(f"rendezvous: unsupported init_method {init_method!r}; "
                     f"use env://, tcp://host:port or file:///path")
