"""Stores between torch and us: ours over a torch store (``store.torch_store``, what the
socket transport's rendezvous calls), torch's over our launcher's store server, and torch's
``env://`` handler that hands torch the latter under ``python -m collectives.run``."""
from __future__ import annotations

import importlib
import os
from datetime import timedelta
from urllib.parse import urlparse

import torch.distributed as dist

from .. import settings
from ..store import Store, TCPStore
from ..store.torch_store import TorchStore as _TorchStore  # noqa: F401  (the backend's)

# torch.distributed.rendezvous is also the name of a function there: take the module itself
_torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")


class _LauncherStore(dist.Store):
    """torch's store interface over our launcher's store server (``collectives.store``)."""

    def __init__(self, store: Store):
        super().__init__()
        self._store = store
        self.host = getattr(store, "host", None)     # where the transport should listen

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def add(self, key, value):
        return self._store.add(key, value)

    def compare_set(self, key, expected_value, desired_value):
        return self._store.compare_set(key, expected_value, desired_value)

    def wait(self, keys, timeout=None):
        self._store.wait(keys, None if timeout is None or timeout == timedelta(0) else timeout)

    def check(self, keys):
        return self._store.check(keys)

    def delete_key(self, key):
        return self._store.delete_key(key)

    def num_keys(self):
        return self._store.num_keys()

    # the names torch's C++ side looks these up by
    deleteKey = delete_key          # noqa: N815
    getNumKeys = num_keys           # noqa: N815


_torch_env_handler = _torch_rendezvous._rendezvous_handlers["env"]
_launcher_stores: list[_LauncherStore] = []


def _under_our_launcher() -> bool:
    return settings.USE_AGENT_STORE()


def _env_rendezvous(url, timeout=timedelta(minutes=30), **kwargs):
    """torch's ``env://``, except under our launcher: there the store is the launcher's."""
    if not _under_our_launcher():
        yield from _torch_env_handler(url, timeout=timeout, **kwargs)
        return
    query = dict(pair.split("=", 1) for pair in filter(None, urlparse(url).query.split("&")))
    try:
        rank = int(query.get("rank", os.environ.get("RANK", "")))
        world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "")))
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"env:// rendezvous under collectives.run: RANK, WORLD_SIZE, "
                         f"MASTER_ADDR and MASTER_PORT must be set ({exc})") from None
    store = _LauncherStore(TCPStore(host, port, world_size, is_master=False, timeout=timeout,
                                    wait_for_workers=False))
    # torch keeps only the C++ half of a Python store; without its Python half the methods
    # above are gone ("pure virtual function"), so it lives as long as the process
    _launcher_stores.append(store)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")
