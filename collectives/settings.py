"""Every COLLECTIVES_* environment variable, declared once (NCCL's ``NCCL_PARAM`` style).

One line per setting: its name, its parser, its default, when it is read and what it does.
Nothing else in the package reads a COLLECTIVES_* variable from ``os.environ``: modules call
the setting (``settings.WINDOW()``), which parses the variable's current text (unset or empty:
the default) and remembers the last text it parsed, so a setting read on every call costs one
``os.environ.get`` and a comparison, as a bare read did. A value that does not parse is a
ValueError naming the variable and the text, never a silent default.

When a setting is read decides when a change takes effect:

- ``import``: once, when the module that uses it is imported (module-level constants);
- ``group``: when a group, transport, store or launcher is made (a running group keeps it);
- ``call``: at every use (a test's ``monkeypatch.setenv`` takes effect at the next call);
- ``build``: by setup.py when the compiled extension is built.

``python -m collectives info`` lists every setting with its value here; the table in
docs/settings.md is ``markdown_table()`` (``python -m collectives info --settings-table``), and a
test keeps the two equal.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

IMPORT, GROUP, CALL, BUILD = "import", "group", "call", "build"
WHEN = (IMPORT, GROUP, CALL, BUILD)

_environ_get = os.environ.get
# Settings read at every call are read from os.environ's own mapping of encoded names to
# encoded values (what os.environ.get consults after encoding the name, which costs far more
# than the look-up itself; os.environ keeps the mapping current on every change).
# Where this Python has no such mapping, os.environ.get.
_ENCODED = getattr(os.environ, "_data", None)
_encode = getattr(os.environ, "encodekey", None)
if not isinstance(_ENCODED, dict) or _encode is None:
    _ENCODED = None


# ---------------------------------------------------------------------------------------------
# Parsers: text -> value; a ValueError's message says what was expected (``Setting`` adds the
# variable's name and the text).


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SCALES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def flag(text: str) -> bool:
    """1/0, true/false, yes/no, on/off (any case)."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("expected 1 or 0 (true/false, yes/no, on/off)")


def byte_size(text: str) -> int:
    """A number of bytes: ``4096``, ``64K``, ``8M``, ``1G``, ``1.5GiB`` (K/M/G/T are powers of
    1024, with or without ``B``/``iB``), at least 0."""
    value = text.strip().upper()
    value = value[:-1] if value.endswith("B") else value
    value = value[:-1] if value.endswith("I") else value
    scale = _SCALES.get(value[-1:], None) if value[-1:].isalpha() else 1
    number = value[:-1] if value[-1:].isalpha() else value
    try:
        if scale is None:
            raise ValueError
        amount = float(number.strip()) * scale
    except ValueError:
        raise ValueError("expected a number of bytes (e.g. 4096, 64K, 8M, 1G)") from None
    if not amount >= 0 or amount == float("inf"):
        raise ValueError("expected a number of bytes >= 0")
    return int(amount)


def byte_size_or_auto(text: str) -> int | str:
    """``auto`` (the package decides, see the setting) or a number of bytes (``byte_size``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return byte_size(text)
    except ValueError:
        raise ValueError("expected auto or a number of bytes (e.g. 4096, 64K, 8M, 1G)") from None


def integer(minimum: int | None = None) -> Callable[[str], int]:
    """A whole number, at least ``minimum`` where one is given."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError("expected an integer") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return value
    parse.__doc__ = "an integer" + (f" >= {minimum}" if minimum is not None else "")
    return parse


