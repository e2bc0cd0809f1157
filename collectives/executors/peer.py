"""The peer-memory executor: a whole plan in one kernel launch, GPUs writing into each other's
memory over NVLink. docs/peer-memory.md explains the protocol (programs, epochs, staging,
flag words, errors, the kernels without a program); ``algorithms/pushed.py`` lowers plans to
programs, ``kernels/cuda_peer.py`` builds the kernels, ``transports/peer.py`` maps the memory.

Per call on the host: a cached look-up of the plan's entry (``_Entry``: the program lowered
and uploaded once, the kernel's parameters packed once for ``cuLaunchKernel``), a check of
the error words (host memory, no synchronization), and one kernel launch on the caller's
stream (two, with copies by the copy engines between them, where those gather). Nothing
waits on the host; like the NCCL executor, the result is ordered on the caller's stream.
Calls on different streams are kept in issue order (a call on another stream than the
previous one waits for the previous call's event), so flags and message numbers advance in
the same order on every rank.

Where it does not apply it hands the plan to the NCCL executor: a plan built by hand (the
other ranks' plans cannot be derived), a dtype or reduction the kernel does not have
(complex, longdouble), a call made while a CUDA graph is being captured that needs the
staging area to grow (growing exchanges handles, which capture forbids), and a call whose
largest message is above COLLECTIVES_PEER_MAX_BYTES where some rank's plan stages its output
(staging costs two passes over the output, which past some size cost more than NCCL
send/recv into the caller's buffer; alike on every rank). Caller buffers are never mapped
into other processes; an output in the group's symmetric memory (``symmetric_empty``) or a
registered buffer is written by peers directly.

``blocks``: the kernel's thread blocks, one per COLLECTIVES_PEER_BLOCK_BYTES of what the
busiest rank sends in one step (the step's sum: a block moves its share of every message),
up to COLLECTIVES_PEER_BLOCKS; alike on every rank, since the delivered words are per block.

Which kernel runs a plan instead of the program (``_entry``; each decided alike on every
rank, except in place, which the kernel checks): ``two_shot_in_place`` for a two_shot
all_reduce in place on symmetric memory up to COLLECTIVES_PEER_IN_PLACE_BYTES
(``IN_PLACE_AUTO``); ``copies_around`` for a direct all_gather or all_to_all of alike blocks
from COLLECTIVES_PEER_COPY_ENGINE_BYTES (off by default: ``COPY_ENGINE_AUTO``);
``pipelined_reduce_scatter`` for a direct reduce_scatter, all_gather or all_to_all or a
two_shot all_reduce of alike blocks from COLLECTIVES_PEER_PIPELINE_BYTES, an all_reduce's
gather by the copy engines from COLLECTIVES_PEER_COPY_ENGINE_BYTES (``_by_copies``).

Errors: what a kernel recorded in the error words is raised by the next call on this group
and by ``synchronize`` (``check``: CollectiveTimeout or TransportError naming the rank, step
and peer), and every later call fails (the flags of a failed call are inconsistent).
"""
from __future__ import annotations

import ctypes

import numpy as np

from .. import settings
from ..algorithms import pushed
from ..algorithms.schedule import build_plan
from ..errors import CollectiveTimeout, TransportError
from ..kernels import cuda_peer, peer_protocol
from ..kernels.peer_protocol import (COPIES_END, COPIES_STAGE, COPIES_WAIT, COPIES_WORDS,
                                     ERROR_KIND_WORD)
from . import nccl

DEFAULT_TIMEOUT = 1800.0          # seconds a device wait may last when the call gives none

# Where each kernel parameter lies among an entry's values (peer_protocol.KERNEL_PARAMETERS);
# the few a call sets, bound once
_AT = peer_protocol.PARAMETER
_IN, _OUT, _CALLER_OUT, _TIMEOUT_NS, _PLACE = (
    _AT[name] for name in ("in", "out", "caller_out", "timeout_ns", "place"))


def _launch(*args):
    """cuLaunchKernel through CuPy's driver bindings (imported on the first call)."""
    from cupy.cuda import driver
    global _launch
    _launch = driver.launchKernel
    return _launch(*args)


def launch_address() -> int:
    """The address of the driver's cuLaunchKernel (for the compiled repeat path)."""
    import ctypes
    return ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernel, ctypes.c_void_p).value


