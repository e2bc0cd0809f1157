"""The decision table: which algorithm ``auto`` runs, per collective and size class, per group.

A group builds its table once, when it is made (``DecisionTable.for_group``); at call time
``auto`` is a look-up in it. Sources, most specific first:

1. the call's ``algorithm=`` (never reaches the table: the group runs what was asked for);
2. ``COLLECTIVES_ALGORITHM`` (``all_reduce=ring,...``): every size of that collective;
3. the tuning file (``COLLECTIVES_TUNING``): the winners ``bench.py --tune`` measured on this
   machine for this transport and world size, each holding for its size class and for the
   classes between two measured ones (the nearer measured class; the smaller on a tie);
4. the α-β-γ model (``algorithms/cost.py``, with the file's parameters or the defaults of
   where the group runs its plans: its executor's ``model_name``, ``nccl_peer`` for an nccl
   group on peer memory) for what nothing measured covers: other world sizes, sizes outside
   the measured range, collectives the run did not measure.

Sources 3 and 4 choose among ``algorithms.auto_candidates``: the package's own schedules and
those registered with ``@algorithm(..., auto=True)``. A schedule registered without it runs
only where a call or ``COLLECTIVES_ALGORITHM`` names it; a tuning file row naming one is an
error. An opted-in schedule is proven in the simulator when the table is made, at the
group's world size on the schedule tests' cases (for every collective without an override),
and again at each size class before a row prices it (classes of up to
``algorithms.PROVE_MAX_ELEMENTS`` elements over the ranks); a failure is a ValueError that
names the schedule, the collective, the world size and what went wrong: at the group's
making, or at the call whose size class found it. Proofs are kept per schedule function and
world size in the process. The opted-in names are among the sources the ranks' digests
cover, so ranks that opted in different schedules refuse to make the group.

Size classes are powers of two of the call's size in bytes (``call_size``' convention):
class 0 holds empty calls, class c >= 1 the sizes [2^(c-1), 2^c); the last class holds
everything larger. The model prices a class at its smallest size. Model rows are worked out
at their first use and kept (pricing every class at once would replay every rank's plan for
each of them when the group is made), so what the ranks agree on is the table's sources, hashed
(``digest``): world size, transport, its model, overrides, window, and the transport's
entry of the tuning file. Equal sources give equal tables on every rank, since the model is a pure
function of them; the group compares the digests when it is made (``check_agreement``).

The tuning file (JSON): ``{transport: {"alpha", "beta", "gamma", shape terms, "decisions":
{collective: {"<world size>": [{"bytes", "algorithm", "by", "median_us": {algorithm: µs},
"noise", "rounds", "threshold"}, ...]}}, "measured": ratios}}``. ``"by"`` says how the winner
was found: ``measured`` (its median beat the runner-up's by more than the threshold, the noise
of a median over the rounds), ``rounds`` (it did not, but it was faster than every algorithm
within the threshold in enough of the rounds, compared round by round: a sign test),
``neighbour`` (neither, and the algorithm that won outright at the nearest measured size was
within the threshold here) or ``model`` (none of these, and the model's preference among the
algorithms within the threshold decided). A file without ``decisions`` may carry
``measured`` ratios instead (measured / predicted, ``algorithms/measured.py``): its winner at
each measured size is the algorithm whose ratio times the model's prediction, i.e. whose
measured time, is least. ``collectives/tuning_file.py`` reads and writes the file;
``collectives/bench/fit.py`` decides its rows from a bench run (offline).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass

from . import settings, tuning_file
from .algorithms import PROVE_MAX_ELEMENTS, auto_candidates, cost, prove_opted_in, two_level
from .algorithms.hierarchical import SUPPORTED as HIERARCHICAL
from .algorithms.hierarchical import qualify
from .algorithms.topology import Topology
from .algorithms.two_level import hierarchical_names
from .algorithms.schedule import COLLECTIVES, auto_names, is_opted_in, is_package_schedule
from .tuning_file import DECISIONS
from .tuning_file import RATIOS as RATIOS_KEY
# The tuning file's reader and writer, where callers of this module reach them
from .tuning_file import entry as read_entry  # noqa: F401
from .tuning_file import save_decisions as save  # noqa: F401
from .tuning_file import validate as validate_entry  # noqa: F401
LAST_CLASS = 41                 # 1 TiB and up share the last class
DIGEST_BYTES = 16
LABEL_BYTES = 512               # what each rank says about its sources when digests differ
AGREEMENT_RECORD = DIGEST_BYTES + LABEL_BYTES
SOURCES = ("override", "measured", "model")


def size_class(nbytes: int) -> int:
    """The size class of a call of ``nbytes`` bytes."""
    return min(int(nbytes).bit_length(), LAST_CLASS)


def class_bytes(cls: int) -> int:
    """The smallest size of class ``cls`` (where the model prices it)."""
    return 0 if cls <= 0 else 1 << (cls - 1)


def format_bytes(n: int) -> str:
    for suffix, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


def class_label(first: int, last: int | None = None) -> str:
    """``64K-256K``: the sizes of classes ``first`` .. ``last`` (bounds inclusive, exclusive)."""
    last = first if last is None else last
    lo = format_bytes(class_bytes(first))
    if last >= LAST_CLASS:
        return f"{lo}+"
    if first == 0 and last == 0:
        return "0"
    return f"{lo}-{format_bytes(class_bytes(last + 1))}"


@dataclass(frozen=True)
class Decision:
    """One row: the schedule and the executor's knobs for a (collective, size class)."""
    algorithm: str
    by: str                     # "override", "measured" or "model"
    window: int = 1             # steps in flight (host transports; 1 = off)
    segment: int | None = None  # bytes per segment (0: whole messages; None: the executor's own)
    note: str = ""


