"""COLLECTIVES_DEBUG: OFF (default), INFO (log algorithm choices), DETAIL (also check, before
every collective, that all ranks of the group are making the same call).

The DETAIL check: every rank hashes each field of its call (operation, algorithm, dtype,
counts, root, op) to 8 bytes, the ranks all-gather these fingerprints, and every rank compares
them. Since every rank sees the same gathered table, every rank raises the same
CollectiveError naming the fields and the ranks that differ: never a hang, never garbage.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from .errors import CollectiveError

ENV_DEBUG = "COLLECTIVES_DEBUG"
FIELDS = ("operation", "algorithm", "dtype", "counts", "root", "op")
_WIDTH = 8          # bytes of hash per field


def level() -> str:
    value = os.environ.get(ENV_DEBUG, "OFF").upper()
    return value if value in ("OFF", "INFO", "DETAIL") else "OFF"


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
