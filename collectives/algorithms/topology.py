"""A topology: the ranks of a group grouped into hosts, as data (no detection here).

A host is a tuple of the ranks on it, ascending; hosts are ordered by their lowest rank, so
one grouping has one ``Topology``. Hosts may differ in size (3 and 5 ranks, 1 and 7). A rank's
*local index* is its position on its host.

Text form (``COLLECTIVES_TOPOLOGY``, and the ``@...`` suffix of a hierarchical algorithm's
name), two shapes:

- host sizes, ranks numbered host after host: ``3,5`` (ranks 0-2 on one host, 3-7 on the
  next); ``HxN`` stands for H hosts of N ranks: ``64x8``, ``2x4,1`` (two hosts of 4, then one
  of 1); a single number is one host;
- a rank -> host map, for ranks placed round-robin or anyhow: ``map:0,1,0,1`` (entry r names
  rank r's host; any non-negative integers, equal ones meaning one host).

``spec`` writes the shortest such text (sizes where the hosts hold consecutive ranks, else
the map), so equal groupings have equal names.
"""
from __future__ import annotations

from dataclasses import dataclass

MAP_PREFIX = "map:"


@dataclass(frozen=True)
class Topology:
    """``hosts``: the ranks of each host (see the module); every rank 0..size-1 on one host."""
    hosts: tuple

    def __post_init__(self):
        hosts = tuple(tuple(sorted(int(r) for r in host)) for host in self.hosts)
        if not hosts or any(not host for host in hosts):
            raise ValueError(f"topology: every host needs at least one rank, got "
                             f"{[list(h) for h in hosts]}")
        ranks = sorted(r for host in hosts for r in host)
        if ranks != list(range(len(ranks))):
            raise ValueError(f"topology: the hosts must hold every rank 0..{len(ranks) - 1} "
                             f"exactly once, got {[list(h) for h in hosts]}")
        hosts = tuple(sorted(hosts))
        object.__setattr__(self, "hosts", hosts)
        host_of, local = [0] * len(ranks), [0] * len(ranks)
        for h, host in enumerate(hosts):
            for j, r in enumerate(host):
                host_of[r], local[r] = h, j
        object.__setattr__(self, "_host_of", tuple(host_of))
        object.__setattr__(self, "_local", tuple(local))

    # -- making one ----------------------------------------------------------------------------

    @classmethod
    def from_sizes(cls, sizes) -> "Topology":
        """Hosts of ``sizes`` ranks, numbered host after host."""
        sizes = [int(n) for n in sizes]
        if not sizes or any(n < 1 for n in sizes):
            raise ValueError(f"topology: host sizes must be integers >= 1, got {sizes}")
        hosts, first = [], 0
        for n in sizes:
            hosts.append(tuple(range(first, first + n)))
            first += n
        return cls(tuple(hosts))

    @classmethod
    def from_map(cls, host_of) -> "Topology":
        """``host_of[r]``: rank r's host (any hashable labels; equal labels, one host)."""
        groups: dict = {}
        for rank, label in enumerate(host_of):
            groups.setdefault(label, []).append(rank)
        if not groups:
            raise ValueError("topology: the rank -> host map is empty")
        return cls(tuple(tuple(g) for g in groups.values()))

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """A topology from its text form (see the module); ValueError saying what was
        expected otherwise."""
        if isinstance(text, Topology):
            return text
        if not isinstance(text, str):
            raise TypeError(f"topology: expected text such as '3,5', '64x8' or "
                            f"'map:0,1,0,1', got {type(text).__name__}")
        body = text.strip().replace(" ", "")
        try:
            if body.lower().startswith(MAP_PREFIX):
                labels = [int(x) for x in body[len(MAP_PREFIX):].split(",")]
                if any(x < 0 for x in labels):
                    raise ValueError
                return cls.from_map(labels)
            sizes = []
            for item in body.split(","):
                count, times, size = item.lower().rpartition("x")
                hosts = int(count) if times else 1
                if hosts < 1:
                    raise ValueError
                sizes += [int(size)] * hosts
            return cls.from_sizes(sizes)
        except ValueError:
            raise ValueError(f"topology {text!r}: expected host sizes ('3,5'; 'HxN' for H "
                             f"hosts of N ranks: '64x8', '2x4,1') or a rank -> host map "
                             f"('map:0,1,0,1'), every size >= 1") from None

    @classmethod
    def of(cls, value) -> "Topology":
        """``value`` as a Topology: one already, its text, a list of host sizes, or a
        ``{rank: host}`` mapping."""
        if isinstance(value, Topology):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            return cls.from_map([value[r] for r in range(len(value))])
        if isinstance(value, (list, tuple)) and all(isinstance(n, int) for n in value):
            return cls.from_sizes(value)
        raise TypeError(f"topology: expected a Topology, its text ('3,5', '64x8', "
                        f"'map:0,1,0,1'), a list of host sizes or a {{rank: host}} mapping, "
                        f"got {value!r}")

    # -- reading it ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self._host_of)

    @property
    def sizes(self) -> tuple:
        return tuple(len(h) for h in self.hosts)

    def host_of(self, rank: int) -> int:
        return self._host_of[rank]

    def local_index(self, rank: int) -> int:
        return self._local[rank]

    @property
    def host_map(self) -> tuple:
        """rank -> host index, for every rank."""
        return self._host_of

    @property
    def contiguous(self) -> bool:
        """Whether every host holds consecutive ranks (host after host)."""
        return all(host[-1] - host[0] == len(host) - 1 for host in self.hosts)

    @property
    def spec(self) -> str:
        """The shortest text form (see the module)."""
        if not self.contiguous:
            return MAP_PREFIX + ",".join(map(str, self._host_of))
        runs: list = []
        for n in self.sizes:
            if runs and runs[-1][1] == n:
                runs[-1][0] += 1
            else:
                runs.append([1, n])
        return ",".join(str(n) if k == 1 else f"{k}x{n}" for k, n in runs)

    def check_size(self, size: int, operation: str) -> None:
        """ValueError, naming ``operation``, unless the topology covers exactly ``size``
        ranks."""
        if self.size != size:
            raise ValueError(f"{operation}: the topology {self.spec} covers {self.size} ranks, "
                             f"but the group has {size}; it must name every rank's host")

    def __str__(self) -> str:
        return self.spec