_where = tuning_file.where


def parse_overrides(text: str | None, native_available: bool = True,
                    topology=None) -> dict[str, str]:
    """``all_reduce=ring,all_gather=tree`` (COLLECTIVES_ALGORITHM) as {collective: name}.
    A hierarchical name without ``@<topology>`` (``all_reduce=hierarchical:ring+ring``) takes
    ``topology`` (the group's); without one it is a ValueError saying so.

    Hierarchical names contain commas only inside their topology (``@3,5``): an item that
    has no ``=`` continues the item before it when that one names a topology."""
    from .algorithms import canonical, check_algorithm
    from .algorithms.hierarchical import qualify
    name = settings.ALGORITHM.name
    items: list[str] = []
    for part in filter(None, (part.strip() for part in (text or "").split(","))):
        if "=" not in part and items and "@" in items[-1]:
            items[-1] += "," + part           # hierarchical:ring+ring@3,5: the topology's comma
        else:
            items.append(part)
    overrides = {}
    for item in items:
        collective, sep, algorithm = item.partition("=")
        if not sep:
            raise ValueError(f"{name}: {item!r} is not of the form collective=algorithm")
        collective, algorithm = collective.strip(), qualify(algorithm.strip(), topology)
        try:
            check_algorithm(collective, algorithm, native_available=native_available)
        except ValueError as exc:
            raise ValueError(f"{name}={text!r}: {exc}") from None
        overrides[collective] = canonical(collective, algorithm)
    return overrides


# ---------------------------------------------------------------------------------------------
# What a tuning file measured


