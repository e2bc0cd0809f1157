"""The store interface (torch.distributed.Store's methods), its errors and timeouts, and the
stores that need no file or socket: ``HashStore`` (one process) and ``PrefixStore`` (a
namespace over another store)."""
from __future__ import annotations

import math
import numbers
import threading
import time
from datetime import timedelta

from ..errors import CollectiveError, CollectiveTimeout

DEFAULT_TIMEOUT = timedelta(seconds=300)
# Every lock and socket timeout has a finite maximum (threading.TIMEOUT_MAX, about 292 years):
# a timeout at least this long is "no deadline", so nothing downstream ever overflows.
_FOREVER_S = 1e9


class StoreError(CollectiveError):
    """The store failed: its server went away, or answered something unexpected."""


class StoreGone(StoreError):
    """The connection to the store server broke mid-request (the server closed or died)."""


class StoreTimeout(CollectiveTimeout):
    """A blocking store call ran out of time; the message names the missing keys."""


def timeout_seconds(timeout, operation: str = "timeout") -> float | None:
    """A timeout (timedelta or seconds) as seconds, or None for no deadline.

    None, inf, ``timedelta.max`` and anything from ``_FOREVER_S`` up are no deadline. NaN and
    negative values raise ValueError, anything else TypeError, both naming ``operation``: they
    are caught here, before a request is sent, not in a server thread. The one rule for every
    timeout of the package: the collectives, groups and Work.wait apply it too, so a value
    means the same on every rank and in every layer.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real):
        seconds = float(timeout)
    else:
        raise TypeError(f"{operation}: timeout must be a timedelta or a number of seconds, "
                        f"got {type(timeout).__name__} {timeout!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{operation}: timeout must be >= 0 seconds (inf for no deadline), "
                         f"got {timeout!r}")
    return None if seconds >= _FOREVER_S else seconds


def _as_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):       # torch also accepts a list of ints
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")


def _as_key(key) -> str:
    if isinstance(key, bytes):
        return key.decode()
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}")
    return key


# ---------------------------------------------------------------------------------------------
# The table: the data and the semantics, shared by HashStore and the TCPStore server


class _Table:
    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key, timeout):
        missing = self.wait([key], timeout)
        if missing:
            return None
        with self.cond:
            return self.data[key]

    def add(self, key, amount):
        with self.cond:
            current = self.data.get(key, b"0")
            try:
                value = int(current) + amount
            except ValueError:
                raise StoreError(f"add: key {key!r} holds {current[:40]!r}, not an integer") from None
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def wait(self, keys, timeout):
        """Block until every key exists; return the keys still missing at the deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                missing = [k for k in keys if k not in self.data]
                if not missing:
                    return []
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return missing
                self.cond.wait(left)

    def compare_set(self, key, expected, desired):
        with self.cond:
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = desired
                self.cond.notify_all()
                return desired
            return expected if current is None else current

    def delete(self, key):
        with self.cond:
            return self.data.pop(key, None) is not None

    def num_keys(self):
        with self.cond:
            return len(self.data)

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)


# ---------------------------------------------------------------------------------------------
# The store interface


class Store:
    """torch.distributed.Store's methods over ``self._table``-like primitives."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        self._timeout = timeout_seconds(timeout, f"{type(self).__name__}()")

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self._timeout if self._timeout is not None else _FOREVER_S)

    def set_timeout(self, timeout) -> None:
        self._timeout = timeout_seconds(timeout, f"{self._describe()}.set_timeout")

    def _describe(self) -> str:
        return type(self).__name__

    def _timed_out(self, operation, missing, timeout):
        raise StoreTimeout(f"{self._describe()}: {operation} timed out after {timeout:.3g} s; "
                           f"missing keys: {missing}")

    def set(self, key, value) -> None:
        self._set(_as_key(key), _as_bytes(value))

    def get(self, key) -> bytes:
        key = _as_key(key)
        value = self._get(key, self._timeout)
        if value is None:
            self._timed_out("get", [key], self._timeout)
        return value

    def add(self, key, amount: int) -> int:
        return self._add(_as_key(key), int(amount))

    def wait(self, keys, timeout=None) -> None:
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        keys = [_as_key(k) for k in keys]
        if timeout is None:
            seconds = self._timeout
        else:
            seconds = timeout_seconds(timeout, f"{self._describe()}.wait")
        missing = self._wait(keys, seconds)
        if missing:
            self._timed_out("wait", missing, seconds)

    def compare_set(self, key, expected_value, desired_value) -> bytes:
        return self._compare_set(_as_key(key), _as_bytes(expected_value), _as_bytes(desired_value))

    def delete_key(self, key) -> bool:
        return self._delete(_as_key(key))

    def num_keys(self) -> int:
        return self._num_keys()

    def check(self, keys) -> bool:
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        return self._check([_as_key(k) for k in keys])

    def multi_set(self, keys, values) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)

    def multi_get(self, keys) -> list[bytes]:
        self.wait(keys)
        return [self.get(key) for key in keys]

    def close(self) -> None:
        pass


class HashStore(Store):
    """A store inside one process (threads as ranks, tests)."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._t = _Table()

    def _set(self, key, value): self._t.set(key, value)
    def _get(self, key, timeout): return self._t.get(key, timeout)
    def _add(self, key, amount): return self._t.add(key, amount)
    def _wait(self, keys, timeout): return self._t.wait(keys, timeout)
    def _compare_set(self, key, e, d): return self._t.compare_set(key, e, d)
    def _delete(self, key): return self._t.delete(key)
    def _num_keys(self): return self._t.num_keys()
    def _check(self, keys): return self._t.check(keys)


class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix + '/'``."""

    def __init__(self, prefix: str, store: Store):
        self.prefix, self.underlying_store = str(prefix), store

    @property
    def _timeout(self):
        return self.underlying_store._timeout

    @_timeout.setter
    def _timeout(self, value):
        self.underlying_store._timeout = value

    def _k(self, key):
        return f"{self.prefix}/{key}"

    def _describe(self):
        return f"PrefixStore({self.prefix!r}, {self.underlying_store._describe()})"

    def _set(self, key, value): self.underlying_store._set(self._k(key), value)
    def _get(self, key, timeout): return self.underlying_store._get(self._k(key), timeout)
    def _add(self, key, amount): return self.underlying_store._add(self._k(key), amount)
    def _compare_set(self, key, e, d): return self.underlying_store._compare_set(self._k(key), e, d)
    def _delete(self, key): return self.underlying_store._delete(self._k(key))
    def _num_keys(self): return self.underlying_store._num_keys()
    def _check(self, keys): return self.underlying_store._check([self._k(k) for k in keys])

    def _wait(self, keys, timeout):
        missing = self.underlying_store._wait([self._k(k) for k in keys], timeout)
        return [m[len(self.prefix) + 1:] for m in missing]


# ---------------------------------------------------------------------------------------------
# FileStore: an append-only log of records in one file, under an fcntl lock
