"""The peer-memory protocol, stated once: the instruction set of a push program, each
instruction's columns, the flag words every rank keeps, the error kinds a kernel reports,
and the words of the special kernels' small programs. ``docs/peer-memory.md`` explains it.

Everything that speaks the protocol names it from here: the lowering that writes programs
(``algorithms/pushed.py``), the pushed-form simulator that runs them on the CPU
(``algorithms/pushed_sim.py``), the executor and the transport that launch the kernels and
read their errors, and the CUDA kernel itself, whose header ``header()`` generates from
these definitions (``cuda_peer.py`` prepends it), so the kernel holds no bare instruction
number, column or flag offset.

Names in C: an instruction kind ``OP_<KIND>``; column 0 and 1 of every row ``COL_KIND``,
``COL_STEP``; a column ``COL_<KIND>_<COLUMN>``, and ``COL_<GROUP>_<COLUMN>`` for a column
that several kinds keep at one place (``GROUPS``: the kernel runs them on one path); flag
words and buffers by their Python names; an error kind ``ERROR_<NAME>``, the error words
``ERROR_<WORD>_WORD``; the special kernels' words ``<KERNEL>_AT_<WORD>``, their kinds or
modes ``<KERNEL>_<NAME>``.

This module lies below ``algorithms/`` (kernels/): pure data and arithmetic, no I/O.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple


class Column(NamedTuple):
    name: str
    doc: str
    default: int | None = None   # None: a row must give it
    width: int = 1               # columns it spans (a sequence of values when more than one)


class Instruction(int):
    """An instruction kind: its number (an ``int``: what column 0 of a row holds) with its
    name, its columns (0 the kind, 1 the plan step, then its own) and, as attributes, each
    column's position: ``PUSH.count`` is 7, so ``row[PUSH.count]`` is a PUSH's count."""

    def __new__(cls, number: int, name: str, doc: str, *columns: Column):
        self = super().__new__(cls, number)
        self.name, self.doc = name, doc
        self.columns = (Column("kind", "the instruction kind"),
                        Column("step", "the plan step, for error messages (-1: before the "
                                       "first or after the last)")) + columns
        at = 0
        for column in self.columns:
            if hasattr(int, column.name) or column.name in ("name", "doc", "columns", "width",
                                                             "row"):
                raise ValueError(f"{name}: a column may not be called {column.name!r}")
            setattr(self, column.name, at)
            at += column.width
        self.width = at
        return self

    def __repr__(self):
        return self.name

    def __reduce__(self):          # pickled by name: the one definition of each kind
        return _instruction, (self.name,)

    def row(self, step: int, **values) -> tuple:
        """A row of this kind: ``values`` by column name (a column of several a sequence of
        at most its width), those with a default left out if so; a row ends at its last
        column (the program's table pads it with zeros)."""
        out = [self, step]
        for column in self.columns[2:]:
            value = values.pop(column.name, column.default)
            if value is None:
                raise TypeError(f"{self.name} row: no {column.name}")
            if column.width > 1:
                if len(value) > column.width:
                    raise ValueError(f"{self.name} row: {len(value)} {column.name}s, at most "
                                     f"{column.width}")
                out.extend(value)
            else:
                out.append(value)
        if values:
            raise TypeError(f"{self.name} row: no column {', '.join(sorted(values))}")
        return tuple(out)

    def read(self, row) -> SimpleNamespace:
        """The columns of ``row`` (one of this kind) by name, as ints (a column of several: a
        list): ``PUSH.read(row).count``."""
        out = {}
        for column in self.columns:
            at = getattr(self, column.name)
            out[column.name] = int(row[at]) if column.width == 1 else \
                [int(x) for x in row[at:at + column.width]]
        return SimpleNamespace(**out)


def _columns(spec: str, **docs) -> tuple:
    return tuple(Column(name, docs[name]) for name in spec.split())


KIND, STEP = 0, 1     # every row's first two columns: its kind and its plan step


# Buffers a row names (what the executor passes): the caller's input, the plan's output (the
# caller's or the staging copy), the staging scratch, and the caller's output (copy-out
# target); and, as a REDUCE_N operand only, this call's half of the rank's eager inbox.
INPUT, OUTPUT, SCRATCH, CALLER_OUTPUT, INBOX = 0, 1, 2, 3, 4
BUFFER_NAMES = ("INPUT", "OUTPUT", "SCRATCH", "CALLER_OUTPUT", "INBOX")
BUFFERS = len(BUFFER_NAMES)
BUFFER_BITS = 3      # a REDUCE_N operand is offset << BUFFER_BITS | buffer
LINE_PEER_BITS = 16  # a REDUCE_N operand in lines is -1 - (slot << LINE_PEER_BITS | peer)
FOLD = 7             # operands one REDUCE_N reads
SENDS_ON = 1 << 8    # beside a REDUCE_N's operand count: the sends after it send its result on
SENDS_ON_MAX = 64    # ... at most this many (one batch)
SLOT_ALIGN = 16      # elements: inbox slots start 16-byte aligned whatever the dtype
STEP_BITS = 24       # an epoch is (call + 1) << STEP_BITS | step
LINE_PERIOD = 1 << 31  # flagged lines carry the call number modulo this, plus one

_BUFFER = "INPUT, OUTPUT, SCRATCH or CALLER_OUTPUT"
_PLACES = dict(
    peer="the peer (rank) it sends to or receives from",
    src_buffer=f"the source's buffer ({_BUFFER})", src_offset="the source's offset",
    dst_buffer=f"the destination's buffer ({_BUFFER})", dst_offset="the destination's offset",
    count="elements", message="its number among this call's messages between the pair",
    slot="its slot in the receiver's inbox (of lines, for the kinds in lines)")

BARRIER = Instruction(
    0, "BARRIER", "every worker of this rank has finished everything before it (grid), or "
    "the threads of each worker have (its own share)",
    Column("grid", "1: a grid barrier (every worker); 0: a block barrier (one worker's "
                   "threads)"))
EPOCH = Instruction(
    1, "EPOCH", "publish this rank's epoch ((call + 1) << STEP_BITS | step) into every rank's "
    "SEEN word for it, after where its output lies this call (PLACE)",
    Column("published", "the step the epoch publishes"),
    Column("first", "1: the call's first, before anything: a plain store", 0),
    Column("direct", "1: this rank takes eager messages straight into its symmetric output "
                     "this call: its DIRECT word first, then the epoch (a release), and every "
                     "worker says so before its first send", 0))
PUSH = Instruction(
    2, "PUSH", "rendezvous send: wait for the receiver's epoch of the receive's step, write "
    "this worker's share into the receiver's region, store the message's number in its "
    "DELIVERED word",
    *_columns("peer src_buffer src_offset", **_PLACES),
    Column("dst_buffer", "the receiver's buffer: OUTPUT (where its epochs say: its staging "
                         "memory or its symmetric output) or SCRATCH"),
    Column("dst_offset", "the offset in the receiver's buffer"),
    Column("count", _PLACES["count"]),
    Column("their_step", "the receiver's step to wait for (its epoch)"),
    Column("message", _PLACES["message"]))
ARRIVE = Instruction(
    3, "ARRIVE", "rendezvous receive: wait until the sender's worker of the same share has "
    "delivered it",
    *_columns("peer message", **_PLACES))
COPY = Instruction(
    4, "COPY", "a local copy",
    *_columns("dst_buffer dst_offset src_buffer src_offset count", **_PLACES))
REDUCE = Instruction(
    5, "REDUCE", "a local reduction: dst = a op b",
    *_columns("dst_buffer dst_offset", **_PLACES),
    Column("a_buffer", "the first operand's buffer"), Column("a_offset", "its offset"),
    Column("b_buffer", "the second operand's buffer"), Column("b_offset", "its offset"),
    Column("count", _PLACES["count"]))
SEND = Instruction(
    6, "SEND", "eager send: wait until the receiver has started the previous call (its inbox "
    "half is free), write into its inbox slot, store the message's number in its DELIVERED "
    "word",
    *_columns("peer src_buffer src_offset slot count message", **_PLACES),
    Column("output_at", "where in the receiver's output the message lands (-1: not output): "
                        "there, not in the slot, where the receiver takes messages directly "
                        "this call (its DIRECT word)"))
TAKE = Instruction(
    7, "TAKE", "eager receive: wait as ARRIVE, then copy this worker's share out of the slot",
    *_columns("peer message dst_buffer dst_offset slot count", **_PLACES),
    Column("direct", "1: the sender wrote it into this rank's output directly: only wait", 0))
SEND_LL = Instruction(
    8, "SEND_LL", "eager send in flagged lines (4 data bytes and the call's line flag in each "
    "8-byte line) into the receiver's inbox of lines: no DELIVERED word, no fence",
    *_columns("peer src_buffer src_offset slot count message", **_PLACES))
TAKE_LL = Instruction(
    9, "TAKE_LL", "receive in lines: each line polled by the thread that copies it",
    *_columns("peer message dst_buffer dst_offset slot count", **_PLACES))
_FUSED = (Column("peer", _PLACES["peer"]),
          Column("keep_buffer", "the buffer to keep the message in (-1: not kept, nothing "
                                "reads it again)"),
          Column("keep_offset", "its offset"),
          Column("slot", _PLACES["slot"]),
          Column("count", _PLACES["count"]),
          Column("dst_buffer", "the reduction's destination buffer"),
          Column("dst_offset", "its offset"),
          Column("other_buffer", "the other operand's buffer"),
          Column("other_offset", "its offset"),
          Column("first", "1: the message is the reduction's first operand"),
          Column("message", _PLACES["message"]))
REDUCE_LL = Instruction(
    10, "REDUCE_LL", "a receive in lines reduced as it is read (each line polled by the "
    "thread that reduces it)", *_FUSED)
TAKE_REDUCE = Instruction(
    11, "TAKE_REDUCE", "an eager receive reduced as it is read out of its slot, after a wait "
    "as ARRIVE's", *_FUSED)
REDUCE_N = Instruction(
    12, "REDUCE_N", "a chain of reductions in one pass: dst = ((x0 op x1) op x2) ...",
    *_columns("dst_buffer dst_offset count", **_PLACES),
    Column("operands", f"how many operands (2..FOLD), with SENDS_ON ({SENDS_ON}) where the "
                       f"sends after it (one batch) send its result on in the same pass"),
    Column("operand", "each operand: offset << BUFFER_BITS | buffer (INBOX: an eager message "
                      "of this step in its slot, after its ARRIVE), or, negative, a message in "
                      "lines: -1 - (slot << LINE_PEER_BITS | peer)", width=FOLD))

def _instruction(name: str) -> Instruction:
    return next(kind for kind in INSTRUCTIONS if kind.name == name)


INSTRUCTIONS = (BARRIER, EPOCH, PUSH, ARRIVE, COPY, REDUCE, SEND, TAKE, SEND_LL, TAKE_LL,
                REDUCE_LL, TAKE_REDUCE, REDUCE_N)
WIDTH = max(kind.width for kind in INSTRUCTIONS)     # columns of the program's table

# Columns several kinds keep at one place, so the kernel reads them on one path.
GROUPS = {"SENDS": ((PUSH, SEND, SEND_LL), ("peer", "src_buffer", "src_offset")),
          "RECEIVES": ((ARRIVE, TAKE, TAKE_LL), ("peer", "message"))}


def _check():
    """What the kernel relies on, checked when the module is imported."""
    if [int(kind) for kind in INSTRUCTIONS] != list(range(len(INSTRUCTIONS))):
        raise ImportError("peer_protocol: instruction numbers must be 0, 1, ... in order")
    if [c.name for c in REDUCE_LL.columns] != [c.name for c in TAKE_REDUCE.columns]:
        raise ImportError("peer_protocol: REDUCE_LL and TAKE_REDUCE share their columns")
    if REDUCE_N.width != WIDTH or FOLD >= SENDS_ON:
        raise ImportError("peer_protocol: REDUCE_N's operands end the row, and their count "
                          "stays below SENDS_ON")
    for group, (kinds, names) in GROUPS.items():
        for name in names:
            if len({getattr(kind, name) for kind in kinds}) != 1:
                raise ImportError(f"peer_protocol: {group}: {name} at different columns")


_check()


def group_column(group: str, name: str) -> int:
    kinds, names = GROUPS[group]
    if name not in names:
        raise KeyError(f"{group} share no column {name!r}")
    return getattr(kinds[0], name)


# -- flag words --------------------------------------------------------------------------
# A rank's flags: 64-bit words in its flag block, readable and writable by every rank of the
# group (mapped over NVLink); offsets in words.
MAX_BLOCKS = 128      # workers (thread blocks) of a kernel: delivered words per sender
MAX_RANKS = 256
MAX_HEAPS = 16        # symmetric allocations per group
HEAP_SHIFT = 48       # a place in symmetric memory: (heap + 1) << HEAP_SHIFT | byte offset


class FlagWord(NamedTuple):
    name: str
    at: int          # offset in words
    count: int       # words (one per peer, per peer and block, ...)
    doc: str


def _flag_words():
    words, at = [], 0

    def word(name, count, doc, start=None):
        nonlocal at
        at = at if start is None else start
        words.append(FlagWord(name, at, count, doc))
        at += count

    word("EPOCH_WORD", 1, "unused: a rank publishes its epochs into its peers' SEEN_WORDS")
    word("CALL_WORD", 1, "this rank's number of calls so far (moved on by the last worker out)")
    word("BARRIER_WORD", 1, "the grid barrier's count of arrived workers")
    word("ABORT_WORD", 1, "rank + 1 of the rank that gave up (0: none); any rank raises "
                          "every rank's")
    word("GENERATION_WORD", 1, "the grid barrier's generation")
    word("EXIT_WORD", 1, "workers that have finished the call (the last one out ends it)")
    word("SENT_WORDS", MAX_RANKS, "[peer]: messages sent to the peer before this call",
         start=256)
    word("RECEIVED_WORDS", MAX_RANKS, "[peer]: messages received from the peer before this "
                                      "call")
    word("SEEN_WORDS", MAX_RANKS, "[peer]: the peer's latest epoch, written by the peer")
    word("DELIVERED_WORDS", MAX_RANKS * MAX_BLOCKS,
         "[peer][block]: the number (+ 1, counted over calls) of the latest message the peer's "
         "worker of this block delivered, written by the peer")
    word("PLACE_WORDS", MAX_RANKS, "[peer]: where the peer's output receives land this call "
                                   "(0: its staging memory; else its symmetric output, (heap "
                                   "+ 1) << HEAP_SHIFT | byte offset), written with its epochs")
    word("DIRECT_WORDS", MAX_RANKS, "[peer]: the call number + 1 of the peer's latest call "
                                    "that takes eager messages into its output directly")
    word("MODE_WORDS", MAX_RANKS, "[peer]: the call number + 1 of the peer's latest call run "
                                  "by two_shot_in_place")
    return tuple(words), at


FLAG_WORDS, _FLAG_WORD_COUNT = _flag_words()
(EPOCH_WORD, CALL_WORD, BARRIER_WORD, ABORT_WORD, GENERATION_WORD, EXIT_WORD, SENT_WORDS,
 RECEIVED_WORDS, SEEN_WORDS, DELIVERED_WORDS, PLACE_WORDS, DIRECT_WORDS,
 MODE_WORDS) = (word.at for word in FLAG_WORDS)
FLAG_BYTES = _FLAG_WORD_COUNT * 8


# -- errors -------------------------------------------------------------------------------
# The error words (in host memory mapped into the device): kind, plan step, peer, written by
# the first wait that gives up (kind first, by compare-and-swap from ERROR_NONE).
ERROR_WORDS = ("KIND", "STEP", "PEER")
ERROR_KIND_WORD, ERROR_STEP_WORD, ERROR_PEER_WORD = range(len(ERROR_WORDS))


class ErrorKind(NamedTuple):
    name: str
    number: int
    doc: str


ERROR_KINDS = (
    ErrorKind("NONE", 0, "no error"),
    ErrorKind("TIMED_OUT", 1, "a wait passed the call's deadline (peer: whom it waited for)"),
    ErrorKind("ABORTED", 2, "a peer gave up (peer: that rank); this rank stopped"),
    ErrorKind("CLOSED", 3, "the group's peer memory is closed (set by the host)"),
    ErrorKind("CALLED_OTHERWISE", 4, "a peer did not run two_shot_in_place where this rank "
                                     "did (peer: that rank)"))
(ERROR_NONE, ERROR_TIMED_OUT, ERROR_ABORTED, ERROR_CLOSED,
 ERROR_CALLED_OTHERWISE) = (kind.number for kind in ERROR_KINDS)


# -- the special kernels' words -----------------------------------------------------------
# Kernels that run one plan without a program read a few int64 words where a program's
# table would be (``code_at``).
IN_PLACE_WORDS = ("COUNT",)                       # two_shot_in_place: elements
PIPELINED_WORDS = ("COUNT", "CHUNKS", "PUSHERS", "KIND")   # pipelined_reduce_scatter
# its kinds: up to ALL_REDUCE_BY_COPIES an all_reduce's gather (or none), from ALL_GATHER on
# moves without a reduction
PIPELINED_KINDS = ("REDUCE_SCATTER", "ALL_REDUCE", "ALL_REDUCE_BY_COPIES", "ALL_GATHER",
                   "ALL_TO_ALL")
(PIPELINED_REDUCE_SCATTER, PIPELINED_ALL_REDUCE, PIPELINED_ALL_REDUCE_BY_COPIES,
 PIPELINED_ALL_GATHER, PIPELINED_ALL_TO_ALL) = range(len(PIPELINED_KINDS))
# copies_around: (bytes, mode, then the mode's words): STAGE (chunks, pieces, then source and
# destination offsets of each piece and of the own block), END (message), WAIT (message,
# blocks)
COPIES_WORDS = {"BYTES": 0, "MODE": 1, "CHUNKS": 2, "PIECES": 3, "PIECE": 4, "MESSAGE": 2,
                "BLOCKS": 3}
# a piece: where it is read (in the input) and written (in the staging memory), in bytes
COPIES_PIECE = ("FROM", "TO")
COPIES_PIECE_FROM, COPIES_PIECE_TO = range(len(COPIES_PIECE))
COPIES_MODES = ("STAGE", "END", "WAIT")
COPIES_STAGE, COPIES_END, COPIES_WAIT = range(len(COPIES_MODES))

# The parameters every kernel takes, in order (one launch path on the host).
KERNEL_PARAMETERS = (
    "code_at", "n", "tallies", "in", "out", "scratch", "caller_out", "peer_data_at",
    "peer_flags_at", "scratch_at", "flags", "error", "rank", "size", "itemsize", "timeout_ns",
    "peer_inbox_at", "inbox_half", "peer_lines_at", "lines_half", "place", "peer_heaps")
PARAMETER = {name: at for at, name in enumerate(KERNEL_PARAMETERS)}


# -- encodings ----------------------------------------------------------------------------
def line_flag(call: int, period: int = LINE_PERIOD) -> int:
    """The flag the lines of call number ``call`` carry: 1 .. ``period``, never 0."""
    return call % period + 1


def scrubs(call: int, period: int = LINE_PERIOD):
    """The half of its line inbox a rank zeroes at the start of call ``call`` (before its
    first epoch of the call, so before any sender may write that half again), or None.

    Half h serves the calls of parity h. The last two calls of each period zero the half of
    the call after them: odd at ``period - 2``, even at ``period - 1`` (the previous call,
    which last used that half, is complete). Between two zeroings a half then sees each flag
    at most once (``period`` is even: its calls' flags are distinct), so no line left by an
    earlier call passes for a later call's."""
    if call % period >= period - 2:
        return (call + 1) & 1
    return None


def epoch(call: int, step: int) -> int:
    """The epoch a rank publishes at ``step`` of call number ``call``: never 0."""
    return (call + 1) << STEP_BITS | step


def in_place_epoch(call: int) -> int:
    """The epoch of a call run by a special kernel: below every epoch of that call's programs
    (a rendezvous send of a peer that runs the program is never let into this rank's buffer),
    above every epoch of the call before (no plan has this many steps)."""
    return ((call + 1) << STEP_BITS) - 1


def buffer_operand(buffer: int, offset: int) -> int:
    """A REDUCE_N operand in plain memory (``buffer`` INBOX: this call's eager inbox half)."""
    return offset << BUFFER_BITS | buffer


def line_operand(slot: int, peer: int) -> int:
    """A REDUCE_N operand that is a message in lines: its slot in this rank's inbox of lines
    and the peer it comes from (named when it never arrives), negative."""
    return -1 - ((slot << LINE_PEER_BITS) | peer)


def decode_operand(value: int) -> tuple[int, int]:
    """(buffer, offset) of a REDUCE_N operand >= 0."""
    return value & ((1 << BUFFER_BITS) - 1), value >> BUFFER_BITS


def decode_line_operand(value: int) -> tuple[int, int]:
    """(slot, peer) of a negative REDUCE_N operand."""
    value = -1 - value
    return value >> LINE_PEER_BITS, value & ((1 << LINE_PEER_BITS) - 1)


def chain_operands(row) -> list[int]:
    """The operand columns of a REDUCE_N row (its operand count column holds SENDS_ON too)."""
    m = int(row[REDUCE_N.operands]) & (SENDS_ON - 1)
    return [int(x) for x in row[REDUCE_N.operand:REDUCE_N.operand + m]]


# -- the kernel's header ------------------------------------------------------------------
def c_column(kind: Instruction, name: str) -> str:
    return f"COL_{kind.name}_{name.upper()}"


def definitions() -> dict:
    """Every name the kernel's header defines, with its value, in order."""
    out = {"COL_KIND": KIND, "COL_STEP": STEP}
    for kind in INSTRUCTIONS:
        out[f"OP_{kind.name}"] = int(kind)
    for kind in INSTRUCTIONS:
        for column in kind.columns[2:]:
            out[c_column(kind, column.name)] = getattr(kind, column.name)
    for group, (_, names) in GROUPS.items():
        for name in names:
            out[f"COL_{group}_{name.upper()}"] = group_column(group, name)
    out["WIDTH"] = WIDTH
    out["FOLD"] = FOLD
    for number, name in enumerate(BUFFER_NAMES):
        out[name] = number
    out["BUFFERS"] = BUFFERS
    out.update(BUFFER_BITS=BUFFER_BITS, LINE_PEER_BITS=LINE_PEER_BITS, SENDS_ON=SENDS_ON,
               MAX_BATCH=SENDS_ON_MAX, STEP_BITS=STEP_BITS, LINE_PERIOD=f"{LINE_PERIOD}ULL")
    for word in FLAG_WORDS:
        out[word.name] = word.at
    out.update(MAX_BLOCKS=MAX_BLOCKS, MAX_RANKS=MAX_RANKS, HEAP_SHIFT=HEAP_SHIFT)
    for name, at in zip(ERROR_WORDS, range(len(ERROR_WORDS))):
        out[f"ERROR_{name}_WORD"] = at
    for kind in ERROR_KINDS:
        out[f"ERROR_{kind.name}"] = kind.number
    for at, name in enumerate(IN_PLACE_WORDS):
        out[f"IN_PLACE_AT_{name}"] = at
    for at, name in enumerate(PIPELINED_WORDS):
        out[f"PIPELINED_AT_{name}"] = at
    for number, name in enumerate(PIPELINED_KINDS):
        out[f"PIPELINED_{name}"] = number
    for name, at in COPIES_WORDS.items():
        out[f"COPIES_AT_{name}"] = at
    for at, name in enumerate(COPIES_PIECE):
        out[f"COPIES_PIECE_{name}"] = at
    out["COPIES_PIECE_SIZE"] = len(COPIES_PIECE)
    for number, name in enumerate(COPIES_MODES):
        out[f"COPIES_{name}"] = number
    return out


def header() -> str:
    """The C declarations of the protocol, ``#define NAME value`` a line, for the kernel."""
    lines = ["/* The peer-memory protocol (generated from collectives/kernels/peer_protocol.py;"
             " docs/peer-memory.md) */"]
    lines += [f"#define {name} {value}" for name, value in definitions().items()]
    return "\n".join(lines) + "\n"


# -- the documentation's tables -----------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def instruction_table() -> str:
    """The instruction set as a Markdown table (docs/peer-memory.md)."""
    def place(kind, column):
        at = getattr(kind, column.name)
        return f"{at}..{at + column.width - 1}" if column.width > 1 else str(at)

    rows = ["| # | kind | columns (from 2) | what it does |", "|---|---|---|---|"]
    for kind in INSTRUCTIONS:
        columns = ", ".join(f"[{place(kind, c)}] {c.name}" for c in kind.columns[2:])
        rows.append(f"| {int(kind)} | `{kind.name}` | {columns} | {_cell(kind.doc)} |")
    return "\n".join(rows) + "\n"


def column_table() -> str:
    """Every column of every kind, with what it holds (docs/peer-memory.md)."""
    rows = ["| kind | column | C name | holds |", "|---|---|---|---|"]
    for kind in INSTRUCTIONS:
        for column in kind.columns[2:]:
            default = "" if column.default is None else f" (default {column.default})"
            rows.append(f"| `{kind.name}` | {getattr(kind, column.name)} `{column.name}` | "
                        f"`{c_column(kind, column.name)}` | {_cell(column.doc)}{default} |")
    return "\n".join(rows) + "\n"


def flag_table() -> str:
    """The flag words (docs/peer-memory.md)."""
    rows = ["| word | offset | words | holds |", "|---|---|---|---|"]
    for word in FLAG_WORDS:
        rows.append(f"| `{word.name}` | {word.at} | {word.count} | {_cell(word.doc)} |")
    return "\n".join(rows) + f"\n\n{FLAG_BYTES} bytes in all per rank.\n"


def error_table() -> str:
    """The error kinds (docs/peer-memory.md)."""
    rows = ["| kind | C name | meaning |", "|---|---|---|"]
    for kind in ERROR_KINDS:
        rows.append(f"| {kind.number} | `ERROR_{kind.name}` | {_cell(kind.doc)} |")
    return "\n".join(rows) + "\n"


TABLES = {"instructions": instruction_table, "columns": column_table, "flags": flag_table,
          "errors": error_table}