def measured_points(entry: dict, collective: str, size: int, params, path: str = "") -> list:
    """[(bytes, algorithm, row)] the file measured for ``collective`` on ``size`` ranks,
    sorted by size: its ``decisions`` where it has them, else the winners of its ratios."""
    where = f"{_where(path)}: {collective} p={size}"
    rows = entry.get(DECISIONS) or {}
    listed = rows.get(collective, {}).get(str(size)) if isinstance(rows, dict) and \
        isinstance(rows.get(collective), dict) else None
    if listed is not None:
        return tuning_file.decision_rows(listed, collective, where)
    if RATIOS_KEY not in entry:
        return []
    curves = tuning_file.ratios_of(entry[RATIOS_KEY], f"{_where(path)}: {RATIOS_KEY!r}").get(
        (collective, size), {})
    valid = set(auto_names(collective))
    times: dict[int, dict[str, float]] = {}
    for name, points in curves.items():
        if name not in valid:
            continue
        for nbytes, ratio in points:
            seconds = ratio * cost.estimate(collective, name, size, nbytes, params)
            times.setdefault(nbytes, {})[name] = seconds * 1e6
    out = []
    for nbytes in sorted(times):
        medians = times[nbytes]
        best = min(sorted(medians), key=medians.get)
        out.append((nbytes, best, {"bytes": nbytes, "algorithm": best, "by": "measured",
                                   "median_us": medians}))
    return out


# ---------------------------------------------------------------------------------------------
# The model's choice outside a group


def choose(collective: str, size: int, nbytes: int, transport: str = "") -> str:
    """The model's choice: the algorithm ``auto`` may run with the least predicted time
    (``algorithms/cost.py``'s α-β-γ model, with ``transport``'s parameters from the tuning
    file or its defaults, times the measured ratios the file holds, if any). A pure function of its arguments and the tuning file (``COLLECTIVES_TUNING``
    as it is now). Groups do not call this: their ``auto`` is a look-up in their
    ``DecisionTable``, which falls back to the same model for what nothing measured.
    ``nbytes`` follows ``cost.uniform_counts``' convention (what the process group passes).
    Under ``COLLECTIVES_DEBUG=INFO`` (or DETAIL) each choice is logged with its prediction."""
    ranked = _ranked(collective, size, nbytes, transport, settings.TUNING(),
                     auto_candidates(collective, size))
    if settings.DEBUG() != "OFF":
        _log_choice(collective, size, nbytes, transport, ranked)
    return ranked[0][1]


@functools.lru_cache(maxsize=16384)
def _ranked(collective, size, nbytes, transport, tuning, candidates):
    """Cached per call shape. ``tuning`` (the file's path) and ``candidates`` are part of
    the key so that pointing the variable elsewhere, or opting a schedule in, takes effect."""
    if not candidates:
        raise ValueError(f"{collective} has no algorithm registered")
    params = tuning_file.load_params(transport, tuning or "")
    corrections = tuning_file.load_corrections(transport, tuning or "")
    return tuple(cost.ranking(collective, size, nbytes, params, candidates,
                              corrections=corrections))


def _log_choice(collective, size, nbytes, transport, ranked):
    from . import debug
    (best_time, best), rest = ranked[0], ranked[1:]
    text = (f"auto: {collective} of {nbytes} bytes on {size} ranks ({transport or 'default'} "
            f"parameters) -> {best}, predicted {cost.format_seconds(best_time)}")
    if rest:
        text += f"; runner-up {rest[0][1]} {cost.format_seconds(rest[0][0])}"
    if settings.DEBUG() == "DETAIL" and len(rest) > 1:
        text += "; others " + ", ".join(f"{name} {cost.format_seconds(t)}"
                                        for t, name in rest[1:])
    debug.logger("collectives").info(text)


# ---------------------------------------------------------------------------------------------
# Across hosts

# The (intra, inter) pairs auto prices as hierarchical candidates, where the collective has
# their parts (two_level.hierarchical_names): the ring's bandwidth inside, a ring or
# recursive doubling (fewer steps on the slow links) or a tree across, direct where hosts
# are few. Few on purpose: each is replayed per size class.
HIERARCHICAL_PAIRS = (("ring", "ring"), ("ring", "recursive_doubling"),
                      ("recursive_doubling", "recursive_doubling"), ("ring", "tree"),
                      ("direct", "direct"), ("ring", "direct"))


def _multi_host(topology) -> bool:
    """Whether two link classes matter: two hosts at least, one of them with two ranks."""
    return len(topology.hosts) > 1 and max(topology.sizes) > 1


