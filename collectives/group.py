"""ProcessGroup: a set of ranks over one transport.

The group is the one layer that sees arguments, algorithms and transports together: it
validates a call completely (before any byte moves), picks the algorithm (the explicit
argument, else a look-up in the group's decision table, ``collectives/tuning.py``: built once
when the group is made from ``COLLECTIVES_ALGORITHM``, the tuning file and the cost model,
its hash compared across the ranks then), assigns the call its tag in program order, and
returns a ready-to-run operation. Buffers here are flat, contiguous numpy or cupy arrays;
turning tensors into such views is the facade's job. The checks of one call's arguments, its
counts and size, and the call shape ``prepare`` keeps for repeated calls are
``collectives/call.py``'s.

Calls are matched across ranks by their order (the tag is a sequence number), so one group's
collectives must come from one thread at a time: two threads calling at once are ordered
differently on different ranks, and the ranks would pair one thread's call with the other's.
A rank that sees a second thread enter a collective while another is inside one (preparing
or running it) raises ``ConcurrentCalls`` there and fails the group: every later call on
it raises, and the transport is aborted so that the other ranks fail too instead of pairing
calls wrongly. Asynchronous collectives run on the group's own worker thread in tag order
and are not concurrent calls. Point-to-point calls are matched by tag, not order, and may
come from any thread.
"""
from __future__ import annotations

import sys
import threading
from threading import get_ident

import numpy as np

from .algorithms import AUTO, NATIVE, canonical, check_algorithm
from .algorithms.hierarchical import qualify
from .algorithms.topology import Topology
from .algorithms.schedule import COLLECTIVES, ROOTED, buffer_sizes, build_plan, plan_args
from . import debug, settings, signature, tuning
from .errors import CollectiveError
from . import executors
from .call import (CallShape, call_counts, call_size, check_buffer, check_root, check_sizes,
                   host_reducer, no_check, overlap, plain, same_memory)
from .kernels.reduce import check_op, finish_average
from .ops import REDUCING, ReduceOp
from .store.base import timeout_seconds

ENV_ALGORITHM = settings.ALGORITHM.name
# steps merged into windows of this many (transforms.windowed); 1 = off
ENV_WINDOW = settings.WINDOW.name
# host-buffer transports whose executors walk plans step by step (NCCL's groups steps itself)
WINDOWED_TRANSPORTS = ("local", "mpi", "socket")
_REPEATS_KEPT = 256


class ConcurrentCalls(CollectiveError):
    """Two threads called collectives on one group at once (see the module docstring)."""

# A group's wire tags: bit 0 tells collectives from user point-to-point, the bits above it hold
# the collective's sequence number or the user's tag. 32 bits at most, so a user tag can be
# any non-negative C int, as torch's are, and a wrapping transport (transports/subgroup.py)
# keeps the bits above for the group id; fewer where the transport carries fewer (MPI_TAG_UB
# may be as small as 2**15 - 1).
TAG_BITS = 32


window_setting = settings.WINDOW.parse          # text of $COLLECTIVES_WINDOW -> steps in flight
algorithm_overrides = tuning.parse_overrides    # text of $COLLECTIVES_ALGORITHM -> {collective: name}