def launch_ex_address() -> int:
    """The address of the driver's cuLaunchKernelEx (programmatic dependent launch), or 0
    where the driver has none."""
    import ctypes
    try:
        return ctypes.cast(ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return 0


def max_blocks() -> int:
    return min(cuda_peer.MAX_BLOCKS, settings.PEER_BLOCKS())


class _Entry:
    """What one (plan, dtype, op) needs on every call, worked out on the first: the program
    on the device and the kernel's parameters, packed once for the driver's launch call
    (``cuLaunchKernel`` takes an array of pointers to the values); a call only rewrites the
    four buffer addresses, where CuPy's generic launch converts and packs every argument
    on every call: at small sizes that host work, not the kernel, decides a call's time."""
    __slots__ = ("program", "code", "tallies", "function", "blocks", "staging", "scratch_at",
                 "inbox", "lines", "values", "params", "pointers", "layout", "timeout",
                 "staged", "kernel", "finish", "finish_function", "rounds", "waits", "aside")

    def __init__(self, plan, dtype, op, limit, eager, lines, fences, memory, seeded,
                 symmetric=False, direct=False):
        import cupy
        program = pushed.lower(plan, eager // dtype.itemsize, lines // dtype.itemsize, seeded,
                               symmetric, direct)
        self.program = program
        self.code = cupy.asarray(program.code)
        self.tallies = cupy.asarray(np.array(program.sends + program.recvs, np.int64))
        self.function = cuda_peer.program_kernel(op, dtype, fences).kernel.ptr   # CUfunction
        self.kernel = "run_program"        # which kernel ``function`` is
        busiest = program.busiest * dtype.itemsize
        self.blocks = int(min(limit, max(1, -(-busiest // settings.PEER_BLOCK_BYTES()))))
        # staging memory, alike on every rank: output, then scratch; the inboxes apart (their
        # halves must not move between calls: a sender may write the next call's half while
        # the receiver still works in this call's staging layout)
        itemsize = dtype.itemsize
        self.scratch_at = _align(program.scratch_at * itemsize)
        # (never 0: the first call allocates both, even one that stages nothing)
        self.staging = max(256, _align(self.scratch_at + program.scratch_max * itemsize))
        self.inbox = max(256, _align(program.inbox * itemsize))
        self.lines = max(256, _align(program.line_inbox * itemsize))
        u64, i32 = ctypes.c_uint64, ctypes.c_int32
        # in the kernel's parameter order; the buffers are set per call, what comes from the
        # group's memory when it has moved (place), the deadline when the timeout changes
        self.values = [u64(self.code.data.ptr), i32(len(program.code)),
                       u64(self.tallies.data.ptr), u64(0), u64(0), u64(0), u64(0), u64(0),
                       u64(0), u64(self.scratch_at), u64(memory.flags_ptr),
                       u64(memory.error_ptr), i32(plan.rank), i32(plan.size),
                       i32(dtype.itemsize), u64(0), u64(0), u64(0), u64(0), u64(0),
                       u64(0), u64(memory.peer_heaps_array.data.ptr)]
        self.pointers = (ctypes.c_void_p * len(self.values))(
            *[ctypes.addressof(v) for v in self.values])
        self.params = ctypes.addressof(self.pointers)
        # what values hold of the memory (set by place) and of the call's timeout (None: the
        # default, in values from the start)
        self.layout = self.timeout = None
        self.values[_TIMEOUT_NS].value = int(DEFAULT_TIMEOUT * 1e9)
        self.staged = program.output_staged
        # a call whose copy engines copy (_by_copies): the kernel that ends it and its code;
        # the rounds of copies, each (the code of the wait before it or None, [(peer, where
        # in the output, where in the peer's staging memory, bytes)]) and the waits' codes;
        # whether the first launch runs beside the caller's stream (staging the input)
        self.finish = self.finish_function = self.rounds = self.waits = None
        self.aside = False

    def in_place(self, plan, dtype, op, fences):
        """Run as ``two_shot_in_place`` instead of the program: its "program" is the
        element count; the same parameters, blocks and memory otherwise."""
        import cupy
        self.code = cupy.asarray(np.array([plan.args[0]], np.int64))
        self.values[_AT["code_at"]].value = self.code.data.ptr
        self.function = cuda_peer.in_place_kernel(op, dtype, fences, plan.size).kernel.ptr
        self.kernel = "two_shot_in_place"

    def pipelined(self, plan, dtype, op, fences, copy_engine=0):
        """Run as ``pipelined_reduce_scatter`` instead of the program: its "program" is
        peer_protocol.PIPELINED_WORDS (count per rank, chunks, pushers, kind). A
        reduce_scatter (PIPELINED_REDUCE_SCATTER) takes the program's blocks, parameters and
        staging (its scratch slots, one per peer, are where the pushes land); a two_shot
        all_reduce the same slots from the staging memory's start, its reduced block after
        them, and writes the caller's output itself (nothing staged): with thread blocks
        (PIPELINED_ALL_REDUCE), or where a rank's block has at least ``copy_engine`` bytes
        (COLLECTIVES_PEER_COPY_ENGINE_BYTES; 0: never) with the copy engines, a copy per
        peer after this kernel (PIPELINED_ALL_REDUCE_BY_COPIES), then ``copies_around``'s
        end. A direct all_gather (PIPELINED_ALL_GATHER) or all_to_all (PIPELINED_ALL_TO_ALL)
        takes the slots from the staging memory's start and writes the caller's output
        itself too, peers pushing straight into it where it is symmetric (each rank's own
        choice)."""
        import cupy
        collective = plan.collective
        count = block_count(plan)
        block = count * dtype.itemsize
        chunks = int(min(PIPELINE_MAX_CHUNKS, max(1, block // PIPELINE_CHUNK_BYTES)))
        pushers = max(1, self.blocks * PIPELINE_PUSHERS // 4)
        copied = collective == "all_reduce" and copy_engine and block >= copy_engine
        kind = peer_protocol.PIPELINED_ALL_REDUCE_BY_COPIES if copied else \
            PIPELINED_KINDS[collective]
        words = {"COUNT": count, "CHUNKS": chunks, "PUSHERS": pushers, "KIND": kind}
        self.code = cupy.asarray(np.array([words[name] for name in peer_protocol.PIPELINED_WORDS],
                                          np.int64))
        self.values[_AT["code_at"]].value = self.code.data.ptr
        own_slots = collective != "reduce_scatter"     # not the program's staging layout
        if own_slots:
            self.scratch_at, self.staged = 0, False
            self.values[_AT["scratch_at"]].value = 0
        self.staging = max(256 if own_slots else self.staging, _align(
            self.scratch_at + (plan.size - 1 + (collective == "all_reduce")) * block))
        self.function = cuda_peer.pipelined_kernel(op, dtype, fences, plan.size).kernel.ptr
        self.kernel = f"pipelined_{collective}"
        if copied:      # every peer's reduced block lies after its p - 1 slots
            self._copies(plan, dtype, op, fences, [(q, q * block, (plan.size - 1) * block)
                                                   for q in _peers(plan)], block, 1,
                         2 * chunks + 1)
            self.kernel += "_copy_engines"

    def copied(self, plan, dtype, op, fences, chunk_bytes):
        """Run a direct all_gather or all_to_all with the copy engines (``copies_around``):
        the first launch, beside the caller's stream, stages this rank's input (an
        all_to_all: its block for each peer, in the slot of the peer's rank order with this
        rank skipped) into its staging memory chunk after chunk, saying each; on the
        caller's stream, for each chunk, a one-block launch waits until every peer has
        staged it, then the chunk of every peer's block for this rank is copied out of that
        peer's staging memory into the output: the copies of one chunk run beside the
        staging of the next. The first launch then copies this rank's own block from its
        input into the output with its thread blocks, leaving the copy engines to the
        peers' chunks; the last launch ends the call. Nothing staged on the way out."""
        import cupy
        rank, size, itemsize = plan.rank, plan.size, dtype.itemsize
        all_to_all = plan.collective == "all_to_all"
        block = block_count(plan) * itemsize
        chunks = copy_chunks(block, chunk_bytes)
        if all_to_all:      # the block for peer q in slot q (q < rank) or q - 1 (q > rank)
            pieces = [(q * block, (q - (q > rank)) * block) for q in range(size) if q != rank]
            at = [(q, q * block, (rank - (rank > q)) * block) for q in _peers(plan)]
            own = (rank * block, rank * block)
        else:
            pieces, at = [(0, 0)], [(q, q * block, 0) for q in _peers(plan)]
            own = (0, rank * block)
        self.function = cuda_peer.copies_kernel(op, dtype, fences, size).kernel.ptr
        self.code = cupy.asarray(np.array(copies_words(BYTES=block, MODE=COPIES_STAGE,
                                                       CHUNKS=chunks, PIECES=len(pieces)) +
                                          [o for piece in pieces + [own] for o in piece],
                                          np.int64))
        self.values[_AT["code_at"]].value = self.code.data.ptr
        self.scratch_at, self.staged, self.aside = 0, False, True
        self.values[_AT["scratch_at"]].value = 0
        self.staging = max(256, _align(len(pieces) * block))
        self._copies(plan, dtype, op, fences, at, block, chunks, chunks + 1, waits=True)
        self.kernel = f"copies_{plan.collective}"

    def _copies(self, plan, dtype, op, fences, at, block, chunks, message, waits=False):
        """The copies of every peer's ``block`` bytes, each (peer, where it goes in the
        output, where it lies in the peer's staging memory) of ``at``, in ``chunks`` rounds
        (with ``waits``, each after a one-block launch that waits until every peer has
        staged its chunk: ``copies_around``'s COPIES_WAIT), then ``copies_around``'s end
        (COPIES_END) with ``message``."""
        import cupy
        self.finish_function = cuda_peer.copies_kernel(op, dtype, fences, plan.size).kernel.ptr
        self.finish = cupy.asarray(np.array(copies_words(BYTES=0, MODE=COPIES_END,
                                                         MESSAGE=message), np.int64))
        bounds = chunk_bounds(block, chunks)
        if waits:
            self.waits = cupy.asarray(np.array([copies_words(BYTES=0, MODE=COPIES_WAIT,
                                                             MESSAGE=k + 1, BLOCKS=self.blocks)
                                                for k in range(chunks)], np.int64))
        self.rounds = [(self.waits.data.ptr + 8 * COPIES_WAIT_WORDS * k if waits else None,
                        [(q, out_at + lo, src_at + lo, hi - lo) for q, out_at, src_at in at])
                       for k, (lo, hi) in enumerate(bounds)]

    def place(self, memory):
        """Set the values that come from the group's memory (which moves when it grows)."""
        values = self.values
        values[_AT["scratch"]].value = memory.data_ptr + self.scratch_at
        values[_AT["peer_data_at"]].value = memory.peer_data_array.data.ptr
        values[_AT["peer_flags_at"]].value = memory.peer_flags_array.data.ptr
        values[_AT["peer_inbox_at"]].value = memory.peer_inbox_array.data.ptr
        values[_AT["inbox_half"]].value = memory.inbox_half
        values[_AT["peer_lines_at"]].value = memory.peer_lines_array.data.ptr
        values[_AT["lines_half"]].value = memory.lines_half
        self.layout = memory.layout


# COLLECTIVES_PEER_IN_PLACE_BYTES=auto, by world size (None: any other): up to where one
# pass of reads from every peer stays ahead of the program's pushes (BENCHMARKS.md has the
# runs). On 2 ranks each rank reads half the vector from its one peer, and they stay ahead
# up to where a 2-rank two_shot's message passes COLLECTIVES_PEER_MAX_BYTES and the call
# leaves peer memory anyway; on more ranks each reads from several peers at once and falls
# behind at smaller sizes.
IN_PLACE_AUTO = {2: 64 << 20, None: 8 << 20}
# COLLECTIVES_PEER_COPY_ENGINE_BYTES=auto, by collective and world size: from where the copy
# engines come out ahead of thread blocks' loads (BENCHMARKS.md has the runs). A pipelined
# all_reduce's gather on more than 2 ranks: from blocks large enough that what the copy
# engines gain over NVLink pays for a second launch and for a gather that no longer runs
# beside the reductions; on 2 ranks they never come out ahead. A direct all_gather or
# all_to_all: never, since its input, staged chunk by chunk beside the copies, slows them
# below the pipelined kernel.
COPY_ENGINE_AUTO = {"all_reduce": {2: 0, None: 64 << 20}, "all_gather": {None: 0},
                    "all_to_all": {None: 0}}


def by_world(setting, world: int, measured: dict) -> int:
    """A byte limit on ``world`` ranks: the setting's value, or for ``auto`` the limit
    measured for this world size (``measured``: by world size, None for any other)."""
    return measured.get(world, measured[None]) if setting == "auto" else setting


def copy_engine_limits(setting, world: int) -> dict:
    """COLLECTIVES_PEER_COPY_ENGINE_BYTES on ``world`` ranks, per collective it applies to."""
    return {collective: by_world(setting, world, measured)
            for collective, measured in COPY_ENGINE_AUTO.items()}


def in_place(plan, dtype, most: int) -> bool:
    """Whether ``plan``, called in place on symmetric memory, runs as ``two_shot_in_place``:
    a two_shot all_reduce of at most ``most`` bytes (COLLECTIVES_PEER_IN_PLACE_BYTES) on 2 to
    8 ranks, decided alike on every rank (what it looks at is alike on every rank)."""
    return plan.collective == "all_reduce" and plan.algorithm == "two_shot" and \
        2 <= plan.size <= cuda_peer.IN_PLACE_MAX_WORLD and \
        plan.args[0] * dtype.itemsize <= most


# pipelined_reduce_scatter: each rank's block cut into chunks of this many bytes (at most
# PIPELINE_MAX_CHUNKS of them); of the program's thread blocks, PIPELINE_PUSHERS quarters
# push and the rest reduce or copy out: half pushing keeps the work on arrived chunks up with
# the pushes, and beat three quarters for every collective that runs on it (BENCHMARKS.md)
PIPELINE_CHUNK_BYTES = 4 << 20
PIPELINE_MAX_CHUNKS = 64
PIPELINE_PUSHERS = 2
# the kernel's ``kind`` by collective (an all_reduce gathered by the copy engines:
# PIPELINED_ALL_REDUCE_BY_COPIES)
PIPELINED_KINDS = {"reduce_scatter": peer_protocol.PIPELINED_REDUCE_SCATTER,
                   "all_reduce": peer_protocol.PIPELINED_ALL_REDUCE,
                   "all_gather": peer_protocol.PIPELINED_ALL_GATHER,
                   "all_to_all": peer_protocol.PIPELINED_ALL_TO_ALL}
# the schedule the kernel runs, by collective
_PIPELINED_SCHEDULES = {"reduce_scatter": "direct", "all_reduce": "two_shot",
                        "all_gather": "direct", "all_to_all": "direct"}


def block_count(plan):
    """The elements of each rank's block where every rank's is alike (a direct
    reduce_scatter, all_gather or all_to_all, a two_shot all_reduce), else None."""
    args = plan.args[0]
    if plan.collective == "all_reduce":
        return args // plan.size if args % plan.size == 0 else None
    counts = [n for row in args for n in row] if plan.collective == "all_to_all" else args
    return counts[0] if len(set(counts)) == 1 else None


def pipelined(plan, dtype, least: int, blocks: int) -> bool:
    """Whether ``plan`` runs as ``pipelined_reduce_scatter``: on 2 to 8 ranks, a direct
    reduce_scatter, all_gather or all_to_all whose every rank's block has the same count,
    or a two_shot all_reduce whose count the ranks divide evenly (or a plan that is their
    schedule), the block of at least ``least`` bytes (COLLECTIVES_PEER_PIPELINE_BYTES; 0:
    never), with thread blocks to split into pushers and reducers; decided alike on every
    rank (what it looks at is alike on every rank: not the outputs)."""
    algorithm = _PIPELINED_SCHEDULES.get(plan.collective)
    if not least or algorithm is None or blocks < 2 or \
            not 2 <= plan.size <= cuda_peer.IN_PLACE_MAX_WORLD:
        return False
    count = block_count(plan)
    return count is not None and count * dtype.itemsize >= least and \
        _schedule_of(plan, algorithm)


def copied(plan, dtype, least: int) -> bool:
    """Whether ``plan`` runs with the copy engines (``_Entry.copied``): a direct all_gather
    or all_to_all on 2 to 8 ranks whose every block is alike and at least ``least`` bytes
    (COLLECTIVES_PEER_COPY_ENGINE_BYTES for the collective; 0: never); decided alike on
    every rank."""
    if not least or plan.collective not in ("all_gather", "all_to_all") or \
            not 2 <= plan.size <= cuda_peer.IN_PLACE_MAX_WORLD:
        return False
    count = block_count(plan)
    return count is not None and count * dtype.itemsize >= least and \
        _schedule_of(plan, "direct")


def copies_words(**words) -> list:
    """The leading words of a ``copies_around`` code by name (peer_protocol.COPIES_WORDS:
    BYTES, MODE, then the mode's); a word not given is 0."""
    code = [0] * (max(COPIES_WORDS[name] for name in words) + 1)
    for name, value in words.items():
        code[COPIES_WORDS[name]] = value
    return code


# the words of one COPIES_WAIT code: its rows lie this many int64 words apart
COPIES_WAIT_WORDS = len(copies_words(BYTES=0, MODE=COPIES_WAIT, MESSAGE=0, BLOCKS=0))


# The copy engines' calls staged chunk by chunk (``_Entry.copied``): blocks cut into chunks
# of at least COLLECTIVES_PEER_COPY_CHUNK_BYTES, at most this many of them (each costs a
# launch that waits, and copies of its size)
COPY_MAX_CHUNKS = 64


def copy_chunks(block: int, least: int) -> int:
    """How many chunks a block of ``block`` bytes is staged and copied in, each at least
    ``least`` bytes (alike on every rank: blocks and the setting are)."""
    return int(min(COPY_MAX_CHUNKS, max(1, block // max(1, least))))


def chunk_bounds(nbytes: int, chunks: int) -> list:
    """[(lo, hi)] in bytes of each chunk of ``nbytes``: 16-byte units shared out as
    ``copies_around`` does (its COPIES_STAGE stages exactly these)."""
    units = -(-nbytes // 16)
    return [(min(nbytes, units * k // chunks * 16), min(nbytes, units * (k + 1) // chunks * 16))
            for k in range(chunks)]


def _peers(plan) -> list:
    """Every peer of ``plan``'s rank, in the order the pushes go (the next rank first)."""
    return [(plan.rank + s) % plan.size for s in range(1, plan.size)]


def _schedule_of(plan, algorithm: str) -> bool:
    """Whether ``plan`` is ``algorithm``'s schedule on every rank (recursive doubling's
    all_reduce is two_shot's on 2 ranks): a kernel written for that schedule then runs this
    plan exactly, bitwise its result. The schedules are compared as built: the plan called
    may read input first (an all_reduce out of place), which such a kernel does itself."""
    if plan.algorithm == algorithm:
        return True
    return all(build_plan(plan.collective, plan.algorithm, r, plan.size, *plan.args).steps ==
               build_plan(plan.collective, algorithm, r, plan.size, *plan.args).steps
               for r in range(plan.size))


class _Elsewhere:
    """A call the NCCL send/recv executor runs; ``seed``: output must first be filled with
    input (the group passed input for the peer program to read instead)."""
    __slots__ = ("seed",)

    def __init__(self, seed):
        self.seed = seed


_SEEDED = frozenset(("all_reduce", "broadcast"))    # collectives whose output input seeds


def _align(nbytes, to=256):
    return -(-nbytes // to) * to


class PeerExecutor:
    """``execute`` (host.execute's signature) bound to one group's peer memory.

    ``seeds_output``: an all_reduce or broadcast called out of place may pass its input
    beside the output; the program reads input where the plan reads output it has not
    written yet (``pushed.lower(seeded=True)``), so the group makes no copy of input into
    output before the call (one kernel less per call)."""

    seeds_output = True
    # Plans here are priced as steps inside one kernel (a flag's latency), not as NCCL group
    # calls: the cost model's ``nccl_peer`` defaults (algorithms/params.py).
    model_name = "nccl_peer"

    def __init__(self, transport, memory):
        import cupy
        self.cupy = cupy
        self.transport = transport
        self.memory = memory
        self.limit = max_blocks()
        self.eager = settings.PEER_EAGER_BYTES()
        self.lines = settings.PEER_LINE_BYTES()
        self.fences = int(settings.PEER_FENCES())
        self.most = settings.PEER_MAX_BYTES()
        self.direct = settings.PEER_DIRECT()
        self.in_place = by_world(settings.PEER_IN_PLACE_BYTES(), transport.size,
                                 IN_PLACE_AUTO)
        self.pipeline = settings.PEER_PIPELINE_BYTES()
        self.copy_engine = copy_engine_limits(settings.PEER_COPY_ENGINE_BYTES(),
                                              transport.size)
        self.copy_chunk = settings.PEER_COPY_CHUNK_BYTES()
        # What every rank must share: each shapes the programs or their blocks, so a rank
        # that differs would corrupt a call or wait for words no block writes. The group
        # compares them with its decision table's sources when it is made.
        self.agreed = {s.name: s() for s in (
            settings.PEER_EAGER_BYTES, settings.PEER_LINE_BYTES, settings.PEER_DIRECT,
            settings.PEER_MAX_BYTES, settings.PEER_BLOCKS, settings.PEER_BLOCK_BYTES,
            settings.PEER_IN_PLACE_BYTES, settings.PEER_PIPELINE_BYTES,
            settings.PEER_COPY_ENGINE_BYTES, settings.PEER_COPY_CHUNK_BYTES)}
        self.failed = None
        self._entries = {}
        self.side = None           # the stream beside the caller's of calls by the copy engines
        transport.before_close(lambda: memory.close(abort_peers=transport.aborted))
        transport.add_error_check(self.check)     # what a kernel reported, at synchronize

    def __call__(self, plan, transport, buffers, reduce=None, *, tag=0, timeout=None,
                 operation=None, dtype=None, op=None, **_):
        if self.failed is not None:
            raise self.failed
        memory = self.memory
        words = memory.words
        if words is None or words[ERROR_KIND_WORD]:     # a kernel reported
            self.check(operation or plan.collective)
        if dtype is None:
            dtype = next(a.dtype for a in buffers.values() if a is not None)
        input = buffers.get("input")
        output = buffers.get("output")
        seeded = input is not None and plan.collective in _SEEDED
        place = memory.place(output) if memory.heaps else 0
        key = (id(plan), dtype, op, seeded, place != 0)
        found = self._entries.get(key)
        if found is not None and found[0] is plan:
            entry = found[1]
        else:
            entry = self._entry(plan, np.dtype(dtype), op, key, seeded, place != 0)
        if entry.__class__ is _Elsewhere:
            if entry.seed:                  # the send/recv plan expects output seeded
                output[...] = input
                buffers = {"output": output}
            return nccl.execute(plan, transport, buffers, reduce, tag=tag, timeout=timeout,
                                operation=operation, dtype=dtype, op=op)
        stream = self.cupy.cuda.get_current_stream()
        if entry.layout is not memory.layout:     # a new entry, or the memory moved since
            self._fit(entry, stream, operation or plan.collective, plan.rank, timeout)
        last, memory.last_stream = memory.last_stream, stream
        if last is not stream and last is not None and last.ptr != stream.ptr:
            if stream.is_capturing():
                # A graph may not wait for work outside it: its replays are ordered with the
                # group's other calls by the caller, as NCCL's captured collectives are; no
                # later call waits for the capture stream either.
                memory.last_stream = None
            else:
                stream.wait_event(last.record())
        values = entry.values
        if entry.timeout != timeout:
            seconds = DEFAULT_TIMEOUT if timeout is None else timeout
            values[_TIMEOUT_NS].value = int(seconds * 1e9)
            entry.timeout = timeout
        caller_out = 0 if output is None else output.data.ptr
        values[_PLACE].value = place
        values[_IN].value = 0 if input is None else input.data.ptr
        values[_OUT].value = memory.data_ptr if entry.staged else caller_out
        values[_CALLER_OUT].value = caller_out
        if entry.finish is not None:
            self._by_copies(entry, stream, caller_out)
            return
        _launch(entry.function, entry.blocks, 1, 1, cuda_peer.THREADS, 1, 1, 0,
                stream.ptr, entry.params, 0)

    def _by_copies(self, entry, stream, output):
        """A call whose peers' blocks the copy engines copy out of their staging memory
        (``_Entry.copied``, or a pipelined all_reduce's gather): the first launch, on the
        caller's stream (the pipelined kernel, which ends once every peer's reduced block is
        ready) or beside it on a side stream that waits for it (``aside``: the staging of
        the input chunk after chunk, then the copy of this rank's own block); then each
        round of copies on the caller's stream, after a one-block launch that waits for its
        chunk (``waits``); the side stream joined; and ``copies_around``'s end (one block),
        which tells every peer, waits until every peer has read this rank's staging memory,
        and ends the call. The copy engines move large blocks over NVLink faster than
        thread blocks' loads do (BENCHMARKS.md). Whatever of it fails to be queued after the
        first launch fails the executor: that launch has begun the call, which no later
        call may go on from."""
        runtime, peers = self.cupy.cuda.runtime, self.memory.peer_data
        values, threads = entry.values, cuda_peer.THREADS
        first = stream
        if entry.aside:
            if self.side is None:
                self.side = self.cupy.cuda.Stream(non_blocking=True)
            first = self.side
            first.wait_event(stream.record())
        _launch(entry.function, entry.blocks, 1, 1, threads, 1, 1, 0, first.ptr,
                entry.params, 0)
        try:
            for wait, copies in entry.rounds:
                if wait is not None:
                    values[_AT["code_at"]].value = wait
                    _launch(entry.finish_function, 1, 1, 1, threads, 1, 1, 0, stream.ptr,
                            entry.params, 0)
                for q, at, src_at, nbytes in copies:
                    runtime.memcpyAsync(output + at, peers[q] + src_at, nbytes,
                                        runtime.memcpyDefault, stream.ptr)
            if entry.aside:
                stream.wait_event(first.record())
            values[_AT["code_at"]].value = entry.finish.data.ptr
            _launch(entry.finish_function, 1, 1, 1, threads, 1, 1, 0, stream.ptr,
                    entry.params, 0)
        except Exception as exc:     # the call is begun and cannot end here: no later call
            self.failed = exc        # may use the group's words
            raise
        finally:
            values[_AT["code_at"]].value = entry.code.data.ptr

    def _fit(self, entry, stream, operation, rank, timeout=None):
        """Grow the group's memory to what ``entry`` needs (collective: every rank's entry
        needs the same; a rank that never calls ends it on the others at ``timeout``) and
        point its values at it. The memory only grows, so an entry placed since the memory
        last moved fits."""
        memory = self.memory
        if memory.capacity < entry.staging or memory.inbox_half < entry.inbox or \
                memory.lines_half < entry.lines:
            if stream.is_capturing():
                raise TransportError(f"{operation} on rank {rank}: the peer staging memory "
                                     f"must grow to {entry.staging} bytes (inbox halves "
                                     f"{entry.inbox}, {entry.lines} for lines), which cannot "
                                     f"happen during graph capture; run the call once before "
                                     f"capturing it")
            try:
                memory.ensure(entry.staging, entry.inbox, entry.lines, operation,
                              DEFAULT_TIMEOUT if timeout is None else timeout)
            except Exception as exc:   # some rank never called, or could not map: no later
                self.failed = exc      # call may use this memory (the communicator aborted)
                raise
        entry.place(memory)

    def _entry(self, plan, dtype, op, key, seeded, symmetric=False):
        elsewhere = _Elsewhere(seeded and not pushed.reads_input(plan))
        if not cuda_peer.supported(op, dtype) or (not plan.args and plan.collective != "barrier"):
            entry = elsewhere
        else:
            entry = _Entry(plan, dtype, op, self.limit, self.eager, self.lines, self.fences,
                           self.memory, seeded, symmetric, self.direct)
            # every rank alike: both are over every rank's plan
            over = self.most and entry.program.largest * dtype.itemsize > self.most and \
                entry.program.staging
            if symmetric and not seeded and not over and in_place(plan, dtype, self.in_place):
                entry.in_place(plan, dtype, op, self.fences)    # this rank's buffer: in place
            elif copied(plan, dtype, self.copy_engine.get(plan.collective, 0)):  # all ranks
                entry.copied(plan, dtype, op, self.fences, self.copy_chunk)  # whatever output
            elif self.pipeline and pipelined(plan, dtype, self.pipeline, entry.blocks):
                entry.pipelined(plan, dtype, op, self.fences,          # whatever output
                                self.copy_engine.get("all_reduce", 0))
            elif over:
                entry = elsewhere
        if len(self._entries) > 4096:
            self._entries.clear()
        self._entries[key] = (plan, entry)     # the plan kept: its id is not reused meanwhile
        return entry

    def lane(self, group):
        """The compiled repeat path for ``group`` (``_peer_lane.Lane``), or None where it is
        not built or COLLECTIVES_PEER_LANE=0: then every call takes the Python path."""
        if not settings.PEER_LANE():
            return None
        try:
            from ._peer_lane import Lane
            launch = launch_address()
        except (ImportError, OSError, AttributeError):   # not built; no libcuda.so.1 to call
            return None
        return Lane(group, self, launch, cuda_peer.THREADS, self.cupy.cuda.get_current_stream,
                    _Elsewhere, launch_ex_address() if settings.PEER_OVERLAP() else 0)

    def start_at_call(self, call: int) -> None:
        """Make ``call`` this rank's next call number, as if the calls before it had run, so
        that tests reach the flagged lines' wrap (``pushed.LINE_PERIOD``) without 2^31
        calls. Every rank alike, with no call of the group in flight on any rank, and a
        barrier between this and any rank's next call."""
        memory, runtime = self.memory, self.cupy.cuda.runtime
        with self.cupy.cuda.Device(self.transport.device):
            runtime.deviceSynchronize()
            # every peer as having started call - 1 (its first epoch of that call)
            seen = np.full(memory.size, call << pushed.STEP_BITS, np.uint64)
            runtime.memcpy(memory.flags_ptr + 8 * cuda_peer.SEEN_WORDS, seen.ctypes.data,
                           seen.nbytes, 1)
            number = np.array([call], np.uint64)
            runtime.memcpy(memory.flags_ptr + 8 * cuda_peer.CALL_WORD, number.ctypes.data, 8, 1)
            # no peer as taking messages directly in some call (a word left by an earlier
            # call could name ``call`` after a jump back)
            runtime.memset(memory.flags_ptr + 8 * cuda_peer.DIRECT_WORDS, 0,
                           8 * cuda_peer.MAX_RANKS)
            runtime.deviceSynchronize()     # (the legacy stream orders no other)

    def check(self, operation="synchronize"):
        """Raise what a kernel of this group reported (no synchronization)."""
        reported = self.memory.error()
        if reported is None:
            return
        kind, step, peer = reported
        where = f"{operation} on rank {self.transport.rank}"
        at = "" if step < 0 else f" (plan step {step + 1})"
        if kind == peer_protocol.ERROR_TIMED_OUT:
            error = CollectiveTimeout(f"{where}: timed out on the GPU waiting for rank "
                                      f"{peer}{at}; every rank of the group stopped")
        elif kind == peer_protocol.ERROR_CALLED_OTHERWISE:
            error = TransportError(f"{where}: rank {peer} did not run this all_reduce as this "
                                   f"rank did, in place on a buffer in the group's symmetric "
                                   f"memory (two_shot, COLLECTIVES_PEER_IN_PLACE_BYTES): every "
                                   f"rank must call it so, or none; every rank stopped")
        elif kind == peer_protocol.ERROR_CLOSED:
            error = TransportError(f"{where}: the group's peer memory is closed (the group "
                                   f"was destroyed or aborted)")
        else:
            error = TransportError(f"{where}: rank {peer} gave up a collective on the GPU; "
                                   f"this rank stopped{at}")
        self.failed = error
        raise error


def make_executor(transport):
    """(the peer-memory executor for ``transport``'s group or None, why): None where the group
    does not use peer memory (COLLECTIVES_GPU_PATH; collective: every rank of the group calls
    it when the group is made, and all decide alike)."""
    from ..transports.peer import open_peer_memory
    path = settings.GPU_PATH()
    if path == "nccl":
        return None, "off (COLLECTIVES_GPU_PATH=nccl)"
    try:
        memory, why = open_peer_memory(transport)
    except Exception as exc:     # a CUDA without IPC (or a stand-in CuPy): the same on all ranks
        if path == "peer":
            raise
        memory, why = None, f"peer memory unusable ({type(exc).__name__}: {exc})"
    if memory is None:
        if path == "peer":
            raise TransportError(f"nccl group on rank {transport.rank}: COLLECTIVES_GPU_PATH="
                                 f"peer, but peer memory is not usable here: {why}")
        return None, why
    return PeerExecutor(transport, memory), why
