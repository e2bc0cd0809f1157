"""The vocabulary every algorithm is written in.

An algorithm is a pure generator ``f(rank, size, ...) -> Step*``: the steps one rank performs.
A *step* posts all its receives and sends at once, waits for all of them, then runs its local
operations (copies and reductions) in order. Data lives in named flat buffers; a *region* is
``(buffer, offset, count)`` in elements of the collective's dtype.

Buffer conventions, per collective (``counts[i]`` is rank i's block; ``c`` a single count):

    all_reduce      output (c): holds this rank's data at the start, the result at the end
    broadcast       output (c): holds the data at the root at the start, everywhere at the end
    reduce          input (c) read-only; output (c) written only at the root
    reduce_scatter  input (sum counts) read-only; output (counts[rank])
    all_gather      input (counts[rank]); output (sum counts)
    all_to_all      input (sum_j counts[rank][j]); output (sum_i counts[i][rank])
    gather          input (counts[rank]); output (sum counts), written only at the root
    scatter         input (sum counts), read only at the root; output (counts[rank])
    barrier         one-element uint8 messages in scratch; no user data

``scratch`` is private working space; its size is derived from the regions that use it.
Names used throughout: *block* = one rank's share of a buffer; *segment* = one message of a
pipelined block; ``right``/``left`` = ring neighbours.
"""
from __future__ import annotations

import functools
import operator
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from ..ops import COLLECTIVES


class Region(NamedTuple):
    buffer: str
    offset: int
    count: int

    def sub(self, offset: int, count: int) -> "Region":
        """The part of this region ``count`` elements long, ``offset`` elements in."""
        return Region(self.buffer, self.offset + offset, count)

    @property
    def end(self) -> int:
        return self.offset + self.count

    def overlaps(self, other: "Region") -> bool:
        """Same buffer and the element ranges intersect (the one test every executor and
        transform uses to order accesses)."""
        return self.buffer == other.buffer and self.offset < other.end and \
            other.offset < self.end


class Send(NamedTuple):
    peer: int
    region: Region


class Recv(NamedTuple):
    peer: int
    region: Region


class Copy(NamedTuple):
    src: Region
    dst: Region


class Reduce(NamedTuple):
    """dst = a (op) b, element-wise. ``dst`` may alias ``a`` or ``b``."""
    dst: Region
    a: Region
    b: Region


@dataclass(frozen=True)
class Step:
    sends: tuple = ()
    recvs: tuple = ()
    local: tuple = ()     # Copy / Reduce, run in order after every transfer of the step is done

    def __init__(self, sends: tuple = (), recvs: tuple = (), local: tuple = ()):
        # the generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; filling the instance dict directly costs a third less, and
        # plans at p = 1024 are built from millions of steps
        fields = self.__dict__
        fields["sends"], fields["recvs"], fields["local"] = sends, recvs, local


EMPTY = Step()


def partition(count: int, size: int, buffer: str = "output", base: int = 0) -> list[Region]:
    """Split ``count`` elements into ``size`` contiguous blocks; the first ``count % size``
    blocks get one extra element, so blocks differ by at most one and may be empty."""
    q, r = divmod(count, size)
    blocks, offset = [], base
    for i in range(size):
        n = q + (1 if i < r else 0)
        blocks.append(Region(buffer, offset, n))
        offset += n
    return blocks


class Matrix(tuple):
    """An all_to_all count matrix (a tuple of rows) that hashes once: plans are cached by
    their counts, and at p = 1024 the matrix has a million entries."""

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:
            self._hash = tuple.__hash__(self)
            return self._hash


def layout(counts: Iterable[int], buffer: str, base: int = 0) -> list[Region]:
    """Consecutive blocks of the given counts (allgatherv / alltoallv layouts)."""
    blocks, offset = [], base
    for n in counts:
        blocks.append(Region(buffer, offset, n))
        offset += n
    return blocks


def sendrecv(send_peer=None, send_region=None, recv_peer=None, recv_region=None, *,
             reduce: bool = False, scratch_offset: int = 0) -> Step:
    """One exchange. With ``reduce=True`` the incoming data lands in scratch and is then
    reduced into ``recv_region`` (recv_region = recv_region op incoming)."""
    if (send_peer is None or not send_region.count) and (recv_peer is None or not recv_region.count):
        return EMPTY          # nothing moves (small counts at large world sizes): keep it cheap
    sends = () if send_peer is None else (Send(send_peer, send_region),)
    if recv_peer is None:
        return Step(sends=sends)
    if not reduce:
        return Step(sends=sends, recvs=(Recv(recv_peer, recv_region),))
    landing = Region("scratch", scratch_offset, recv_region.count)
    return Step(sends=sends, recvs=(Recv(recv_peer, landing),),
                local=(Reduce(recv_region, recv_region, landing),))