@functools.lru_cache(maxsize=4096)
def two_level_ranking(collective: str, topology, nbytes: int, intra, inter,
                      candidates: tuple) -> tuple:
    """``cost.ranking``'s order for ``candidates`` (flat or hierarchical names) on
    ``topology``, priced by the two-level model (``two_level.estimate``: ``intra`` inside a
    host, ``inter`` between hosts); a candidate it cannot price ranks last (inf). Cached:
    the groups of one process share a size class's pricing."""
    timed = []
    for name in candidates:
        seconds = two_level.estimate(collective, name, topology, nbytes, intra=intra,
                                     inter=inter)
        timed.append((math.inf if seconds is None else seconds, name))
    return tuple(sorted(timed, key=lambda item: (float(f"{item[0]:.12g}"), item[1])))


# ---------------------------------------------------------------------------------------------
# The table


class DecisionTable:
    """``lookup(collective, nbytes)`` -> Decision; see the module docstring."""

    def __init__(self, size: int, transport: str, *, tuning: str = "", overrides=None,
                 window: int = 1, segment: int | None = None, native_available: bool = False,
                 agreed=None, model: str | None = None, rank: int | None = None,
                 topology=None):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"decision table: world size must be a positive integer, "
                             f"got {size!r}")
        self.size, self.transport, self.tuning = size, transport, tuning or ""
        # the ranks grouped into hosts (None: one level, as if on one host)
        self.topology = None if topology is None else Topology.of(topology)
        if self.topology is not None:
            self._proven(lambda: self.topology.check_size(size, "decision table"), rank)
        self.overrides = dict(overrides or {})
        for collective, name in self.overrides.items():
            if name == "native" and not native_available:
                raise ValueError(f"{settings.ALGORITHM.name}: {collective}={name}, but the "
                                 f"{transport or 'this'} transport has no native collectives")
        self.window, self.segment = window, segment
        # settings every rank's executor must share (peer memory's), compared with the rest
        self.agreed = dict(agreed or {})
        self.entry = tuning_file.entry(self.tuning, transport)
        self.model = model or transport
        self.params = tuning_file.load_params(transport, self.tuning, self.model)
        # Across hosts: the two-level model prices every candidate, flat or hierarchical, with
        # the links between hosts (the tuning file's "inter", else the transport's assumed
        # ones); the hierarchical names auto may choose, per collective
        self.inter, self.hierarchical = None, {}
        if self.topology is not None and _multi_host(self.topology):
            self.inter = tuning_file.load_inter_params(transport, self.tuning)
            self.hierarchical = {c: tuple(qualify(n, self.topology) for n in
                                          hierarchical_names(c, HIERARCHICAL_PAIRS))
                                 for c in HIERARCHICAL if c not in self.overrides}
        self._measured: dict[str, list] = {}     # collective -> measured points (lazily)
        self._rows: dict[tuple[str, int], Decision] = {}
        # the schedules registered with auto=True that auto may choose here (collective ->
        # names): every rank must have opted in the same ones
        self.opted_in = {c: names for c in COLLECTIVES if c not in self.overrides
                         and (names := tuple(n for n in auto_names(c) if is_opted_in(c, n)))}
        # What decides the schedules (the knobs are rank-local: the ends of a message need not
        # window or segment alike, and a transport may segment by what each rank sees)
        sources = {"size": size, "transport": transport, "model": self.model,
                   "overrides": sorted(self.overrides.items()), "params": repr(self.params),
                   "entry": self.entry, "agreed": sorted(self.agreed.items()),
                   "opted_in": sorted(self.opted_in.items()),
                   "topology": None if self.topology is None else self.topology.spec,
                   "inter": repr(self.inter)}
        blob = json.dumps(sources, sort_keys=True, default=repr).encode()
        self.digest = hashlib.sha256(blob).digest()[:DIGEST_BYTES]
        tuning_file.validate(self.entry, self.tuning)   # malformed: an error now, every rank
        for collective in self.opted_in:            # wrong: an error now, on every rank
            self._proven(lambda: auto_candidates(collective, size), rank)

    @classmethod
    def for_group(cls, size: int, transport, executor=None, *, window: int = 1,
                  topology=None) -> "DecisionTable":
        """The table of a group of ``size`` ranks over ``transport``, from the settings;
        ``executor`` (the group's, ``executors.Executor``) says which cost model ranks its
        schedules and what settings its ranks must share (None: the transport's model,
        nothing shared); ``topology`` (the group's hosts, or None) qualifies hierarchical
        names of ``COLLECTIVES_ALGORITHM`` and brings the two-level model in."""
        native = transport.native is not None
        rank = getattr(transport, "rank", None)
        overrides = cls._proven(lambda: parse_overrides(settings.ALGORITHM(), native,
                                                        topology), rank)
        # the host executors cut messages as the transport says (socket: segment_bytes; none:
        # whole messages); device executors decide for themselves (nccl: per collective)
        xp = transport.xp
        segment = (getattr(transport, "segment_bytes", None) or 0) \
            if xp is None or xp.__name__ == "numpy" else None
        return cls(size, transport.name, tuning=settings.TUNING(),
                   overrides=overrides, window=window,
                   segment=segment, native_available=native,
                   agreed=None if executor is None else executor.agreed,
                   model=None if executor is None else executor.model_name,
                   rank=rank, topology=topology)

    @staticmethod
    def _proven(prove, rank=None):
        """``prove()``, its ValueError naming the rank where the table knows it."""
        try:
            return prove()
        except ValueError as exc:
            if rank is None:
                raise
            raise ValueError(f"ProcessGroup on rank {rank}: {exc}") from None

    def _candidates(self, collective: str, cls: int) -> tuple[str, ...]:
        """What the model chooses among: the package's schedules and those opted in when the
        table was made (the ones its digest covers; proven then), each of the latter also
        proven at the class's size (where it is small enough to simulate:
        ``PROVE_MAX_ELEMENTS``)."""
        opted = [n for n in self.opted_in.get(collective, ()) if is_opted_in(collective, n)]
        for name in opted:
            prove_opted_in(collective, name, self.size)     # again only if registered anew
            self._prove_at(collective, name, cls)
        return tuple(sorted([n for n in auto_names(collective)
                             if is_package_schedule(collective, n)] + opted))

    def _prove_at(self, collective: str, name: str, cls: int) -> None:
        if not is_opted_in(collective, name):
            return
        nbytes = class_bytes(cls)
        if collective != "barrier" and -(-nbytes // 4) * self.size > PROVE_MAX_ELEMENTS:
            return
        prove_opted_in(collective, name, self.size,
                       cost.uniform_counts(collective, self.size, nbytes))

    @property
    def hash(self) -> str:
        return self.digest.hex()

    def label(self) -> str:
        """What the sources were, for messages (the tuning file and the override)."""
        text = f"{settings.TUNING.name}={self.tuning or '(unset)'}"
        if self.topology is not None:
            text += f", topology {self.topology.spec}"
        if self.overrides:
            text += f", {settings.ALGORITHM.name}=" + ",".join(
                f"{c}={a}" for c, a in sorted(self.overrides.items()))
        for name, value in sorted(self.agreed.items()):
            text += f", {name}={value}"
        if self.opted_in:
            text += ", auto=True: " + ",".join(f"{c}={n}" for c, names in
                                                sorted(self.opted_in.items()) for n in names)
        return text

    # -- look-up ---------------------------------------------------------------------------

    def algorithm(self, collective: str, nbytes: int) -> str:
        """``auto``'s schedule for a call of ``nbytes`` bytes: one dictionary look-up once
        the row exists."""
        cls = size_class(nbytes)
        row = self._rows.get((collective, cls))
        if row is None:
            row = self.decision(collective, cls)
        return row.algorithm

    def lookup(self, collective: str, nbytes: int) -> Decision:
        return self.decision(collective, size_class(nbytes))

    def decision(self, collective: str, cls: int) -> Decision:
        key = (collective, cls)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self._decide(collective, cls)
            if row.by == "model" and settings.DEBUG() != "OFF":
                from . import debug
                debug.logger("collectives").info(
                    f"decision table ({self.transport}, {self.size} ranks, {self.hash[:8]}): "
                    f"{collective} {class_label(cls)} -> {row.algorithm} ({row.note})")
        return row

    def _knobs(self, name: str, by: str, note: str) -> Decision:
        return Decision(name, by, self.window, self.segment, note)

    def _decide(self, collective: str, cls: int) -> Decision:
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
        if collective in self.overrides:
            return self._knobs(self.overrides[collective], "override",
                               settings.ALGORITHM.name)
        points = self._points(collective)
        if points:
            classes = [size_class(nbytes) for nbytes, _, _ in points]
            if classes[0] <= cls <= classes[-1]:
                # the nearer measured class; the smaller on a tie
                i = min(range(len(points)), key=lambda k: (abs(classes[k] - cls), classes[k]))
                nbytes, name, row = points[i]
                note = f"measured at {format_bytes(nbytes)}"
                if row.get("by") == "model":
                    note += " (within the noise: the model's pick)"
                elif row.get("by") == "rounds":
                    note += " (within the noise of a median, faster round by round)"
                elif row.get("by") == "neighbour":
                    note += (f" (within the noise: the winner at "
                             f"{format_bytes(row.get('neighbour_bytes', 0))})")
                self._prove_at(collective, name, cls)
                return self._knobs(name, "measured", note)
        return self._model(collective, cls)

    def _model(self, collective: str, cls: int) -> Decision:
        candidates = self._candidates(collective, cls)
        if not candidates:
            raise ValueError(f"{collective} has no algorithm registered")
        if self.inter is None:
            ranked = cost.ranking(collective, self.size, class_bytes(cls), self.params,
                                  candidates)
        else:
            ranked = two_level_ranking(collective, self.topology, class_bytes(cls),
                                       self.params, self.inter,
                                       candidates + self.hierarchical.get(collective, ()))
        (best_time, best), rest = ranked[0], ranked[1:]
        note = f"predicted {cost.format_seconds(best_time)}"
        if rest:
            note += f"; runner-up {rest[0][1]} {cost.format_seconds(rest[0][0])}"
        return self._knobs(best, "model", note)

    def _points(self, collective: str) -> list:
        points = self._measured.get(collective)
        if points is None:
            points = self._measured[collective] = measured_points(
                self.entry, collective, self.size, self.params, self.tuning) \
                if self.entry else []
        return points

    # -- printing --------------------------------------------------------------------------

    def rows(self, collectives=None, classes=None, *, computed_only: bool = False):
        """[(collective, first class, last class, Decision)], runs of equal rows merged.
        ``computed_only``: the model rows not yet worked out are left out (cheap)."""
        out = []
        for collective in collectives or COLLECTIVES:
            span = [0] if collective == "barrier" else list(classes or range(LAST_CLASS + 1))
            run = None
            for cls in span:
                if computed_only and (collective, cls) not in self._rows and \
                        collective not in self.overrides and not self._covered(collective, cls):
                    run = None
                    continue
                row = self.decision(collective, cls)
                if run and run[3].algorithm == row.algorithm and run[3].by == row.by \
                        and run[2] == cls - 1:
                    run[2] = cls
                else:
                    run = [collective, cls, cls, row]
                    out.append(run)
        return [tuple(r) for r in out]

    def _covered(self, collective, cls) -> bool:
        points = self._points(collective)
        return bool(points) and size_class(points[0][0]) <= cls <= size_class(points[-1][0])

    def format(self, collectives=None, classes=None, *, computed_only: bool = False) -> str:
        head = (f"decision table: {self.size} rank{'s' if self.size != 1 else ''} over "
                f"{self.transport or '(any)'}, hash {self.hash[:16]}; {self.label()}; "
                f"model: {self.params.describe()}")
        lines = [head, f"  {'collective':15s} {'bytes':13s} {'algorithm':19s} {'by':9s} "
                       f"{'window':>6s} {'segment':>8s}  why"]
        for collective, first, last, row in self.rows(collectives, classes,
                                                      computed_only=computed_only):
            segment = "executor" if row.segment is None else \
                format_bytes(row.segment) if row.segment else "whole"
            lines.append(f"  {collective:15s} {class_label(first, last):13s} "
                         f"{row.algorithm:19s} {row.by:9s} {row.window:>6d} {segment:>8s}  "
                         f"{row.note}")
        if computed_only:
            lines.append("  (other sizes: the model, worked out and logged at first use)")
        return "\n".join(lines)

    # -- every rank agrees -------------------------------------------------------------------

    def agreement_record(self) -> bytes:
        label = self.label().encode()[:LABEL_BYTES]
        return self.digest + label.ljust(LABEL_BYTES, b"\0")


def disagreement(records, rank: int, operation: str = "ProcessGroup") -> str | None:
    """None when every rank's agreement record carries the same digest; else the message that
    names the groups of ranks and their sources."""
    groups: dict[bytes, list[int]] = {}
    labels = {}
    for r, record in enumerate(records):
        digest = bytes(record[:DIGEST_BYTES])
        groups.setdefault(digest, []).append(r)
        labels.setdefault(digest, bytes(record[DIGEST_BYTES:]).rstrip(b"\0").decode(
            errors="replace"))
    if len(groups) == 1:
        return None
    parts = [f"ranks {members} have table {digest.hex()[:8]} ({labels[digest]})"
             for digest, members in groups.items()]
    return (f"{operation} on rank {rank}: the ranks' decision tables differ, so auto would "
            f"pick different schedules for one call and deadlock: " + "; ".join(parts)
            + f". Give every rank the same {settings.TUNING.name} file (same content), "
            f"the same {settings.ALGORITHM.name} and the same peer-memory settings "
            f"({settings.PEER_EAGER_BYTES.name} and the others named above)")


# ---------------------------------------------------------------------------------------------
# Showing (python -m collectives tune show); the fitting that writes the file is bench/fit.py's


def show(path: str) -> str:
    """A tuning file as tables: each transport's parameters, then per collective and world
    size the winner at each measured size, how it was found, and the medians behind it."""
    data = tuning_file.read(path)
    lines = [f"tuning file {path}"]
    for transport in sorted(data):
        entry = tuning_file.entry(path, transport)
        params = tuning_file.load_params(transport, path)
        lines.append(f"{transport}: {params.describe()}")
        shapes = set()
        for key in (DECISIONS, RATIOS_KEY):
            for collective, sizes in (entry.get(key) or {}).items():
                if isinstance(sizes, dict):
                    shapes.update((collective, int(p)) for p in sizes if str(p).isdigit())
        if not shapes:
            lines.append("  (no measured decisions: the model decides every size)")
            continue
        lines.append(f"  {'collective':15s} {'ranks':>5s} {'bytes':>7s} {'algorithm':19s} "
                     f"{'by':9s} {'margin':>7s} {'needed':>6s}  medians (us)")
        for collective, p in sorted(shapes, key=lambda s: (COLLECTIVES.index(s[0])
                                                           if s[0] in COLLECTIVES else 99, s[1])):
            for nbytes, name, row in measured_points(entry, collective, p, params, path):
                medians = row.get("median_us", {})
                others = sorted(t for n, t in medians.items() if n != name)
                margin = f"{others[0] / medians[name]:.2f}x" if others and medians.get(name) \
                    else "-"
                needed = row.get("threshold", row.get("noise"))    # rows without thresholds
                noise = f"{needed:.2f}" if isinstance(needed, (int, float)) else "-"
                cells = ", ".join(f"{n} {t:.1f}" for n, t in sorted(medians.items(),
                                                                   key=lambda i: i[1]))
                lines.append(f"  {collective:15s} {p:5d} {format_bytes(nbytes):>7s} "
                             f"{name:19s} {row.get('by', 'measured'):9s} {margin:>7s} "
                             f"{noise:>6s}  {cells}")
    return "\n".join(lines)
