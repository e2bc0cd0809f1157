"""COLLECTIVES_DEBUG: OFF (default), INFO (log algorithm choices), DETAIL (also check, before
every collective, that all ranks of the group are making the same call). torch's
``get_debug_level`` / ``set_debug_level`` / ``DebugLevel`` read and write this one variable.

The DETAIL check: every rank hashes each field of its call (operation, algorithm, dtype,
counts, root, op) to 8 bytes, the ranks all-gather these fingerprints, and every rank compares
them. Since every rank sees the same gathered table, every rank raises the same
CollectiveError naming the fields and the ranks that differ: never a hang, never garbage.
"""
from __future__ import annotations

import enum
import hashlib
import logging
import os
import sys
import time

import numpy as np

from . import settings
from .errors import CollectiveError

ENV_DEBUG = settings.DEBUG.name
ENV_TORCH_DEBUG = "TORCH_DISTRIBUTED_DEBUG"     # read by set_debug_level_from_env only
FIELDS = ("operation", "algorithm", "dtype", "counts", "root", "op")
_WIDTH = 8          # bytes of hash per field


class DebugLevel(enum.IntEnum):
    """torch.distributed's debug levels, by the same names; their one store is the
    COLLECTIVES_DEBUG variable, which ``level()`` reads at every use (``settings.DEBUG``)."""
    OFF = 0
    INFO = 1
    DETAIL = 2


level = settings.DEBUG     # level(): "OFF", "INFO" or "DETAIL"; anything else is a ValueError


def get_debug_level() -> DebugLevel:
    """The current debug level (COLLECTIVES_DEBUG), as torch's ``get_debug_level``.

    Returns:
        DebugLevel: an unset COLLECTIVES_DEBUG is ``DebugLevel.OFF``, an unknown one a
            ValueError naming it.
    """
    return DebugLevel[level()]


def set_debug_level(debug_level) -> None:
    """Set the debug level of this process.

    Writes COLLECTIVES_DEBUG, so that subprocesses and every reader see the same level.

    Args:
        debug_level (DebugLevel, int or str): a level, its integer value or its name in any
            case.

    Returns:
        None.
    """
    os.environ[ENV_DEBUG] = _parse_level(debug_level, "set_debug_level").name


def set_debug_level_from_env() -> None:
    """Set the debug level from COLLECTIVES_DEBUG if set, else torch's TORCH_DISTRIBUTED_DEBUG.

    OFF when neither is set; an unknown value is a ValueError, as in torch.

    Returns:
        None.
    """
    for name in (ENV_DEBUG, ENV_TORCH_DEBUG):
        value = settings.DEBUG.raw() if name == ENV_DEBUG else os.environ.get(name)
        if value is not None:
            set_debug_level(_parse_level(value, f"set_debug_level_from_env ({name})"))
            return
    set_debug_level(DebugLevel.OFF)


def _parse_level(value, where: str) -> DebugLevel:
    if isinstance(value, str) and value.strip().upper() in DebugLevel.__members__:
        return DebugLevel[value.strip().upper()]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DebugLevel(value)
        except ValueError:
            pass
    name = getattr(value, "name", None)        # torch's own DebugLevel
    if isinstance(name, str) and name.upper() in DebugLevel.__members__:
        return DebugLevel[name.upper()]
    raise ValueError(f"{where}: the debug level must be one of OFF, INFO, DETAIL, got "
                     f"{value!r}")


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, whose INFO lines show when COLLECTIVES_DEBUG is INFO or
    DETAIL: on stderr where nobody configured logging (Python's last resort shows warnings
    only)."""
    log = logging.getLogger(name)
    if level() != "OFF":
        if not log.isEnabledFor(logging.INFO):
            log.setLevel(logging.INFO)
        if not (log.handlers or logging.getLogger().handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
            log.addHandler(handler)
    return log


class Waiting:
    """A bounded wait that says what it waits for. Set-up waits (the rendezvous, a transport's
    connections) can last the whole init timeout, 30 minutes by default, and silence then
    looks like a hang: every REPORT_SECONDS the caller's description goes out at INFO, and
    from WARN_AFTER_SECONDS on once a minute at WARNING, which shows without any logging
    set-up. ``step()`` is how long to wait before reporting again (or the timeout ends: None
    means no timeout); ``expired()`` whether the timeout has passed; ``report(what)`` logs
    what is awaited, when a report is due."""

    REPORT_SECONDS = 5.0
    WARN_AFTER_SECONDS = 30.0
    WARN_EVERY_SECONDS = 60.0

    def __init__(self, log: logging.Logger, timeout: float | None, grace: float = 0.0):
        self.log, self.timeout, self.grace = log, timeout, grace    # grace: expire later
        self.start = time.monotonic()
        self._next_report = self.start + self.REPORT_SECONDS
        self._next_warning = self.start + self.WARN_AFTER_SECONDS

    def waited(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float | None:
        return None if self.timeout is None else max(0.0, self.start + self.timeout +
                                                      self.grace - time.monotonic())

    def step(self) -> float:
        until_report = max(0.0, self._next_report - time.monotonic())
        left = self.left()
        return until_report if left is None else min(until_report, left)

    def expired(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def report(self, what: str) -> None:
        now = time.monotonic()
        if now < self._next_report:
            return
        self._next_report = now + self.REPORT_SECONDS
        limit = "no timeout" if self.timeout is None else f"{self.timeout:.0f} s"
        line = f"{what} ({self.waited():.0f} s of {limit})"
        if now >= self._next_warning:
            self._next_warning = now + self.WARN_EVERY_SECONDS
            self.log.warning(line)
        else:
            self.log.info(line)


def ranks_text(ranks, most: int = 16) -> str:
    """``[2]``, ``[0, 3, 5]``, or the first ``most`` and how many in all."""
    ranks = list(ranks)
    if len(ranks) <= most:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return "[" + ", ".join(map(str, ranks[:most])) + f", ...] ({len(ranks)} ranks)"


def fingerprint(**fields) -> np.ndarray:
    """The call's fields as one flat uint8 array, 8 bytes of blake2b per field."""
    out = np.empty(len(FIELDS) * _WIDTH, dtype=np.uint8)
    for index, name in enumerate(FIELDS):
        digest = hashlib.blake2b(repr(fields[name]).encode(), digest_size=_WIDTH).digest()
        out[index * _WIDTH:(index + 1) * _WIDTH] = np.frombuffer(digest, dtype=np.uint8)
    return out


def compare(table: np.ndarray, mine: dict, rank: int, operation: str) -> None:
    """``table`` is every rank's fingerprint, one row per rank. Raise on any difference."""
    rows = table.reshape(-1, len(FIELDS), _WIDTH)
    differing = []
    for index, name in enumerate(FIELDS):
        column = rows[:, index, :]
        groups: dict[bytes, list[int]] = {}
        for r, value in enumerate(column):
            groups.setdefault(value.tobytes(), []).append(r)
        if len(groups) > 1:
            mine_key = fingerprint(**mine).reshape(len(FIELDS), _WIDTH)[index].tobytes()
            others = sorted((ranks for key, ranks in groups.items() if key != mine_key), key=min)
            differing.append(f"{name} (this rank: {mine[name]!r}; ranks "
                             f"{', '.join(_span(g) for g in others)} differ)")
    if differing:
        raise CollectiveError(f"{operation} on rank {rank}: the ranks of the group made "
                              f"mismatched calls: " + "; ".join(differing))


def _span(ranks) -> str:
    return "[" + ",".join(map(str, ranks)) + "]"