def send(peer, region) -> Step:
    return Step(sends=(Send(peer, region),))


def recv(peer, region, *, reduce: bool = False, scratch_offset: int = 0) -> Step:
    return sendrecv(None, None, peer, region, reduce=reduce, scratch_offset=scratch_offset)


def copy(src: Region, dst: Region) -> Step:
    return Step(local=(Copy(src, dst),))


ROOTED = ("broadcast", "reduce", "gather", "scatter")


def plan_args(collective, size, counts, root=0):
    """The schedule arguments after (rank, size) for ``collective``."""
    if collective == "barrier":
        return ()
    if collective in ROOTED:
        return (counts, root)
    return (counts,)


def buffer_sizes(collective, rank, size, counts, root=0):
    """(input elements, output elements) this rank's buffers must hold."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return counts, counts
    if collective == "reduce_scatter":
        return sum(counts), counts[rank]
    if collective == "all_gather":
        return counts[rank], sum(counts)
    if collective == "all_to_all":
        return sum(counts[rank]), sum(row[rank] for row in counts)
    if collective == "gather":
        return counts[rank], sum(counts)
    if collective == "scatter":
        return sum(counts), counts[rank]
    return 0, 0


# ---------------------------------------------------------------------------------------------
# Plans: a materialized, cached schedule


@dataclass(frozen=True)
class Plan:
    collective: str
    algorithm: str
    rank: int
    size: int
    steps: tuple
    scratch: int          # elements of scratch the plan needs (derived from its regions)
    args: tuple = ()      # build_plan's arguments after (rank, size): every rank's plan can be
                          # rebuilt from them (the peer-memory lowering pairs sends with the
                          # receiving rank's regions); () for a plan built by hand

    @property
    def messages(self) -> int:
        return sum(len(s.sends) for s in self.steps)

    def derived(self, kind: str, key, build):
        """``build()`` (a plan derived from this one: segmented, windowed), kept on this plan
        under ``kind`` and ``key``. Plans are cached by ``build_plan``, so each derived plan is
        built once; hashing a whole plan per call, as an lru_cache key would, costs more than
        the look-up saves at large p."""
        cache = self.__dict__.get(kind)
        if cache is None:
            cache = {}
            object.__setattr__(self, kind, cache)
        value = cache.get(key)
        if value is None:
            value = cache[key] = build()
        return value


def _drop_empty(step: Step) -> Step | None:
    """Zero-element transfers are dropped on both sides alike (both sides derive the count
    from the same partition), so small counts at large world sizes cost nothing."""
    if step is EMPTY:
        return None
    sends, recvs, local = step.sends, step.recvs, step.local
    # plans at p = 1024 are built from millions of steps: the common cases (no count zero,
    # every count zero) are told apart without a Python frame per transfer
    counts = [*map(_transfer_count, sends + recvs), *map(_op_count, local)]
    if all(counts):
        return step if counts else None
    if not any(counts):
        return None
    sends = tuple(s for s in sends if s.region.count > 0)
    recvs = tuple(r for r in recvs if r.region.count > 0)
    local = tuple(op for op in local if op.dst.count > 0)
    if not (sends or recvs or local):
        return None
    return Step(sends, recvs, local)


_transfer_count = operator.attrgetter("region.count")     # of a Send or a Recv
_op_count = operator.attrgetter("dst.count")              # of a Copy or a Reduce


def _scratch_needed(steps) -> int:
    end = 0
    for step in steps:
        for transfers in (step.sends, step.recvs):
            for transfer in transfers:
                buffer, offset, count = transfer.region
                if buffer == "scratch" and offset + count > end:
                    end = offset + count
        for op in step.local:
            for buffer, offset, count in op:      # Copy and Reduce are tuples of regions
                if buffer == "scratch" and offset + count > end:
                    end = offset + count
    return end


# collective -> algorithm name -> schedule function
REGISTRY: dict[str, dict[str, Callable]] = {}
# What ``auto`` may choose, as collective -> name -> the function so registered (a name
# registered again by other code is that code's schedule, not the one listed here):
# PACKAGE holds the package's own schedules (recorded by ``collectives.algorithms`` once its
# modules have registered them; the schedule tests prove them at world sizes 1-33, 64, 100
# and 1024); OPTED_IN those registered with ``auto=True``, which a group's decision table
# proves in the simulator at its world size before ``auto`` may run them.
PACKAGE: dict[str, dict[str, Callable]] = {}
OPTED_IN: dict[str, dict[str, Callable]] = {}
RESERVED_NAMES = ("auto", "native")     # what a call's algorithm= means besides a schedule


def algorithm(collective: str, name: str, *, auto: bool = False):
    """Register a schedule function as ``name`` for ``collective``.

    A registered schedule runs where a call names it (``algorithm=name``, or
    ``COLLECTIVES_ALGORITHM``). ``auto`` chooses only among the package's own schedules
    unless ``auto=True``: then it is a candidate too, once the simulator has proven it at
    the group's world size (``collectives.algorithms.auto_candidates``); a group whose table
    finds it wrong refuses to be made, with a ValueError saying what was wrong.
    Registering a name again replaces the schedule (and its opt-in) and forgets its plans."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if not isinstance(name, str) or not name or name in RESERVED_NAMES or ":" in name:
        raise ValueError(f"algorithm({collective!r}, {name!r}): the name must be a non-empty "
                         f"string without ':' other than {' and '.join(RESERVED_NAMES)}")
    if not isinstance(auto, bool):
        raise TypeError(f"algorithm({collective!r}, {name!r}): auto must be True or False, "
                        f"got {auto!r}")

    def register(fn):
        REGISTRY.setdefault(collective, {})[name] = fn
        opted = OPTED_IN.setdefault(collective, {})
        opted.pop(name, None)
        if auto:
            opted[name] = fn
        # plans and the model's prices are cached by name: any held for this name were
        # another function's (one registered before, or removed from the registry since)
        build_plan.cache_clear()
        cost = sys.modules.get(f"{__package__}.cost")
        if cost is not None:
            cost.clear_caches()
        return fn
    return register