class ProcessGroup:
    """``ranks`` are the global ranks of the members, in group-rank order. ``topology``: the
    members grouped into hosts (``algorithms.topology.Topology`` or its text, in group
    ranks); None: ``COLLECTIVES_TOPOLOGY``, which names the job's ranks (a subgroup takes its
    members' hosts from it), else none. It names the hosts of ``hierarchical:<intra>+<inter>``
    algorithms given without ``@<topology>``, and lets ``auto`` price hosts apart."""

    def __init__(self, transport, *, backend: str, timeout: float = 1800.0, group_id: int = 0,
                 ranks=None, name: str = "", topology=None):
        self.transport = transport
        self.backend = backend
        # seconds, None for no deadline (what every executor and transport wait takes)
        self.timeout = timeout_seconds(timeout, f"process group {name or group_id} on rank "
                                                f"{transport.rank}")
        self.group_id = group_id
        self.ranks = list(range(transport.size)) if ranks is None else list(ranks)
        self.name = name
        self.topology = self._topology(topology, subgroup=ranks is not None)
        # why calls on it are refused (destroy_process_group sets it); None while usable
        self.destroyed = None
        self._sequence = 0
        self._repeats = {}          # prepare's cache of repeated call shapes (CallShape)
        # the array type the transport works on (None: any array passes check_buffer)
        self._array_type = None if transport.xp is None else transport.xp.ndarray
        # The largest p2p tag this group's transport can carry apart from every other tag;
        # None where the transport carries no tags at all (NCCL matches messages in order).
        limit = transport.max_tag
        self.max_user_tag = None if limit is None else \
            (1 << (min(TAG_BITS, limit.bit_length()) - 1)) - 1
        self.async_thread = None        # the ident of the thread running async collectives
        self._gate = threading.Lock()   # held by the thread inside a collective call
        self._caller = None         # (thread id, operation) holding it
        self._broken = None         # why concurrent calls failed this group
        # the group's executor, chosen once from what the transport offers, and what runs
        # its plans (a benchmark may run another executor's on the same group)
        self.executor = executors.select(transport)
        self.execute = self.executor.execute
        # the executor's compiled repeat path for call shapes seen before (or None)
        lane = getattr(self.execute, "lane", None)
        self._lane = lane(self) if lane is not None else None
        # may be reassigned per group (benchmarks); read by _runner on every call
        self.window = settings.WINDOW()
        self.table = None
        self.retable()

    def retable(self) -> None:
        """(Re)build the decision table from the settings (``COLLECTIVES_ALGORITHM``,
        ``COLLECTIVES_TUNING``) and check that every rank built the same one: a collective
        call, made by every rank when the group is made (and by the benchmark after it
        calibrates). Under ``COLLECTIVES_DEBUG=INFO`` the table is logged once."""
        table = tuning.DecisionTable.for_group(self.size, self.transport, self.executor,
                                               window=self.window, topology=self.topology)
        self.table = table
        self._forget_repeats()
        if self.size > 1:
            self._agree(table)
        if debug.level() != "OFF" and self.rank == 0:
            debug.logger("collectives").info(
                f"group {self.name or self.group_id}: {table.format(computed_only=True)}")

    def _topology(self, given, subgroup: bool):
        """The group's Topology (see the class), checked against its size; ValueError naming
        this rank and where the topology came from otherwise."""
        where = "topology="
        if given is None:
            given, where = settings.TOPOLOGY(), f"{settings.TOPOLOGY.name}="
            if given is None:
                return None
            if subgroup and given.size != self.size and \
                    all(0 <= r < given.size for r in self.ranks):
                # the job's hosts, seen from a subgroup: its members' hosts, in group ranks
                given = Topology.from_map([given.host_of(r) for r in self.ranks])
        operation = f"ProcessGroup {self.name or self.group_id} on rank {self.rank}"
        try:
            topology = Topology.of(given)
            topology.check_size(self.size, f"{operation} ({where}{topology.spec})")
        except (TypeError, ValueError) as exc:
            message = str(exc) if str(exc).startswith(operation) else f"{operation}: {exc}"
            raise type(exc)(message) from None
        return topology

    @property
    def overrides(self) -> dict[str, str]:
        return self.table.overrides

    def _agree(self, table) -> None:
        """Every rank's table digest (and what it was built from), compared."""
        problem = tuning.disagreement(self.gather_records(table.agreement_record()),
                                      self.rank, "ProcessGroup")
        if problem:
            raise CollectiveError(problem)

    def gather_records(self, record: bytes) -> list[bytes]:
        """Every rank's ``record`` (alike in length on every rank), in rank order: one small
        all_gather over a fixed schedule, never the decision table's (the records say
        whether the ranks may trust it)."""
        xp = self.xp or np
        mine = xp.asarray(np.frombuffer(record, dtype=np.uint8))
        every = xp.empty(self.size * mine.size, dtype=np.uint8)
        self.prepare("all_gather", input=mine, output=every, algorithm="ring")()
        every = (every if xp is np else xp.asnumpy(every)).reshape(self.size, -1)
        return [row.tobytes() for row in every]

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    @property
    def xp(self):
        return self.transport.xp

    def symmetric_empty(self, shape, dtype="float32"):
        """A CuPy array in this group's symmetric memory: an allocation every rank of the
        group makes together and every peer maps (collective: every rank calls it, in the
        same order). A call whose output lies in it needs no staging: peers write their
        messages straight into it, which saves two passes over the output (large calls).
        Its memory is the group's until the group is destroyed (at most 16 per group);
        only groups on the peer-memory path (GPUs of one host) have it."""
        executor = self._peer_executor("symmetric_empty")
        cupy = executor.cupy
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        memory = executor.memory
        with cupy.cuda.Device(self.transport.device):
            ptr = memory.symmetric(nbytes)
            owned = cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), memory)
            return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(owned, 0))

    def register_buffer(self, array) -> None:
        """Map this rank's ``array`` (a contiguous CuPy array or CUDA tensor on this group's
        GPU) into every peer, as ncclCommRegister does: a later call whose output lies in
        it has peers write there directly, as into ``symmetric_empty`` memory, instead of
        staging it (two passes over the output less; at 256 MiB-1 GiB on 4 GPUs what takes
        two_shot all_reduce past NCCL). Collective: every rank registers its own buffer
        (sizes may differ), in the same order. Keep the buffer allocated until
        ``deregister_buffer`` (or the group's end): its memory may not go back to the driver
        meanwhile. A call whose output was freed and allocated again at the same address
        is staged, never written through the old mapping. At most 16 symmetric allocations
        and registered buffers per group; only groups on the peer-memory path have them."""
        memory, array = self._peer_buffer("register_buffer", array)
        try:
            memory.register(array.data.ptr, array.nbytes)
        except ValueError as exc:
            raise CollectiveError(str(exc)) from None

    def deregister_buffer(self, array) -> None:
        """Forget a buffer ``register_buffer`` mapped (collective: every rank its own, in the
        same order); later calls stage an output there again."""
        memory, array = self._peer_buffer("deregister_buffer", array)
        try:
            memory.deregister(array.data.ptr)
        except ValueError as exc:
            raise CollectiveError(str(exc)) from None

    def _peer_executor(self, operation):
        """This group's peer-memory executor, or CollectiveError naming ``operation``."""
        executor = self.executor.peer
        if executor is None:
            why = self.executor.peer_path or f"a {self.backend} group"
            raise CollectiveError(f"{operation} on rank {self.rank}: this group has no "
                                  f"peer memory ({why})")
        return executor

    def _peer_buffer(self, operation, array):
        """(the group's peer memory, ``array`` viewed as a CuPy array), checked on this
        rank before any rank is asked."""
        executor = self._peer_executor(operation)
        cupy = executor.cupy
        view = None
        if isinstance(array, cupy.ndarray) or hasattr(array, "__cuda_array_interface__"):
            try:
                view = cupy.asarray(array)      # device memory: a view, never a copy
            except Exception:                   # noqa: BLE001 (said below)
                view = None
        if view is None:
            raise TypeError(f"{operation} on rank {self.rank}: expected a CuPy array or a "
                            f"CUDA tensor (device memory), got {type(array).__name__}")
        if not view.flags.c_contiguous or view.nbytes == 0:
            raise ValueError(f"{operation} on rank {self.rank}: the buffer must be contiguous "
                             f"and must not be empty (shape {view.shape})")
        if view.device.id != self.transport.device:
            raise ValueError(f"{operation} on rank {self.rank}: the buffer is on GPU "
                             f"{view.device.id}, this rank's group uses GPU "
                             f"{self.transport.device}")
        return executor.memory, view

    # -- tags ------------------------------------------------------------------------------

    def next_tag(self) -> int:
        """The tag of the next collective; every rank calls collectives in the same order.
        The sequence number wraps at max_user_tag: a wrapped tag meets only calls that far
        back, whose messages were all matched before (one pair's messages of one tag arrive
        in order, and a group's calls run in order)."""
        self._sequence += 1
        limit = self.max_user_tag
        value = self._sequence % (limit + 1) if limit is not None else 0
        return (value << 1) | 1

    def p2p_tag(self, tag, operation: str = "p2p") -> int:
        """The wire tag of a user tag: an error, never a wrap, when the transport cannot carry
        it apart from every other tag."""
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or tag < 0:
            raise ValueError(f"{operation} on rank {self.rank}: tag must be a non-negative "
                             f"integer, got {tag!r}")
        limit = self.max_user_tag
        if limit is None:
            if tag != 0:
                raise ValueError(f"{operation} on rank {self.rank}: the {self.transport.name} "
                                 f"transport carries no tags (messages between two ranks match "
                                 f"in the order they were posted); tag must be 0, got {tag}")
            return 0
        if tag > limit:
            raise ValueError(f"{operation} on rank {self.rank}: tag {tag} is larger than the "
                             f"{self.transport.name} transport can carry in this group "
                             f"(at most {limit})")
        return int(tag) << 1

    # -- one caller at a time ----------------------------------------------------------------

    def _enter(self, operation) -> bool:
        """Claim the group for this thread while it prepares or runs ``operation``; True if
        this call took the claim (and must ``_leave``), False if the thread holds it already.
        A lock taken without waiting: ~0.2 us, where a context manager cost 2 us a call."""
        if self._broken is None and self._gate.acquire(False):
            self._caller = (threading.get_ident(), operation)
            return True
        caller = self._caller
        if self._broken is None and caller is not None and caller[0] == threading.get_ident():
            return False
        self._concurrent(operation, caller)

    def _leave(self, took: bool) -> None:
        if took:
            self._caller = None
            self._gate.release()

    def _concurrent(self, operation, caller):
        """Fail the group (see the module docstring) and raise in this thread."""
        first = self._broken is None
        if first:
            ident, other = caller if caller is not None else (None, "a collective")
            name = next((t.name for t in threading.enumerate() if t.ident == ident), "?")
            self._broken = (f"threads {name!r} ({other}) and "
                            f"{threading.current_thread().name!r} ({operation}) called "
                            f"collectives on this group at the same time; the ranks cannot "
                            f"agree on their order (use one group per thread, or one thread "
                            f"per group)")
        error = ConcurrentCalls(f"{operation} on rank {self.rank}: {self._broken}")
        if first:
            abort = getattr(self.transport, "abort", None)
            if abort is not None:
                # said first: under MPI the abort ends this process too, before any raise
                sys.stderr.write(f"collectives: {error}; aborting the transport\n")
                sys.stderr.flush()
                abort(str(error))
        raise error

    # -- all_to_all with split sizes --------------------------------------------------------

    def all_to_all_matrix(self, sends, recvs, operation: str, call):
        """The full matrix counts[i][j] (i sends to j) from this rank's split sizes. Our
        schedules need every rank's row, so rows and columns are all-gathered (one small
        collective, run now by ``call(run)``: the facade's, so it follows queued async work
        on the caller's stream) and every rank checks them all: a size mismatch is then the
        same ValueError on every rank, before any data moves."""
        p = self.size
        table = self.xp.empty(2 * p * p, dtype="int64")
        mine = self.xp.asarray(list(sends) + list(recvs), dtype="int64")
        call(self.prepare("all_gather", input=mine, output=table))
        table = (table.get() if hasattr(table, "get") else table).reshape(p, 2, p).tolist()
        matrix = [table[i][0] for i in range(p)]
        for j in range(p):
            column = [matrix[i][j] for i in range(p)]
            if column != table[j][1]:
                raise ValueError(f"{operation} on rank {self.rank}: rank {j} expects "
                                 f"{table[j][1]} elements from the ranks, but they send it "
                                 f"{column}")
        return matrix

    # -- algorithms ------------------------------------------------------------------------

    def resolve_algorithm(self, collective: str, algorithm: str | None, nbytes: int) -> str:
        """The call's ``algorithm=`` if given, else the decision table's row (which holds
        COLLECTIVES_ALGORITHM, the tuning file and the model) for its size. A hierarchical
        name without ``@<topology>`` takes the group's topology (a ValueError naming the
        call and the rank where the group has none)."""
        name = qualify(algorithm or AUTO, self.topology)    # hierarchical:a+b -> ...@hosts
        try:
            if name == AUTO and collective in COLLECTIVES:
                return self.table.algorithm(collective, nbytes)
            check_algorithm(collective, name, native_available=self.transport.native is not None)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{collective} on rank {self.rank}: {exc}") from None
        return self.table.algorithm(collective, nbytes) if name == AUTO else \
            canonical(collective, name)

    # -- the one entry point ---------------------------------------------------------------

    def prepare(self, collective: str, *, input=None, output=None, counts=None, root: int = 0,
                op=ReduceOp.SUM, algorithm: str | None = None, timeout=None):
        """Validate a call and return ``run()`` that performs it. Nothing moves before run().
        ``timeout``: None, the group's; else seconds or a timedelta, as ``timeout_seconds``
        reads it (inf: no deadline; NaN or negative: ValueError)."""
        lane = self._lane
        if lane is not None:        # a shape seen before, on the executor's compiled path
            run = lane.prepare(self, collective, input, output, counts, root, op, algorithm,
                               timeout)
            if run is not None:
                return run
        took = self._enter(collective)
        sequence = self._sequence
        try:
            return self._prepare(collective, input, output, counts, root, op, algorithm,
                                 timeout)
        except (TypeError, ValueError):
            # A call refused on some ranks only (a root-only list that does not match) still
            # takes its place in the order: the next call then meets the others' next call,
            # never this one's stray messages. (DETAIL's check instead makes the others' call
            # fail at once, so there the order is left as it was.)
            if self._sequence == sequence and debug.level() != "DETAIL":
                self._sequence += 1
            raise
        finally:
            self._leave(took)

    def _prepare(self, collective, input, output, counts, root, op, algorithm, timeout):
        # A call shaped like an earlier one (same collective, dtypes, sizes, op, algorithm,
        # root, timeout) reuses that call's checks, choice and plans: only what the key does
        # not imply about the arrays is checked again.
        key = self._repeat_key(collective, input, output, counts, root, op, algorithm, timeout)
        try:
            known = self._repeats.get(key) if key is not None else None
        except TypeError:           # something in it cannot be hashed: the full path
            key = known = None
        # the compiled lane skips this check: it only finds keys remembered after it passed
        deadline = self.timeout if timeout is None else \
            timeout_seconds(timeout, f"{collective} on rank {self.rank}")
        if known is not None:
            array = self._array_type
            if not (plain(input, array, False) and plain(output, array, True)):
                for name, buf in (("input", input), ("output", output)):
                    check_buffer(collective, name, buf, known.dtype, self.rank, self.transport)
            tag = self.next_tag()
            if known.plan is None:
                return self._native(collective, input, output, known.counts, root, known.op,
                                    no_check)
            return self._runner(known, input, output, root, no_check, tag)
        try:
            op = ReduceOp.parse(op)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{collective} on rank {self.rank}: {exc}") from None
        check_root(collective, root, self.rank, self.size)
        data = output if input is None else input
        dtype = None if data is None else data.dtype
        for name, buf in (("input", input), ("output", output)):
            check_buffer(collective, name, buf, dtype, self.rank, self.transport)
        if collective in REDUCING and dtype is not None:
            check_op(op, dtype, collective, self.rank)
        counts = call_counts(collective, counts, input, output, self.rank, self.size)
        n_in, n_out = buffer_sizes(collective, self.rank, self.size, counts, root)
        check_sizes(collective, input, output, n_in, n_out, root, self.rank)
        nbytes = 0 if data is None else call_size(collective, counts, self.size) * data.itemsize
        name = self.resolve_algorithm(collective, algorithm, nbytes)
        check = self._call_check(collective, name, dtype, counts, root, op, deadline)
        tag = self.next_tag()
        if name == NATIVE:
            run = self._native(collective, input, output, counts, root, op, check)
            self._remember(key, check, CallShape(collective, dtype, None, None, op, deadline,
                                                 counts, None, 1))
            return run

        plan = build_plan(collective, name, self.rank, self.size,
                          *plan_args(collective, self.size, counts, root))
        window = self.window if self.transport.name in WINDOWED_TRANSPORTS else 1
        reduce = host_reducer(op, dtype) if collective in REDUCING else None
        shape = CallShape(collective, dtype, plan, reduce, op, deadline, counts,
                          self._signature(collective, name, dtype, op, root), window)
        self._remember(key, check, shape)
        return self._runner(shape, input, output, root, check, tag)

    def _signature(self, collective, name, dtype, op, root):
        """What every message of the call carries where the transport compares it
        (collectives.signature); None where it does not."""
        if not self.transport.carries_signatures:
            return None
        return signature.encode(collective, name, np.uint8 if dtype is None else dtype,
                                op if collective in REDUCING else None,
                                root if collective in ROOTED else None)

    def _repeat_key(self, collective, input, output, counts, root, op, algorithm, timeout):
        """What decides everything ``prepare`` works out except the per-array checks, or None
        where the call must take the full path (explicit counts, call checks under DETAIL)."""
        if counts is not None or debug.level() == "DETAIL":
            return None
        try:           # (hashable or not: _prepare's look-up finds out, hashing it once)
            return (collective, root, op, algorithm, timeout, self.timeout,
                    None if input is None else (input.dtype, input.size),
                    None if output is None else (output.dtype, output.size))
        except AttributeError:
            return None

    def _remember(self, key, check, entry):
        if key is not None and check is no_check:
            if len(self._repeats) >= _REPEATS_KEPT:
                self._forget_repeats()
            self._repeats[key] = entry
            if self._lane is not None:
                self._lane.remember(key, entry)

    def _forget_repeats(self):
        self._repeats.clear()
        if self._lane is not None:
            self._lane.clear()

    def _runner(self, shape, input, output, root, check, tag):
        execute = self.execute
        collective, reduce, op, deadline, dtype = (shape.collective, shape.reduce, shape.op,
                                                   shape.deadline, shape.dtype)
        plan = shape.steps
        direct = None
        if collective == "all_reduce" and input is not None and not overlap(input, output):
            direct = shape.reading_input_first()   # no input -> output copy first
        if direct is not None:
            plan = direct
        extra = shape.extra

        def run():
            # _enter's fast path inlined (this is every call's path); the group's async worker
            # runs calls in tag order, so it is no concurrent caller
            me = get_ident()
            if me == self.async_thread:
                took = False
            elif self._broken is None and self._gate.acquire(False):
                self._caller, took = (me, collective), True
            else:
                took = self._enter(collective)
            try:
                check()
                buffers = ({"input": input, "output": output} if direct is not None
                           else self._buffers(collective, input, output))
                if collective == "barrier":
                    buffers = {"scratch": self.xp.zeros(plan.scratch, dtype=np.uint8)}
                execute(plan, self.transport, buffers, reduce, tag=tag, timeout=deadline,
                        operation=collective, dtype=dtype, op=op, **extra)
                if op == ReduceOp.AVG:
                    self._finish(collective, op, output, root)
            finally:
                if took:
                    self._caller = None
                    self._gate.release()
        return run

    # -- helpers ---------------------------------------------------------------------------

    def _buffers(self, collective, input, output):
        if collective in ("all_reduce", "broadcast"):
            if input is not None and not same_memory(input, output):
                if getattr(self.execute, "seeds_output", False) and not overlap(input, output):
                    return {"input": input, "output": output}    # the executor reads input
                output[...] = input
            return {"output": output}
        if input is not None and output is not None and overlap(input, output):
            input = input.copy()      # schedules read input while writing output
        return {"input": input, "output": output}

    def _finish(self, collective, op, output, root):
        if op == ReduceOp.AVG and collective in REDUCING:
            if collective != "reduce" or self.rank == root:
                finish_average(output, self.size)

    def _call_check(self, collective, name, dtype, counts, root, op, timeout):
        """Under COLLECTIVES_DEBUG=DETAIL, a function that all-gathers every rank's call
        fingerprint and raises on any mismatch; otherwise a no-op."""
        if debug.level() != "DETAIL" or self.size == 1:
            return no_check
        mine = dict(operation=collective, algorithm=name, dtype=str(dtype), counts=counts,
                    root=root if collective in ROOTED else None,
                    op=op.name if collective in REDUCING else None)
        record = self.xp.asarray(debug.fingerprint(**mine))
        n = record.size
        execute = self.execute
        plan = build_plan("all_gather", self.table.algorithm("all_gather", n * self.size),
                          self.rank, self.size, (n,) * self.size)
        tag = self.next_tag()

        def check():
            table = self.xp.empty(n * self.size, dtype=np.uint8)
            execute(plan, self.transport, {"input": record, "output": table}, None,
                    tag=tag, timeout=timeout, operation=f"{collective} (call check)", dtype=np.uint8)
            debug.compare(table.get() if hasattr(table, "get") else table, mine, self.rank,
                          collective)
        return check

    def _native(self, collective, input, output, counts, root, op, check):
        native = self.transport.native
        base_op = ReduceOp.SUM if op == ReduceOp.AVG else op
        if not native.supports(collective, output.dtype if output is not None else np.uint8, base_op):
            raise ValueError(f"{collective} on rank {self.rank}: the native {self.backend} "
                             f"collective does not support this dtype/op; use another algorithm")

        def run():
            check()
            call = getattr(native, collective)
            if collective == "all_reduce":
                call(input if input is not None else output, output, base_op)
            elif collective == "broadcast":
                call(output, root)
            elif collective in ("reduce_scatter",):
                call(input, output, counts, base_op)
            elif collective == "reduce":
                call(input, output, root, base_op)
            elif collective == "all_gather":
                call(input, output, counts)
            elif collective == "all_to_all":
                call(input, output, counts[self.rank], tuple(row[self.rank] for row in counts))
            elif collective in ("gather", "scatter"):
                call(input, output, counts, root)
            else:
                call()
            self._finish(collective, op, output, root)
        return run
