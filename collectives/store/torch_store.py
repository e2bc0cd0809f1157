"""Our store interface over a ``torch.distributed.Store``: what the socket transport's
rendezvous calls when the store is torch's (the torch backend's, torchrun's agent store).
Imports torch: import this module only where torch's store is in use."""
from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from .base import Store

# torch's "no deadline" for a store wait (its waits take a timedelta, never None)
NO_DEADLINE = timedelta(days=365)
_SHORTEST = 1e-3        # s: the shortest wait torch's stores take


class TorchStore(Store):
    """Our store interface over ``store``, a torch store. ``underlying_store`` leads the
    transport to the master's host (torch's TCPStore has ``host``), so each rank listens on
    the interface that routes there."""

    def __init__(self, store, timeout):
        super().__init__(timeout)
        self.underlying_store = store

    def _describe(self):
        host, port = (getattr(self.underlying_store, name, None) for name in ("host", "port"))
        where = f"{host}:{port}" if host is not None else type(self.underlying_store).__name__
        return f"torch's store ({where})"

    def _set(self, key, value):
        self.underlying_store.set(key, value)

    def _get(self, key, timeout):
        if self._wait([key], timeout):
            return None
        return self.underlying_store.get(key)

    def _add(self, key, amount):
        return self.underlying_store.add(key, amount)

    def _wait(self, keys, timeout):
        if timeout is not None and timeout < _SHORTEST:
            # torch counts whole milliseconds, and each of its waits that runs out logs a
            # warning: a mere look (rendezvous polls the ranks present) is a check
            return [k for k in keys if not self.underlying_store.check([k])]
        limit = NO_DEADLINE if timeout is None else timedelta(seconds=timeout)
        try:
            self.underlying_store.wait(keys, limit)
        except dist.DistStoreError:
            return [k for k in keys if not self.underlying_store.check([k])]
        return []

    def _compare_set(self, key, expected, desired):
        return self.underlying_store.compare_set(key, expected, desired)

    def _delete(self, key):
        return self.underlying_store.delete_key(key)

    def _num_keys(self):
        return self.underlying_store.num_keys()

    def _check(self, keys):
        return self.underlying_store.check(keys)