def record_package_schedules() -> None:
    """Mark every schedule registered so far as the package's own (``PACKAGE``): called once
    by ``collectives.algorithms`` after importing the modules that define them."""
    for collective, table in REGISTRY.items():
        PACKAGE.setdefault(collective, {}).update(table)


def _listed(table: dict, collective: str, name: str) -> bool:
    fn = table.get(collective, {}).get(name)
    return fn is not None and REGISTRY.get(collective, {}).get(name) is fn


def is_package_schedule(collective: str, name: str) -> bool:
    """Whether ``name`` is still the package's own schedule for ``collective``."""
    return _listed(PACKAGE, collective, name)


def is_opted_in(collective: str, name: str) -> bool:
    """Whether ``name`` was registered with ``auto=True`` (and is not the package's own)."""
    return _listed(OPTED_IN, collective, name) and not is_package_schedule(collective, name)


def auto_names(collective: str) -> tuple[str, ...]:
    """The names ``auto`` may choose for ``collective``, sorted: the package's own schedules
    and those registered with ``auto=True`` (proving those is the caller's part:
    ``collectives.algorithms.auto_candidates``)."""
    return tuple(sorted(name for name in REGISTRY.get(collective, {})
                        if is_package_schedule(collective, name)
                        or is_opted_in(collective, name)))


# Families of schedules made from other schedules, named ``prefix:rest`` (registered names
# never hold ':'): prefix -> resolver(collective, rest) returning the schedule function (the
# same one for the same arguments, so plans cache by name), or raising ValueError that names
# the collective and says what is wrong. ``hierarchical:<intra>+<inter>@<topology>`` is one.
FAMILIES: dict[str, Callable] = {}


def family(prefix: str):
    """Register ``resolver(collective, rest)`` for the names ``prefix:rest``."""
    if not prefix or ":" in prefix or prefix in RESERVED_NAMES:
        raise ValueError(f"family({prefix!r}): the prefix must be a non-empty name without ':'")

    def register(resolver):
        FAMILIES[prefix] = resolver
        build_plan.cache_clear()
        return resolver
    return register


def is_family_name(name) -> bool:
    """Whether ``name`` is ``prefix:rest`` for a registered family."""
    return isinstance(name, str) and name.partition(":")[0] in FAMILIES and ":" in name


def schedule_function(collective: str, name: str) -> Callable:
    """The schedule function ``name`` stands for: a registered one, or one a family makes
    (ValueError, naming the collective, where the family cannot make it); KeyError where
    ``name`` is neither."""
    fn = REGISTRY.get(collective, {}).get(name)
    if fn is not None:
        return fn
    if is_family_name(name):
        prefix, _, rest = name.partition(":")
        return FAMILIES[prefix](collective, rest)
    raise KeyError(name)


@functools.lru_cache(maxsize=4096)
def build_plan(collective: str, name: str, rank: int, size: int, *args) -> Plan:
    """Materialize (and cache) one rank's steps. ``args`` are the collective's hashable
    arguments after (rank, size): a count, a tuple of counts, a matrix of counts, a root."""
    fn = schedule_function(collective, name)
    steps = tuple(filter(None, map(_drop_empty, fn(rank, size, *args))))    # None: dropped
    return Plan(collective, name, rank, size, steps, _scratch_needed(steps), args)
