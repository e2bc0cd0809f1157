"""Rendezvous: turn an ``init_method`` into (store, rank, world_size), as torch does.

- ``env://`` (the default): MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
  (rank and world size may come from the arguments instead). Rank 0 runs the TCPStore server,
  unless the launcher already runs one ($COLLECTIVES_USE_AGENT_STORE=1, set by
  ``collectives.run``; torch's TORCHELASTIC_USE_AGENT_STORE is honoured too).
- ``tcp://host:port`` (``?rank=R&world_size=N`` accepted): same, with the address in the URL.
- ``file:///path``: a FileStore on a file every rank can see (created 0600; a symbolic link,
  another user's file, a file others may read and a file that is not a FileStore's are
  refused; a file left by an earlier job that is over is started afresh: see FileStore).
- an explicit ``store``: used as is; rank and world size must be given.

Authentication: the TCP store and the transports use the job secret (``collectives.auth``):
$COLLECTIVES_SECRET, else this user's secret file, so ranks of one user on one host need no
setting. A master that is not a local address with no $COLLECTIVES_SECRET is warned about
once (every host then needs the same secret file). Missing settings raise ValueError naming
the variable. Cost: one TCP connection per rank.
"""
from __future__ import annotations

import os
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from .auth import warn_if_remote
from .store import FileStore, Store, TCPStore

AGENT_STORE_ENV = ("COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE")


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


def _uses_agent_store() -> bool:
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in AGENT_STORE_ENV)


def _tcp_store(host, port, rank, world_size, timeout):
    warn_if_remote(host, f"rendezvous on rank {rank}")
    master = rank == 0 and not _uses_agent_store()
    # The server does not wait for every worker: the transport's own exchange does that, and
    # waiting here would only double the time a missing rank takes to report.
    return TCPStore(host, port, world_size, is_master=master, timeout=timeout,
                    wait_for_workers=False)


def rendezvous(init_method: str | None = None, rank: int | None = None,
               world_size: int | None = None, timeout=timedelta(minutes=30),
               store: Store | None = None):
    """Return ``(store, rank, world_size)``; the store is shared by every rank of the job."""
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
            raise ValueError("rendezvous 'env://': environment variable MASTER_ADDR is not set")
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
        return _tcp_store(host, port, rank, world_size, timeout), rank, world_size

    if url.scheme == "tcp":
        if not url.hostname or not url.port:
            raise ValueError(f"rendezvous {init_method!r}: expected tcp://host:port")
        rank = _int_setting(rank, "RANK", init_method)
        world_size = _int_setting(world_size, "WORLD_SIZE", init_method)
        _check(rank, world_size, init_method)
        return _tcp_store(url.hostname, url.port, rank, world_size, timeout), rank, world_size

    if url.scheme == "file":
        path = url.path if not url.netloc else f"/{url.netloc}{url.path}"
        if not path:
            raise ValueError(f"rendezvous {init_method!r}: expected file:///path/to/file")
        rank = _int_setting(rank, "RANK", init_method)
        world_size = _int_setting(world_size, "WORLD_SIZE", init_method)
        _check(rank, world_size, init_method)
        return FileStore(path, world_size, timeout=timeout), rank, world_size

    raise ValueError(f"rendezvous: unsupported init_method {init_method!r}; "
                     f"use env://, tcp://host:port or file:///path")