def positive_number(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number > 0") from None
    if not 0 < value < float("inf"):
        raise ValueError("expected a number > 0")
    return value


def positive_integer(text: str) -> int:
    """A whole number > 0."""
    return integer(1)(text)


def choice(*options: str) -> Callable[[str], str]:
    """One of ``options`` (any case); the value is the option as declared."""
    def parse(text: str) -> str:
        for option in options:
            if text.strip().upper() == option.upper():
                return option
        raise ValueError(f"expected one of {', '.join(options)}")
    parse.__doc__ = ", ".join(options)
    return parse


def topology(text: str):
    """Ranks grouped into hosts (``collectives.algorithms.topology``): host sizes, ranks
    numbered host after host (``3,5``; ``HxN`` for H hosts of N ranks: ``64x8``, ``2x4,1``),
    or a rank -> host map (``map:0,1,0,1``)."""
    from .algorithms.topology import Topology     # parsing only: the format's one home
    return Topology.parse(text)


def text(value: str) -> str:
    """Any text (surrounding spaces dropped)."""
    return value.strip()


def verbatim(value: str) -> str:
    """Any text, exactly as given (a key)."""
    return value


# ---------------------------------------------------------------------------------------------
# The registry


@dataclass(eq=False)
class Setting:
    """One COLLECTIVES_* variable. Call it for its current value."""
    name: str
    parser: Callable[[str], Any]
    default: Any
    when: str
    doc: str
    kind: str = ""              # what the table says the value is (the parser's name if empty)
    secret: bool = False        # info shows whether it is set, never its value
    _last: tuple = field(default=(None, None), repr=False)   # (raw value read last, its value)

    def __post_init__(self):
        if self.when not in WHEN:
            raise ValueError(f"settings: {self.name}: when must be one of {WHEN}")
        if not self.kind:
            self.kind = self.parser.__name__.replace("_", " ")
        self._last = (None, self.default)
        self._key = None if _ENCODED is None else _encode(self.name)

    def __call__(self):
        # the raw (encoded) value compared with the last one read: parsed only when it changed
        raw = _environ_get(self.name) if self._key is None else _ENCODED.get(self._key)
        last = self._last
        if raw == last[0]:
            return last[1]
        value = self.parse(raw if raw is None or isinstance(raw, str) else os.fsdecode(raw))
        self._last = (raw, value)
        return value

    def parse(self, raw: str | None):
        """The value of text ``raw`` (None or blank: the default); a ValueError names the
        variable and the text."""
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.parser(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name}={raw!r}: {exc}") from None

    def raw(self) -> str | None:
        """The variable's text, None where it is unset."""
        return _environ_get(self.name)

    def is_set(self) -> bool:
        raw = _environ_get(self.name)
        return raw is not None and bool(raw.strip())


REGISTRY: dict[str, Setting] = {}


def declare(name, parser, default, when, doc, **extra) -> Setting:
    if not name.startswith("COLLECTIVES_") or name in REGISTRY:
        raise ValueError(f"settings: {name!r} is not a new COLLECTIVES_* name")
    setting = Setting(name, parser, default, when, doc, **extra)
    REGISTRY[name] = setting
    return setting


_BYTES = "bytes"
_LEVELS = ("OFF", "INFO", "DETAIL")

# -- choosing and running algorithms ---------------------------------------------------------
ALGORITHM = declare("COLLECTIVES_ALGORITHM", text, "", GROUP, "The algorithm per collective, over `auto` (`all_reduce=ring,all_gather=tree`); the call's `algorithm=` still wins", kind="collective=algorithm,...")
TOPOLOGY = declare("COLLECTIVES_TOPOLOGY", topology, None, GROUP, "Ranks grouped into hosts, for hierarchical algorithms (`hierarchical:<intra>+<inter>`, which take it as their `@<topology>`): host sizes with ranks numbered host after host (`3,5`; `64x8` = 64 hosts of 8; `2x4,1`) or a rank -> host map (`map:0,1,0,1`); it must cover the group's every rank", kind="host sizes or map:...")
TUNING = declare("COLLECTIVES_TUNING", text, "", GROUP, "Tuning file (`bench.py --calibrate/--tune`) the group's decision table reads; every rank must name the same content", kind="path")
WINDOW = declare("COLLECTIVES_WINDOW", integer(1), 1, GROUP, "Steps in flight at once on host transports (local, mpi, socket); 1 = off", kind="integer >= 1")
DEBUG = declare("COLLECTIVES_DEBUG", choice(*_LEVELS), "OFF", CALL, "OFF; INFO logs each group's decision table and each choice; DETAIL also checks, before every collective, that all ranks make the same call", kind="OFF, INFO or DETAIL")
COMPILED = declare("COLLECTIVES_COMPILED", flag, True, IMPORT, "0: never use the compiled (Cython) MPI executor, run plans in Python", kind="0 or 1")
SCRATCH_CACHE = declare("COLLECTIVES_SCRATCH_CACHE", byte_size, 256 << 20, IMPORT, "Scratch bytes the compiled executor keeps between calls (0: allocate per call)", kind=_BYTES)
# -- kernels -----------------------------------------------------------------------------------
KERNEL_THREADS = declare("COLLECTIVES_KERNEL_THREADS", integer(0), 0, CALL, "Threads of the parallel Numba reductions when their pool starts (0: one per core)", kind="integer >= 0")
KERNEL_PARALLEL_MIN_BYTES = declare("COLLECTIVES_KERNEL_PARALLEL_MIN_BYTES", byte_size, 16 << 20, IMPORT, "Operands from this size on are reduced by the thread pool, smaller ones by one thread", kind=_BYTES)
# -- socket transport --------------------------------------------------------------------------
SOCKET_HOST = declare("COLLECTIVES_SOCKET_HOST", text, "", GROUP, "Address the socket transport listens on (default: the interface that routes to the master)", kind="address")
SOCKET_SHM = declare("COLLECTIVES_SOCKET_SHM", flag, True, GROUP, "0: ranks of one host talk over TCP only, no shared-memory ring", kind="0 or 1")
SOCKET_SHM_BYTES = declare("COLLECTIVES_SOCKET_SHM_BYTES", byte_size, 8 << 20, GROUP, "Shared-memory ring per direction of a same-host pair", kind=_BYTES)
SOCKET_SHM_MIN = declare("COLLECTIVES_SOCKET_SHM_MIN", byte_size, 64 << 10, GROUP, "Payloads from this size on go through shared memory (or direct reads) to a same-host peer", kind=_BYTES)
SOCKET_CMA = declare("COLLECTIVES_SOCKET_CMA", flag, True, GROUP, "0: no direct reads of a same-host peer's memory (process_vm_readv)", kind="0 or 1")
SOCKET_CALLER_PROGRESS = declare("COLLECTIVES_SOCKET_CALLER_PROGRESS", flag, True, GROUP, "0: only the progress thread reads the sockets, never the waiting caller", kind="0 or 1")
SOCKET_SEGMENT = declare("COLLECTIVES_SOCKET_SEGMENT", byte_size, 1 << 20, IMPORT, "Segment size of messages the host executor cuts (0: never); set, it applies also where every pair shares a host", kind=_BYTES)
SOCKET_BUFFER = declare("COLLECTIVES_SOCKET_BUFFER", byte_size, 0, IMPORT, "SO_SNDBUF/SO_RCVBUF of the TCP sockets (0: the kernel's autotuning)", kind=_BYTES)
SOCKET_MAX_MESSAGE = declare("COLLECTIVES_SOCKET_MAX_MESSAGE", byte_size, 4 << 30, IMPORT, "Largest frame the socket transport accepts", kind=_BYTES)
# -- stores, launcher, security ----------------------------------------------------------------
SECRET = declare("COLLECTIVES_SECRET", verbatim, "", CALL, "Key that authenticates store and transport connections (default: the per-user secret file); `collectives.run` sets one per job", kind="text", secret=True)
USE_AGENT_STORE = declare("COLLECTIVES_USE_AGENT_STORE", flag, False, GROUP, "1: the launcher runs the store; ranks connect to it instead of starting one (set by `collectives.run`)", kind="0 or 1")
STORE_HANDSHAKE_TIMEOUT = declare("COLLECTIVES_STORE_HANDSHAKE_TIMEOUT", positive_number, 10.0, GROUP, "Seconds the store server gives one connection's whole handshake", kind="seconds > 0")
STORE_MAX_PENDING = declare("COLLECTIVES_STORE_MAX_PENDING", positive_integer, 64, GROUP, "Connections the store server holds before they authenticate", kind="integer > 0")
STORE_MAX_CLIENTS = declare("COLLECTIVES_STORE_MAX_CLIENTS", positive_integer, None, GROUP, "Connections the store server accepts (default: 4 per rank + 64)", kind="integer > 0")
# -- nccl --------------------------------------------------------------------------------------
NCCL_GRAPH = declare("COLLECTIVES_NCCL_GRAPH", flag, False, CALL, "1: a repeated call on nccl is captured as a CUDA graph and replayed", kind="0 or 1")
NCCL_SEGMENT_BYTES = declare("COLLECTIVES_NCCL_SEGMENT_BYTES", byte_size, None, CALL, "Segment size of every nccl plan (0: whole messages; default: 64 MiB for collectives that reduce, else whole)", kind=_BYTES)
GPU_PATH = declare("COLLECTIVES_GPU_PATH", choice("auto", "peer", "nccl"), "auto", GROUP, "How nccl groups run plans: auto = peer memory where every GPU of the group is on one host with peer access, else NCCL send/recv; peer = peer memory or an error; nccl = NCCL send/recv always", kind="auto, peer or nccl")
PEER_EAGER_BYTES = declare("COLLECTIVES_PEER_EAGER_BYTES", byte_size, 4 << 20, GROUP, "Peer-memory messages up to this size go eagerly (into the receiver's inbox, one hop) instead of waiting for the receive (0: never)", kind=_BYTES)
PEER_BLOCK_BYTES = declare("COLLECTIVES_PEER_BLOCK_BYTES", byte_size, 4 << 10, GROUP, "The peer-memory kernel runs one thread block per this many bytes one rank sends in one step (the busiest; up to COLLECTIVES_PEER_BLOCKS)", kind=_BYTES)
PEER_FENCES = declare("COLLECTIVES_PEER_FENCES", choice("0", "1", "2"), "0", GROUP, "How the peer-memory kernel orders its flag words: 0 acquire/release at system scope, 1 relaxed with acq_rel fences, 2 volatile with __threadfence_system", kind="0, 1 or 2")
PEER_LINE_BYTES = declare("COLLECTIVES_PEER_LINE_BYTES", byte_size, 256 << 10, GROUP, "Eager peer-memory messages up to this size travel in flagged lines (4 data bytes + a flag in 8; no fences, twice the bytes)", kind=_BYTES)
PEER_BLOCKS = declare("COLLECTIVES_PEER_BLOCKS", integer(1), 128, GROUP, "Most thread blocks the peer-memory kernel runs a plan on (one per COLLECTIVES_PEER_BLOCK_BYTES that one rank sends in one step)", kind="integer >= 1")
PEER_MAX_BYTES = declare("COLLECTIVES_PEER_MAX_BYTES", byte_size, 32 << 20, GROUP, "Calls whose largest message is bigger go over NCCL send/recv instead of peer memory where some rank's plan stages its output through the staging memory (as it does without symmetric memory); plans that stage nothing stay on peer memory: reduce_scatter, and what runs pipelined (COLLECTIVES_PEER_PIPELINE_BYTES: two_shot all_reduce, direct all_gather and all_to_all of alike blocks); decided alike on every rank as if every output were staged, so set 0 (no limit) where every rank's large outputs of other plans (ring, recursive doubling, uneven blocks) are symmetric or registered: the program's pushes then write them directly, because on large messages a staged output falls behind NCCL send/recv (BENCHMARKS.md §6)", kind=_BYTES)
PEER_DIRECT = declare("COLLECTIVES_PEER_DIRECT", flag, True, GROUP, "0: eager peer-memory messages always land in the receiver's inbox and are copied out; 1: after a call's first step they land straight in a receiver's symmetric output where nothing of the call touches it first (it saves the copy out; a schedule whose senders must then wait for the receiver to start the call, such as the ring, can lose a little on small calls); every rank alike", kind="0 or 1")
PEER_IN_PLACE_BYTES = declare("COLLECTIVES_PEER_IN_PLACE_BYTES", byte_size_or_auto, "auto", GROUP, "A two_shot all_reduce of up to this many bytes called in place on a buffer in the group's symmetric memory (or a registered one) on every rank runs as one pass: each rank reads its block on every peer, reduces it and writes it back there, instead of the program's two steps of pushes; auto: 64M on 2 ranks, 8M on more, the sizes up to which reads in place beat the pushes (BENCHMARKS.md §6); 0: never; every rank alike (a rank whose peers called otherwise fails the call on all)", kind="bytes or auto")
PEER_PIPELINE_BYTES = declare("COLLECTIVES_PEER_PIPELINE_BYTES", byte_size, 16 << 20, GROUP, "A direct reduce_scatter, all_gather or all_to_all whose every rank's block (alike) is at least this many bytes, or a two_shot all_reduce whose count the ranks divide into blocks of at least this many, on 2 to 8 ranks, runs pipelined (pipelined_reduce_scatter): some thread blocks push chunk after chunk of every peer's block while the others reduce (or copy out) each chunk as soon as it is there, where the program reduces or copies out after all its pushes; in an all_reduce every thread block then reads every peer's reduced chunks straight into the caller's output; an all_gather's or all_to_all's peers push straight into a symmetric output, into slots otherwise (overlapping the pushes with the reductions and copies is what brings large calls level with NCCL: BENCHMARKS.md §6); nothing is staged on the way out, so such calls stay on peer memory above COLLECTIVES_PEER_MAX_BYTES; 0: never; every rank alike", kind=_BYTES)
PEER_COPY_CHUNK_BYTES = declare("COLLECTIVES_PEER_COPY_CHUNK_BYTES", byte_size, 128 << 20, GROUP, "A call by the copy engines (COLLECTIVES_PEER_COPY_ENGINE_BYTES) stages each rank's input in chunks of at least this many bytes (at most 64), the copies of each peer's chunk waiting only for that chunk: smaller chunks start the copies sooner, but the staging beside them slows them, more than the earlier start gains on large calls (BENCHMARKS.md §6); every rank alike", kind=_BYTES)
PEER_COPY_ENGINE_BYTES = declare("COLLECTIVES_PEER_COPY_ENGINE_BYTES", byte_size_or_auto, "auto", GROUP, "A two_shot all_reduce run pipelined (COLLECTIVES_PEER_PIPELINE_BYTES), or a direct all_gather or all_to_all, whose every block is at least this many bytes moves the peers' blocks (reduced, or inputs staged chunk by chunk) with the GPU's copy engines (a copy per peer between kernel launches) instead of thread blocks over NVLink; auto: where the copy engines come out ahead, all_reduce blocks from 64M on more than 2 ranks, never on 2, all_gather and all_to_all never (a value set applies to them too, where the pipelined kernel is faster: BENCHMARKS.md §6); 0: never; every rank alike", kind="bytes or auto")
PEER_OVERLAP = declare("COLLECTIVES_PEER_OVERLAP", flag, True, GROUP, "1: the compiled repeat path launches each peer-memory kernel so that it may start while the previous kernel on its stream finishes (programmatic dependent launch; it waits for that kernel before reading what it wrote); 0: after it ends", kind="0 or 1")
PEER_LANE = declare("COLLECTIVES_PEER_LANE", flag, True, GROUP, "1: a repeated peer-memory call (a shape seen before, plain arrays) is launched by the compiled repeat path (executors/_peer_lane.pyx, where it is built) instead of the Python one; 0: the Python path always", kind="0 or 1")
NCCL_P2P_CHUNKSIZE = declare("COLLECTIVES_NCCL_P2P_CHUNKSIZE", byte_size, 65536, GROUP, "NCCL_P2P_NVL_CHUNKSIZE set before the first communicator unless already set (0: NCCL's default)", kind=_BYTES)
# -- building ----------------------------------------------------------------------------------
MPI_INCLUDE = declare("COLLECTIVES_MPI_INCLUDE", text, "", BUILD, "Folder holding mpi.h for building the compiled executor (setup.py; `MPICC` or `mpicc -show` otherwise)", kind="path")


def get(name: str):
    """The current value of the setting called ``name``."""
    try:
        setting = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown setting {name!r}; known: {', '.join(REGISTRY)}") from None
    return setting()


def _show(value, kind: str = "") -> str:
    if kind.startswith(_BYTES) and isinstance(value, int) and not isinstance(value, bool) and value:
        for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if value % scale == 0:
                return f"{value // scale}{suffix}"
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "1" if value else "0"
    if value == "":
        return "(empty)"
    return str(value)


def describe() -> list[str]:
    """One line per setting for ``python -m collectives info``: name, value here (the raw
    text and, where it differs, what it means), and whether that is the default."""
    lines, width = [], max(map(len, REGISTRY))
    for name, setting in REGISTRY.items():
        raw = setting.raw()
        if setting.secret:
            shown = "(set, not shown)" if setting.is_set() else "(unset)"
        elif raw is None or not raw.strip():
            shown = f"{_show(setting.default, setting.kind)} (default)"
        else:
            try:
                value = setting.parse(raw)
            except ValueError as exc:
                shown = f"INVALID: {exc}"
            else:
                shown = raw.strip()
                shown += " (default)" if value == setting.default else \
                    f" (default {_show(setting.default, setting.kind)})"
        lines.append(f"{name:{width}s} {shown:24s} [{setting.when}] {setting.doc}")
    return lines


def _default_cell(setting: Setting) -> str:
    default = setting.default
    return "–" if default in (None, "") else f"`{_show(default, setting.kind)}`"


def markdown_table() -> str:
    """The settings table of docs/settings.md (a test keeps that page and this equal)."""
    rows = ["| variable | value | default | read | what it does |", "|---|---|---|---|---|"]
    for name, setting in REGISTRY.items():
        rows.append(f"| `{name}` | {setting.kind} | {_default_cell(setting)} | "
                    f"{setting.when} | {setting.doc} |")
    return "\n".join(rows)
