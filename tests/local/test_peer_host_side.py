"""The peer-memory path's host side on the CPU, over a stand-in for CuPy's runtime: how the
group's memory grows (``transports/peer.py``) and which calls the executor hands to NCCL
send/recv, with what buffers (``executors/peer.py``). The kernel itself runs only on GPUs
(tests/gpu/test_peer.py); its protocol runs on the CPU in
algorithms/pushed_sim.py."""
import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from collectives import settings
from collectives.algorithms.schedule import build_plan
from collectives.algorithms.transforms import read_input_first
from collectives.executors import peer as peer_executor
from collectives.transports import peer as peer_memory


class Runtime:
    """malloc/memset/free and IPC handles of one rank, recorded."""

    def __init__(self):
        self.next, self.zeroed, self.freed = 1 << 20, [], []

    def malloc(self, nbytes):
        self.next += nbytes + 4096
        return self.next

    def memsetAsync(self, ptr, value, nbytes, stream):
        self.zeroed.append((ptr, value, nbytes))

    def free(self, ptr):
        self.freed.append(ptr)

    def deviceSynchronize(self):
        pass

    def ipcGetMemHandle(self, ptr):
        return ptr.to_bytes(peer_memory._HANDLE, "little")      # 64 bytes, as CUDA's


class Stream:
    """A CUDA stream: where the memory's copies went, in order (``Stream.log``)."""
    log, current = [], None

    def __init__(self, non_blocking=False):
        self.ptr = id(self)

    def __enter__(self):
        self.outer, Stream.current = Stream.current, self
        return self

    def __exit__(self, *exc):
        Stream.current = self.outer
        return False

    def synchronize(self):
        Stream.log.append(("synchronized", self.ptr))


def memory(monkeypatch):
    runtime = Runtime()
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime, Stream=Stream,
                                                Device=lambda d: contextlib.nullcontext()),
                           asarray=np.asarray)
    monkeypatch.setattr(peer_memory, "_all_gather", lambda transport, blob, *how: [blob])
    mem = peer_memory.PeerMemory.__new__(peer_memory.PeerMemory)
    mem.cupy, mem.transport, mem.rank, mem.size = cupy, SimpleNamespace(device=0), 0, 1
    mem.data_ptr, mem.capacity, mem.peer_data, mem.peer_data_array = 0, 0, [], None
    mem.inbox_ptr, mem.inbox_half, mem.peer_inbox, mem.peer_inbox_array = 0, 0, [], None
    mem.lines_ptr, mem.lines_half, mem.peer_lines, mem.peer_lines_array = 0, 0, [], None
    mem.heaps, mem.peer_heaps_array = [], np.zeros(peer_memory.MAX_HEAPS, np.uint64)
    mem.places = {}
    return mem, runtime


def test_the_first_call_allocates_every_area_and_each_grows_alone(monkeypatch):
    mem, runtime = memory(monkeypatch)
    mem.ensure(256, 256, 256)          # a call that stages nothing still gets all three
    assert mem.data_ptr and mem.inbox_ptr and mem.lines_ptr
    assert list(mem.peer_lines_array) == [mem.lines_ptr]
    zeroed = {ptr: nbytes for ptr, _, nbytes in runtime.zeroed}
    assert zeroed == {mem.inbox_ptr: 2 * mem.inbox_half, mem.lines_ptr: 2 * mem.lines_half}
    data, inbox, lines = mem.data_ptr, mem.inbox_ptr, mem.lines_ptr
    mem.ensure(256, 256, 1 << 20)      # only the inbox of lines grows, zeroed again
    assert (mem.data_ptr, mem.inbox_ptr) == (data, inbox) and mem.lines_ptr != lines
    assert runtime.freed == [lines] and mem.lines_half >= 1 << 20
    assert runtime.zeroed[-1] == (mem.lines_ptr, 0, 2 * mem.lines_half)


def test_a_call_handed_to_send_recv_gets_the_buffers_its_plan_reads(monkeypatch):
    """complex64 has no peer kernel, so the call goes to the NCCL send/recv executor. The
    group passed input beside output for the peer program to read: a plan that reads only
    output then needs output seeded with input first; a plan that reads input itself (the
    read-input-first rewrite) must get input and an untouched output. Dropping input for it
    crashed the GPU bench at 64 MiB."""
    calls = []
    monkeypatch.setattr(peer_executor.nccl, "execute",
                        lambda plan, transport, buffers, *a, **k: calls.append(dict(buffers)))
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.copy_engine, executor.side = {}, None
    executor.failed, executor._entries = None, {}
    executor.memory = SimpleNamespace(error=lambda: None, words=[0, 0, 0, 0], heaps=[])
    executor.transport = SimpleNamespace(rank=0)
    plan = build_plan("all_reduce", "ring", 0, 2, 8)
    data = np.arange(8, dtype=np.complex64)
    for chosen, reads_input in ((plan, False), (read_input_first(plan, 8), True)):
        output = np.zeros(8, np.complex64)
        executor(chosen, None, {"input": data, "output": output}, dtype=np.complex64)
        if reads_input:
            assert calls[-1]["input"] is data and not output.any()
        else:
            assert set(calls[-1]) == {"output"} and (output == data).all()


class KernelEntry:
    """The executor's entry without a GPU: its program, and which kernel it runs."""

    def __init__(self, plan, dtype, op, limit, eager, lines, fences, memory, seeded,
                 symmetric=False, direct=False):
        self.program = peer_executor.pushed.lower(plan, eager // dtype.itemsize,
                                                  lines // dtype.itemsize, seeded, symmetric,
                                                  direct)
        self.kernel, self.blocks = "run_program", limit

    def in_place(self, plan, dtype, op, fences):
        self.kernel = "two_shot_in_place"

    def pipelined(self, plan, dtype, op, fences, copy_engine=0):
        self.kernel = "pipelined_" + plan.collective      # (its gather: test_peer_lane.py)

    def copied(self, plan, dtype, op, fences, chunk_bytes):
        self.kernel = "copies_" + plan.collective


def test_calls_above_the_size_limit_leave_peer_memory_only_where_a_plan_stages_output(
        monkeypatch):
    """COLLECTIVES_PEER_MAX_BYTES: a call whose largest message is above it goes to NCCL
    send/recv where some rank's plan stages its output (all_gather, two_shot all_reduce:
    receives land in output), whatever this rank's output is (every rank must decide
    alike); reduce_scatter stages nothing and stays on peer memory at every size (before,
    it went to send/recv too: 0.89 of NCCL's own at 256 MiB on 4 x H100 where peer memory
    runs it at 0.98). Below the limit, or with no limit, everything stays."""
    monkeypatch.setattr(peer_executor, "_Entry", KernelEntry)
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.copy_engine, executor.side = {}, None
    executor._entries, executor.memory, executor.limit, executor.fences = {}, None, 4, 0
    executor.eager, executor.lines, executor.direct = 4 << 20, 256 << 10, True
    executor.in_place, executor.pipeline = 8 << 20, 0
    n = 64 << 20                                  # 256 MiB of float32 over 4 ranks
    cases = {"reduce_scatter": build_plan("reduce_scatter", "direct", 0, 4, (n // 4,) * 4),
             "all_gather": build_plan("all_gather", "direct", 0, 4, (n // 4,) * 4),
             "all_reduce": build_plan("all_reduce", "two_shot", 0, 4, n)}
    dtype = np.dtype(np.float32)
    for most, symmetric, stays in ((32 << 20, False, {"reduce_scatter"}),
                                   (32 << 20, True, {"reduce_scatter"}),
                                   (1 << 30, False, set(cases)), (0, False, set(cases))):
        executor.most = most
        for name, plan in cases.items():
            entry = executor._entry(plan, dtype, None, (name, most, symmetric), False,
                                    symmetric)
            assert (type(entry) is KernelEntry) == (name in stays), (name, most, symmetric)


def test_two_shot_in_place_on_symmetric_memory_runs_as_one_pass_and_nothing_else_does(
        monkeypatch):
    """``two_shot_in_place`` replaces the program only for a two_shot all_reduce called in place
    (not seeded) on symmetric memory, from 2 to 8 ranks, up to COLLECTIVES_PEER_IN_PLACE_BYTES
    (0: never); above the size limit where the plan would stage every rank leaves peer memory
    alike, whatever its buffer."""
    monkeypatch.setattr(peer_executor, "_Entry", KernelEntry)
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.copy_engine, executor.side = {}, None
    executor._entries, executor.memory, executor.limit, executor.fences = {}, None, 4, 0
    executor.eager, executor.lines, executor.direct = 4 << 20, 256 << 10, True
    executor.most, executor.in_place, executor.pipeline = 32 << 20, 8 << 20, 0
    dtype = np.dtype(np.float32)

    def kernel(plan, seeded, symmetric):
        entry = executor._entry(plan, dtype, None, object(), seeded, symmetric)
        return getattr(entry, "kernel", "nccl send/recv")

    two_shot = build_plan("all_reduce", "two_shot", 1, 4, 1 << 20)
    assert kernel(two_shot, False, True) == "two_shot_in_place"
    assert kernel(two_shot, True, True) == "run_program"          # out of place
    assert kernel(two_shot, False, False) == "run_program"        # not symmetric
    for other in (build_plan("all_reduce", "ring", 1, 4, 1 << 20),
                  build_plan("all_reduce", "direct", 1, 4, 1 << 20),
                  build_plan("reduce_scatter", "direct", 1, 4, (1 << 18,) * 4)):
        assert kernel(other, False, True) == "run_program", other.algorithm
    assert kernel(build_plan("all_reduce", "two_shot", 0, 8, 4096), False, True) == \
        "two_shot_in_place"
    assert kernel(build_plan("all_reduce", "two_shot", 0, 9, 4096), False, True) == \
        "run_program"                                             # past the kernel's build
    assert kernel(build_plan("all_reduce", "two_shot", 0, 4, 2 << 20), False, True) == \
        "two_shot_in_place"                                       # 8 MiB of float32
    assert kernel(build_plan("all_reduce", "two_shot", 0, 4, (2 << 20) + 1), False, True) == \
        "run_program"                                             # past it
    assert kernel(build_plan("all_reduce", "two_shot", 0, 4, 64 << 20), False, True) == \
        "nccl send/recv"                                          # above the staging limit
    executor.in_place = 0
    assert kernel(two_shot, False, True) == "run_program"


def test_each_call_sets_its_buffers_the_memory_only_when_it_moved_and_its_deadline(monkeypatch):
    """The kernel's parameters of one cached entry over calls: the buffers every call, the
    peers' tables and the staging pointers again only after the memory grew (for another
    call's needs), the deadline from the call's timeout (None: the default) whenever it
    changes. Growing during graph capture is refused before anything is launched."""
    mem, runtime = memory(monkeypatch)
    mem.layout, mem.last_stream, mem.words = object(), None, [0, 0, 0, 0]
    mem.flags_ptr, mem.error_ptr = 77, 88
    mem.peer_flags_array = SimpleNamespace(data=SimpleNamespace(ptr=66))
    mem.peer_heaps_array = SimpleNamespace(data=SimpleNamespace(ptr=44))
    # each table of peers' addresses a device array at an address of its own
    mem.cupy.asarray = lambda a: SimpleNamespace(data=SimpleNamespace(ptr=int(a[0]) + 1))
    launched = []
    monkeypatch.setattr(peer_executor, "_launch", lambda *args: launched.append(
        [v.value for v in entry.values]))
    capturing = []
    stream = SimpleNamespace(ptr=5, is_capturing=lambda: bool(capturing))
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.copy_engine, executor.side = {}, None
    executor.failed, executor._entries, executor.memory = None, {}, mem
    executor.transport = SimpleNamespace(rank=0)
    executor.cupy = SimpleNamespace(cuda=SimpleNamespace(get_current_stream=lambda: stream))
    plan = build_plan("all_gather", "ring", 0, 2, (4, 4))
    program = SimpleNamespace(code=np.zeros((1, 8)), sends=[0, 1], recvs=[0, 1], largest=4,
                              busiest=4, scratch_at=0, scratch_max=4, inbox=4, line_inbox=4,
                              output_staged=False)
    monkeypatch.setattr(peer_executor.pushed, "lower", lambda *a, **k: program)
    monkeypatch.setattr(peer_executor.cuda_peer, "program_kernel", lambda *a: SimpleNamespace(
        kernel=SimpleNamespace(ptr=1)))
    fake_cupy = SimpleNamespace(asarray=lambda a: SimpleNamespace(data=SimpleNamespace(ptr=9)))
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake_cupy)

    def array(ptr):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), dtype=np.dtype(np.float32))
    entry = peer_executor._Entry(plan, np.dtype(np.float32), None, 4, 0, 1 << 10, 0, mem,
                                 False)
    executor._entries[(id(plan), np.dtype(np.float32), None, False, False)] = (plan, entry)

    def call(inp, out, timeout=None):
        executor(plan, None, {"input": array(inp), "output": array(out)}, timeout=timeout,
                 dtype=np.dtype(np.float32))
    call(1000, 2000)
    first = launched[-1]
    assert (first[3], first[4], first[6]) == (1000, 2000, 2000)       # input, output
    assert first[5] == mem.data_ptr and first[7] == mem.peer_data_array.data.ptr
    assert first[15] == int(peer_executor.DEFAULT_TIMEOUT * 1e9)
    assert (first[20], first[21]) == (0, 44)    # output staged (no symmetric memory): place 0
    call(1100, 2100, timeout=2.0)
    assert (launched[-1][3], launched[-1][6], launched[-1][15]) == (1100, 2100, int(2e9))
    mem.ensure(1 << 24)                  # another call's needs: the staging memory moves
    call(1200, 2200)
    assert launched[-1][5] == mem.data_ptr != first[5]
    assert launched[-1][7] == mem.peer_data_array.data.ptr != first[7]
    assert launched[-1][15] == int(peer_executor.DEFAULT_TIMEOUT * 1e9)
    bigger = peer_executor._Entry(plan, np.dtype(np.float32), None, 4, 0, 1 << 10, 0, mem,
                                  False)
    bigger.staging = 2 * mem.capacity
    executor._entries[(id(plan), np.dtype(np.float32), None, False, False)] = (plan, bigger)
    capturing.append(True)
    count = len(launched)
    with pytest.raises(peer_executor.TransportError, match="graph capture"):
        call(1300, 2300)
    assert len(launched) == count


def test_symmetric_memory_says_where_an_output_lies_and_refuses_too_many(monkeypatch):
    """An output wholly inside a symmetric allocation has a place (the allocation's number
    plus one, shifted, and the byte offset), which the kernel publishes to its senders;
    anything else (another buffer, one running past the allocation's end) is staged
    (place 0). A group has at most MAX_HEAPS of them; the next is refused naming the rank."""
    mem, runtime = memory(monkeypatch)

    def array(ptr, nbytes):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), nbytes=nbytes)
    assert mem.place(array(123, 8)) == 0
    first = mem.symmetric(4096)
    second = mem.symmetric(1 << 20)
    assert runtime.zeroed[-1] == (second, 0, 1 << 20)
    assert list(mem.peer_heaps_array[:2]) == [first, second]      # one rank: its own
    shift = peer_memory.HEAP_SHIFT
    assert mem.place(array(first, 4096)) == 1 << shift
    assert mem.place(array(second + 64, 256)) == (2 << shift) | 64
    assert mem.place(array(first + 4000, 256)) == 0              # runs past the end
    assert mem.place(None) == 0
    for _ in range(peer_memory.MAX_HEAPS - 2):
        mem.symmetric(256)
    with pytest.raises(ValueError, match="rank 0: at most 16 symmetric allocations"):
        mem.symmetric(256)


class TwoRanks:
    """Rank 0 of two: the peer's side of each all_gather (its IPC handle names its allocation at
    0x50000, its buffer 0x40 into it; its one-byte answers, 1 where it failed its part: a
    buffer it cannot share, a handle it could not open, a buffer it has not registered), the
    driver's view of this rank's buffers (their allocation at 0x10000, a buffer id that
    changes when it is freed and allocated again), and the handles this rank opened and
    closed."""

    def __init__(self, monkeypatch, capable=True, peer_fails=False):
        self.mem, self.runtime = memory(monkeypatch)
        mem = self.mem
        mem.size = 2
        mem.peer_heaps_array = np.zeros(peer_memory.MAX_HEAPS * 2, np.uint64)
        self.opened, self.closed, self.buffer = [], [], 11
        self.answers = [b"\1"] if peer_fails else []     # then b"\0": the peer did its part
        self.open_fails = False

        def open_handle(handle, flags):
            if self.open_fails:
                raise RuntimeError("cudaErrorMapBufferObjectFailed")
            self.opened.append(int.from_bytes(handle[:8], "little") + 0x7000000)
            return self.opened[-1]
        self.runtime.ipcOpenMemHandle = open_handle
        self.runtime.ipcCloseMemHandle = self.closed.append

        def all_gather(transport, blob, *how):
            if len(blob) == 1:
                return [blob, self.answers.pop(0) if self.answers else b"\0"]
            return [blob, (0x50000).to_bytes(peer_memory._HANDLE, "little") +
                    (0x40).to_bytes(8, "little")]
        monkeypatch.setattr(peer_memory, "_all_gather", all_gather)
        monkeypatch.setattr(peer_memory._Driver, "allocation",
                            lambda ptr: (0x10000, 1 << 20, capable, self.buffer))
        monkeypatch.setattr(peer_memory._Driver, "buffer_id", lambda ptr: self.buffer)


def _array(ptr, nbytes):
    return SimpleNamespace(data=SimpleNamespace(ptr=ptr), nbytes=nbytes)


def test_a_registered_buffer_is_mapped_at_its_offset_and_staged_once_its_memory_changes(
        monkeypatch):
    """Each rank maps the allocation its peer's buffer lies in (the handle names the whole
    allocation) and adds the offset the peer sent: the kernel's table of heaps holds this
    rank's buffer and the peer's as mapped here. An output inside it has a place, as in
    symmetric memory; once the driver's buffer id there is another (the allocation freed and
    made again at that address) the output is staged, never written through the stale
    mapping. Deregistered, the peer's mapping is closed and the slot taken by the next."""
    rig = TwoRanks(monkeypatch)
    mem = rig.mem
    mem.register(0x10300, 4096)
    assert rig.opened == [0x50000 + 0x7000000]
    heap = mem.heaps[0]
    assert heap.peers == [0x10300, 0x50000 + 0x7000000 + 0x40] and not heap.owned
    assert list(mem.peer_heaps_array[:2]) == heap.peers
    shift = peer_memory.HEAP_SHIFT
    assert mem.place(_array(0x10300 + 64, 256)) == (1 << shift) | 64
    assert mem.place(_array(0x10300 + 4000, 256)) == 0            # runs past its end
    rig.buffer = 12
    assert mem.place(_array(0x10300 + 64, 256)) == 0              # not the memory registered
    mem.deregister(0x10300)
    assert rig.closed == rig.opened and mem.heaps == [None]
    assert not mem.peer_heaps_array.any() and runtime_freed_nothing(rig)
    assert mem.place(_array(0x10300 + 64, 256)) == 0
    mem.symmetric(256)                                 # the slot again
    assert mem.heaps[0].owned and len(mem.heaps) == 1


def test_an_output_s_place_is_kept_only_until_the_heaps_change(monkeypatch):
    """place() keeps its answers (it is asked on every call; searching the heaps cost 0.6 µs
    a call with five), but a new heap changes them: an output that was outside every heap
    lies in the symmetric allocation made since. (Answers in registered buffers are asked
    of the driver every time: the test above.)"""
    rig = TwoRanks(monkeypatch)
    mem = rig.mem
    first = mem.symmetric(4096)
    later = rig.runtime.next + 4096 + 4096           # where the next allocation will lie
    out = _array(later + 64, 256)
    assert mem.place(out) == 0 and mem.place(out) == 0
    assert mem.symmetric(4096) == later
    assert mem.place(out) == (2 << peer_memory.HEAP_SHIFT) | 64
    assert mem.place(_array(first, 256)) == 1 << peer_memory.HEAP_SHIFT


def runtime_freed_nothing(rig):
    return rig.runtime.freed == []                     # the caller's memory stays the caller's


@pytest.mark.parametrize("who", ["this rank", "its peer", "registered already"])
def test_a_buffer_a_rank_cannot_share_is_refused_on_every_rank_naming_it(monkeypatch, who):
    """Registration is collective: where one rank's buffer cannot be mapped (an allocation
    CUDA IPC cannot export, such as a virtual memory mapping; or one registered already),
    every rank refuses, naming that rank, and nothing is mapped or kept."""
    rig = TwoRanks(monkeypatch, capable=who != "this rank", peer_fails=who == "its peer")
    mem = rig.mem
    if who == "registered already":
        mem.register(0x10000, 1 << 16)
        rig.opened.clear()
    heaps = list(mem.heaps)
    failed = "1" if who == "its peer" else "0"
    with pytest.raises(ValueError, match=f"register_buffer on rank 0: the buffer of rank\\(s\\) "
                                         f"{failed} cannot be mapped"):
        mem.register(0x10300, 4096)
    assert rig.opened == [] and mem.heaps == heaps
    rig.answers = [b"\1"]
    with pytest.raises(ValueError, match="deregister_buffer on rank 0: rank\\(s\\) "
                                         f"{'0, 1' if who != 'registered already' else '1'} "
                                         "have no registered buffer"):
        mem.deregister(0x10000)
    assert rig.closed == []


def test_register_buffer_checks_the_array_before_any_rank_is_asked(monkeypatch):
    """The group's side: what is not a contiguous, non-empty array on this rank's GPU is
    refused naming the operation and the rank, before the collective exchange (a rank that
    raised there would leave the others waiting in it); a good one reaches the memory with
    its pointer and size, and a refusal there comes back as CollectiveError."""
    from collectives.errors import CollectiveError
    from collectives.group import ProcessGroup
    asked = []

    class Memory:
        def register(self, ptr, nbytes):
            asked.append(("register", ptr, nbytes))

        def deregister(self, ptr):
            raise ValueError("deregister_buffer on rank 3: rank(s) 1 have no registered "
                             "buffer starting there; nothing was deregistered")

    class Array(SimpleNamespace):       # stands in for cupy.ndarray
        pass

    def array(ptr=0x1000, nbytes=64, contiguous=True, device=0, shape=(16,)):
        return Array(data=SimpleNamespace(ptr=ptr), nbytes=nbytes, shape=shape,
                     flags=SimpleNamespace(c_contiguous=contiguous),
                     device=SimpleNamespace(id=device))

    def asarray(a):
        assert isinstance(a, Array), "only device memory is viewed (a host array is copied)"
        return a
    executor = SimpleNamespace(memory=Memory(), cupy=SimpleNamespace(asarray=asarray,
                                                                     ndarray=Array))
    group = ProcessGroup.__new__(ProcessGroup)
    group.backend = "nccl"
    group.transport = SimpleNamespace(device=0, rank=3)
    group.executor = SimpleNamespace(peer=executor)
    for bad, error, words in ((array(contiguous=False), ValueError, "contiguous"),
                              (array(nbytes=0, shape=(0,)), ValueError, "not be empty"),
                              (array(device=1), ValueError, "on GPU 1"),
                              ("text", TypeError, "expected a CuPy array"),
                              (np.zeros(4, np.float32), TypeError, "device memory.*ndarray")):
        with pytest.raises(error, match=f"register_buffer on rank 3: .*{words}"):
            group.register_buffer(bad)
    assert asked == []
    group.register_buffer(array())
    assert asked == [("register", 0x1000, 64)]
    with pytest.raises(CollectiveError, match="deregister_buffer on rank 3: rank\\(s\\) 1"):
        group.deregister_buffer(array())


@pytest.mark.parametrize("who", ["this rank", "its peer"])
def test_a_mapping_that_fails_on_one_rank_fails_the_registration_everywhere(monkeypatch, who):
    """Where one rank cannot open a peer's handle, no rank keeps the registration: a rank
    that kept it would tell its senders to write into a buffer they never mapped (or, its
    slots numbered apart from theirs, into another one). Before, the rank that failed raised
    and its peers went on with the buffer registered."""
    rig = TwoRanks(monkeypatch)
    rig.open_fails = who == "this rank"
    rig.answers = [b"\0", b"\1" if who == "its peer" else b"\0"]   # can share; mapped?
    failed = "0" if who == "this rank" else "1"
    with pytest.raises(peer_memory.TransportError,
                       match=f"register_buffer on rank 0: rank\\(s\\) {failed} could not map"):
        rig.mem.register(0x10300, 4096)
    assert rig.closed == rig.opened and rig.mem.heaps == [None]
    assert rig.mem.place(_array(0x10300, 256)) == 0
    rig.open_fails = False
    rig.mem.register(0x10300, 4096)                   # the same slot, on every rank alike
    assert rig.mem.heaps[0] is not None and len(rig.mem.heaps) == 1


def test_a_symmetric_allocation_a_peer_could_not_map_is_given_up_on_every_rank(monkeypatch):
    """The same rule for the group's own memory (symmetric allocations, staging): where a
    peer could not open this rank's handle, this rank closes what it opened, frees its
    allocation and raises naming that peer; the slot stays free, as on the peer."""
    rig = TwoRanks(monkeypatch)
    rig.answers = [b"\1"]                       # the peer's answer after the handles
    with pytest.raises(peer_memory.TransportError,
                       match="symmetric memory on rank 0: rank\\(s\\) 1 could not map"):
        rig.mem.symmetric(4096)
    assert rig.closed == rig.opened and len(rig.runtime.freed) == 1
    assert rig.mem.heaps == [None]


def test_in_place_limit_auto_is_the_measured_limit_of_the_world_size_and_a_value_wins():
    """COLLECTIVES_PEER_IN_PLACE_BYTES=auto (the default) gives 64 MiB on 2 ranks, where one
    pass of reads beat the program's pushes at 16 and 64 MiB, and 8 MiB on more; a value set
    applies to every world size; what the variable may say is checked when it is read."""
    def limit(setting, world):
        return peer_executor.by_world(setting, world, peer_executor.IN_PLACE_AUTO)
    assert settings.PEER_IN_PLACE_BYTES.default == "auto"
    assert limit("auto", 2) == 64 << 20
    assert [limit("auto", n) for n in range(3, 9)] == [8 << 20] * 6
    assert limit(0, 2) == 0 and limit(16 << 20, 4) == 16 << 20
    assert settings.PEER_IN_PLACE_BYTES.parse("AUTO") == "auto"
    assert settings.PEER_IN_PLACE_BYTES.parse("32M") == 32 << 20
    with pytest.raises(ValueError, match="COLLECTIVES_PEER_IN_PLACE_BYTES='fast': expected "
                                         "auto or a number of bytes"):
        settings.PEER_IN_PLACE_BYTES.parse("fast")


def test_copy_engine_limits_auto_are_the_measured_ones_and_a_value_applies_to_both():
    """COLLECTIVES_PEER_COPY_ENGINE_BYTES=auto (the default): a pipelined all_reduce's
    blocks from 64 MiB on 3 or more ranks (ahead on 4 x H100 from 256 MiB calls, behind at
    64 MiB), never on 2 (behind or even there); a direct all_gather never (the program is
    far ahead with symmetric outputs); a value set applies to both, everywhere."""
    limits = peer_executor.copy_engine_limits
    assert settings.PEER_COPY_ENGINE_BYTES.default == "auto"
    assert limits("auto", 2) == {"all_reduce": 0, "all_gather": 0, "all_to_all": 0}
    assert all(limits("auto", n) == {"all_reduce": 64 << 20, "all_gather": 0, "all_to_all": 0}
               for n in range(3, 9))
    assert limits(1 << 20, 2) == dict.fromkeys(("all_reduce", "all_gather", "all_to_all"),
                                               1 << 20)
    assert limits(0, 4) == dict.fromkeys(("all_reduce", "all_gather", "all_to_all"), 0)
    assert settings.PEER_COPY_ENGINE_BYTES.parse("256K") == 256 << 10


def choosing_executor(monkeypatch, in_place):
    """An executor that only chooses (``KernelEntry``s), with the limits of a 4-GPU group
    (pipelined from 16 MiB blocks, send/recv above 32 MiB staged messages), and
    ``kernel(plan, symmetric=False)``: what a float32 call of ``plan`` runs."""
    monkeypatch.setattr(peer_executor, "_Entry", KernelEntry)
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.copy_engine, executor.side = {}, None
    executor._entries, executor.memory, executor.limit, executor.fences = {}, None, 128, 0
    executor.eager, executor.lines, executor.direct = 4 << 20, 256 << 10, True
    executor.most, executor.in_place, executor.pipeline = 32 << 20, in_place, 16 << 20
    executor.copy_engine = {"all_reduce": 16 << 20, "all_gather": 16 << 20,
                            "all_to_all": 16 << 20}
    executor.copy_chunk = 32 << 20

    def kernel(plan, symmetric=False):
        entry = executor._entry(plan, np.dtype(np.float32), None, object(), False, symmetric)
        return getattr(entry, "kernel", "nccl send/recv")
    return executor, kernel


def test_direct_reduce_scatter_of_large_even_blocks_runs_pipelined_and_nothing_else_does(
        monkeypatch):
    """``pipelined_reduce_scatter`` replaces the program for a direct reduce_scatter on 2 to 8
    ranks whose blocks are alike and at least COLLECTIVES_PEER_PIPELINE_BYTES (0: never),
    with at least two thread blocks to split; other plans, uneven blocks, smaller blocks and
    9 ranks keep the program. The kernel's staging covers its pushes: one scratch slot of a
    block per peer."""
    executor, kernel = choosing_executor(monkeypatch, in_place=8 << 20)
    dtype = np.dtype(np.float32)

    assert settings.PEER_PIPELINE_BYTES.default == 16 << 20
    big = 4 << 20                                                 # 16 MiB of float32
    assert kernel(build_plan("reduce_scatter", "direct", 1, 4, (big,) * 4)) == \
        "pipelined_reduce_scatter"
    assert kernel(build_plan("reduce_scatter", "direct", 0, 2, (big,) * 2)) == \
        "pipelined_reduce_scatter"
    assert kernel(build_plan("reduce_scatter", "direct", 7, 8, (big,) * 8)) == \
        "pipelined_reduce_scatter"
    assert kernel(build_plan("reduce_scatter", "direct", 0, 9, (big,) * 9)) == "run_program"
    assert kernel(build_plan("reduce_scatter", "direct", 1, 4, (big - 1,) * 4)) == \
        "run_program"                                             # below the threshold
    assert kernel(build_plan("reduce_scatter", "direct", 1, 4, (big, big, big, big + 4))) == \
        "run_program"                                             # uneven blocks
    for algorithm in ("ring", "recursive_doubling"):
        assert kernel(build_plan("reduce_scatter", algorithm, 1, 4, (big,) * 4)) == \
            "run_program", algorithm
    assert kernel(build_plan("all_reduce", "direct", 1, 4, 4 * big)) == "run_program"
    executor.pipeline = 0
    assert kernel(build_plan("reduce_scatter", "direct", 1, 4, (big,) * 4)) == "run_program"
    assert not peer_executor.pipelined(build_plan("reduce_scatter", "direct", 1, 4, (big,) * 4),
                                       dtype, 16 << 20, 1)      # one block: nothing to split


def test_two_shot_all_reduce_of_large_even_blocks_runs_pipelined_before_leaving_peer_memory(
        monkeypatch):
    """A two_shot all_reduce whose count the ranks divide, blocks of at least
    COLLECTIVES_PEER_PIPELINE_BYTES, runs as ``pipelined_reduce_scatter`` with its gather
    (``pipelined_all_reduce``): it stages nothing, so above COLLECTIVES_PEER_MAX_BYTES it no
    longer goes to NCCL send/recv (0.86 of NCCL's own at 256 MiB-1 GiB on 4 x H100). A call
    that runs in place on symmetric memory keeps that kernel; uneven counts, smaller blocks
    and other algorithms keep the program, or send/recv above the limit."""
    executor, kernel = choosing_executor(monkeypatch, in_place=64 << 20)

    big = 4 << 20                                                 # 16 MiB of float32
    assert kernel(build_plan("all_reduce", "two_shot", 1, 4, 4 * big)) == \
        "pipelined_all_reduce"
    assert kernel(build_plan("all_reduce", "two_shot", 1, 4, 64 * big)) == \
        "pipelined_all_reduce"                                    # 1 GiB
    assert kernel(build_plan("all_reduce", "two_shot", 0, 2, 2 * big)) == \
        "pipelined_all_reduce"
    assert kernel(build_plan("all_reduce", "two_shot", 0, 2, 2 * big), symmetric=True) == \
        "two_shot_in_place"                                       # in place on 2 ranks: 64M
    assert kernel(build_plan("all_reduce", "two_shot", 1, 4, 4 * big - 4)) == "run_program"
    assert kernel(build_plan("all_reduce", "two_shot", 1, 4, 16 * big + 1)) == \
        "nccl send/recv"                                          # uneven, over the limit
    assert kernel(build_plan("all_reduce", "ring", 1, 4, 16 * big)) == "nccl send/recv"
    # recursive doubling's all_reduce is two_shot's schedule on 2 ranks (untuned auto's pick
    # there from 64 MiB), not on 4
    assert kernel(build_plan("all_reduce", "recursive_doubling", 1, 2, 2 * big)) == \
        "pipelined_all_reduce"
    # called out of place, the group passes the plan that reads input first (the kernel
    # reads input itself): the same schedule
    assert kernel(read_input_first(build_plan("all_reduce", "recursive_doubling", 1, 2,
                                              2 * big), 2 * big)) == "pipelined_all_reduce"
    assert kernel(build_plan("all_reduce", "recursive_doubling", 1, 4, 16 * big)) == \
        "nccl send/recv"
    executor.pipeline = 0
    assert kernel(build_plan("all_reduce", "two_shot", 1, 4, 16 * big)) == "nccl send/recv"


class NeverDone:
    """A stand-in for CuPy around one NCCL all_gather that never completes: some rank did
    not make the call, so its handle never comes."""

    def __init__(self):
        event = SimpleNamespace(done=False)
        stream = SimpleNamespace(record=lambda: event, ptr=7)

        class Stream:
            def __init__(self, non_blocking=False):
                self.ptr = 7

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False
        self.cuda = SimpleNamespace(Device=lambda d: contextlib.nullcontext(), Stream=Stream,
                                    get_current_stream=lambda: stream)
        self.asarray = lambda a: SimpleNamespace(data=SimpleNamespace(ptr=1))
        self.empty = lambda n, dtype: SimpleNamespace(data=SimpleNamespace(ptr=2))


def nccl_transport_that_never_completes(rank=1):
    from collectives.transports import nccl
    transport = nccl.NcclTransport.__new__(nccl.NcclTransport)
    transport.xp, transport.rank, transport.size, transport.device = NeverDone(), rank, 2, 0
    transport.timeout, transport._aborted = 1800.0, False
    aborted = []
    transport.comm = SimpleNamespace(allGather=lambda *a: None, check_async_error=lambda: None,
                                     abort=lambda: aborted.append(True))
    transport._release = lambda: None
    return transport, aborted


def test_the_nccl_transport_raises_what_an_executor_s_error_check_reports():
    """The peer executor's error words reach ``synchronize`` through a hook the transport
    offers (``add_error_check``), run after NCCL's own check, each check once; the transport
    reads nothing of the executor. ``aborted`` is the public word the executor's release
    reads."""
    from collectives.errors import TransportError
    transport, _ = nccl_transport_that_never_completes(rank=1)
    transport.nccl = SimpleNamespace(NcclError=RuntimeError)
    seen = []

    def check(operation):
        seen.append(operation)
        if operation == "second":
            raise TransportError(f"{operation} on rank 1: a kernel reported")
    transport.add_error_check(check)
    transport.add_error_check(check)
    transport._check_async("first")
    with pytest.raises(TransportError, match="second on rank 1: a kernel reported"):
        transport._check_async("second")
    assert seen == ["first", "second"]
    assert not transport.aborted
    transport._abort()
    assert transport.aborted


def test_an_exchange_a_rank_never_joins_ends_at_the_call_s_timeout_naming_it():
    """The group's peer memory grows by an all_gather of memory handles over NCCL. A rank
    that skipped a call which grows it held every other rank in that all_gather for ever (a
    killed GPU test, 130 s, on 2 and 4 x H100): the wait is bounded by the call's timeout
    now, ends with CollectiveTimeout naming the operation and the rank, and aborts the
    communicator (the all_gather cannot be withdrawn)."""
    import threading
    from collectives.errors import CollectiveTimeout
    transport, aborted = nccl_transport_that_never_completes(rank=1)
    caught = []

    def grow():
        try:
            peer_memory._all_gather(transport, b"handle", "reduce_scatter", 0.2)
        except Exception as exc:       # noqa: BLE001 (what it raised is the test)
            caught.append(exc)
    waiter = threading.Thread(target=grow, daemon=True)
    waiter.start()
    waiter.join(10.0)
    assert not waiter.is_alive(), "the exchange still waits for the rank that never called"
    assert len(caught) == 1 and isinstance(caught[0], CollectiveTimeout), caught
    assert "reduce_scatter on rank 1" in str(caught[0]) and "0.2 s" in str(caught[0])
    assert aborted == [True]


def test_handles_and_the_peers_addresses_reach_the_device_on_streams_of_their_own(
        monkeypatch):
    """The handle exchange copied its blob to the device on the caller's current stream and
    ran the all_gather on a stream of its own, unordered with it: behind long work the
    caller had queued (a bench's 256 MiB fills), the all_gather read the send buffer before
    the blob reached it, and every rank of a 4 x H100 bench failed to map a 256 MiB symmetric
    allocation (cudaErrorInvalidValue; a stale handle of an allocation already open would
    have mapped the wrong memory). Now the copy in, the all_gather and the copy out run on
    one stream, in that order; and the zeroing of new memory and the table of the peers'
    addresses, which kernels on any stream read, are written on a stream finished before
    the call returns."""
    Stream.log.clear()
    caller = Stream()

    class Array:
        def __init__(self, what):
            Stream.log.append((what, Stream.current.ptr))
            self.data = SimpleNamespace(ptr=1)

        def get(self):
            Stream.log.append(("copy out", Stream.current.ptr))
            return np.zeros(8, np.uint8)
    cupy = SimpleNamespace(cuda=SimpleNamespace(Device=lambda d: contextlib.nullcontext(),
                                                Stream=Stream),
                           asarray=lambda a: Array("copy in"),
                           empty=lambda n, dtype: Array("receive buffer"))
    comm = SimpleNamespace(allGather=lambda *a: Stream.log.append(("all_gather", a[-1])))
    transport = SimpleNamespace(
        xp=cupy, device=0, size=2, rank=0, timeout=5.0, comm=comm,
        synchronize=lambda *a: Stream.log.append(("waited", Stream.current.ptr)))
    with caller:                                  # the caller's stream, busy
        peer_memory._all_gather(transport, b"handle")
    streams = {ptr for _, ptr in Stream.log}
    assert len(streams) == 1 and caller.ptr not in streams, Stream.log
    assert [what for what, _ in Stream.log] == ["copy in", "receive buffer", "all_gather",
                                                "waited", "copy out"]

    mem, runtime = memory(monkeypatch)
    Stream.log.clear()
    mem.cupy.asarray = lambda a: (Stream.log.append(("upload", Stream.current.ptr)),
                                  np.asarray(a))[1]
    runtime.memsetAsync = lambda ptr, value, n, stream: Stream.log.append(("zero", stream))
    with caller:
        mem.symmetric(4096)
    assert [what for what, _ in Stream.log] == ["zero", "synchronized", "upload",
                                                "synchronized", "upload", "synchronized"]
    assert all(ptr != caller.ptr for _, ptr in Stream.log)
    assert [ptr for what, ptr in Stream.log if what != "synchronized"] == \
        [ptr for what, ptr in Stream.log if what == "synchronized"]


def test_memory_whose_growth_failed_keeps_no_freed_pointer_and_fails_the_group(monkeypatch):
    """A growth whose exchange fails (timeout, or a rank that cannot map) had already freed
    the old area and recorded the new capacity, so the next call found its memory "big
    enough" and ran on a freed pointer. Now the area is forgotten before its allocation, and
    the executor refuses every later call with the same error."""
    from collectives.errors import CollectiveTimeout
    mem, runtime = memory(monkeypatch)
    mem.ensure(256, 256, 256)
    old = mem.data_ptr

    def timed_out(transport, blob, what="peer memory", timeout=None):
        raise CollectiveTimeout(f"{what} on rank 0: waited {timeout} s")
    monkeypatch.setattr(peer_memory, "_all_gather", timed_out)
    with pytest.raises(CollectiveTimeout, match="all_gather on rank 0: waited 5.0 s"):
        mem.ensure(8 << 20, 256, 256, "all_gather", 5.0)
    assert runtime.freed[-1] == old and runtime.freed.count(old) == 1
    assert (mem.data_ptr, mem.capacity, mem.peer_data) == (0, 0, [])

    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)

    executor.copy_engine, executor.side = {}, None
    executor.failed, executor.memory = None, mem
    entry = SimpleNamespace(staging=16 << 20, inbox=256, lines=256, place=lambda m: None)
    stream = SimpleNamespace(is_capturing=lambda: False)
    with pytest.raises(CollectiveTimeout, match="all_gather on rank 0: waited 3.0 s"):
        executor._fit(entry, stream, "all_gather", 0, 3.0)
    assert isinstance(executor.failed, CollectiveTimeout)
    with pytest.raises(CollectiveTimeout):
        executor(build_plan("all_gather", "direct", 0, 2, (4, 4)), None, {}, dtype=np.float32)


def test_direct_all_gather_or_all_to_all_of_large_even_blocks_is_the_copy_engines():
    """``copied``: a direct all_gather or all_to_all (or a plan that is its schedule) on 2 to
    8 ranks whose every block is alike and at least COLLECTIVES_PEER_COPY_ENGINE_BYTES; not 9 ranks,
    uneven blocks, smaller ones, other collectives or schedules, or the setting 0."""
    f32, big = np.dtype(np.float32), 16 << 20                     # 64 MiB of float32
    least = 64 << 20

    def copied(collective, algorithm, p, args, least=least):
        return peer_executor.copied(build_plan(collective, algorithm, 1, p, args), f32, least)
    assert all(copied("all_gather", "direct", p, (big,) * p) for p in range(2, 9))
    assert not copied("all_gather", "direct", 9, (big,) * 9)
    assert not copied("all_gather", "direct", 4, (big, big, big, big - 4))
    assert not copied("all_gather", "direct", 4, (big - 1,) * 4)
    assert not copied("all_gather", "direct", 4, (big,) * 4, least=0)
    assert not copied("all_gather", "ring", 4, (big,) * 4)
    assert copied("all_gather", "recursive_doubling", 2, (big,) * 2)   # direct's on 2 ranks
    assert not copied("all_reduce", "direct", 4, 4 * big)
    assert not copied("reduce_scatter", "direct", 4, (big,) * 4)
    even = lambda p, n=big: ((n,) * p,) * p                       # noqa: E731
    assert all(copied("all_to_all", "direct", p, even(p)) for p in range(2, 9))
    assert not copied("all_to_all", "direct", 9, even(9))
    assert not copied("all_to_all", "direct", 3, even(3)[:2] + ((big, big, big - 4),))
    assert not copied("all_to_all", "direct", 4, even(4, big - 1))
    assert not copied("all_to_all", "direct", 4, even(4), least=0)
    assert not copied("all_to_all", "ring", 4, even(4))


def test_all_gathers_take_the_copy_engines_whatever_the_outputs_once_a_value_is_set(
        monkeypatch):
    """With COLLECTIVES_PEER_COPY_ENGINE_BYTES set (16 MiB here), a direct all_gather of alike
    blocks from that size runs with the copy engines, with a symmetric output too (every
    rank must run it alike) and above COLLECTIVES_PEER_MAX_BYTES; smaller blocks and other
    schedules keep the program. Under auto (all_gather: 0) it never does: the pipelined
    kernel runs such blocks."""
    executor, kernel = choosing_executor(monkeypatch, in_place=8 << 20)
    big = 4 << 20                                                 # 16 MiB of float32
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big,) * 4)) == "copies_all_gather"
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big,) * 4), symmetric=True) == \
        "copies_all_gather"
    assert kernel(build_plan("all_gather", "direct", 1, 4, (4 * big,) * 4)) == \
        "copies_all_gather"                                       # 64 MiB blocks: over
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big - 1,) * 4)) == "run_program"
    assert kernel(build_plan("all_gather", "ring", 1, 4, (big,) * 4)) == "run_program"
    for n, runs in ((big, "copies_all_to_all"), (4 * big, "copies_all_to_all"),
                    (big - 1, "run_program")):
        assert kernel(build_plan("all_to_all", "direct", 1, 4, ((n,) * 4,) * 4)) == runs
        assert kernel(build_plan("all_to_all", "direct", 1, 4, ((n,) * 4,) * 4),
                      symmetric=True) == runs
    executor._entries.clear()
    executor.copy_engine = peer_executor.copy_engine_limits("auto", 4)
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big,) * 4)) == \
        "pipelined_all_gather"
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big // 2,) * 4)) == "run_program"


def test_direct_all_gathers_and_all_to_alls_of_large_alike_blocks_run_pipelined_at_any_size(
        monkeypatch):
    """A direct all_gather or all_to_all on 2 to 8 ranks whose blocks are alike and at least
    COLLECTIVES_PEER_PIPELINE_BYTES runs as ``pipelined_reduce_scatter`` (kinds 3, 4),
    whatever this rank's output (every rank must run it alike; a symmetric output only
    changes where peers push), and above COLLECTIVES_PEER_MAX_BYTES too: nothing is staged
    on the way out, the copy-out runs beside the pushes (4 x H100: all_gather 1.06-1.09 of
    NCCL's own at 64 MiB-1 GiB where the program or send/recv reached 0.97-1.02). Uneven
    blocks, smaller blocks, other schedules and 9 ranks keep the program below the limit,
    NCCL send/recv above it; with the setting 0, as before."""
    executor, kernel = choosing_executor(monkeypatch, in_place=8 << 20)
    executor.copy_engine = peer_executor.copy_engine_limits("auto", 4)
    big = 4 << 20                                                 # 16 MiB of float32
    even = lambda p, n=big: ((n,) * p,) * p                       # noqa: E731
    for n in (big, 4 * big, 64 * big):                            # 16 MiB, 64 MiB, 1 GiB
        for symmetric in (False, True):
            assert kernel(build_plan("all_gather", "direct", 1, 4, (n,) * 4), symmetric) == \
                "pipelined_all_gather", (n, symmetric)
            assert kernel(build_plan("all_to_all", "direct", 1, 4, even(4, n)), symmetric) \
                == "pipelined_all_to_all", (n, symmetric)
    assert kernel(build_plan("all_gather", "direct", 0, 2, (big,) * 2)) == \
        "pipelined_all_gather"
    assert kernel(build_plan("all_to_all", "direct", 7, 8, even(8))) == "pipelined_all_to_all"
    assert kernel(build_plan("all_gather", "recursive_doubling", 1, 2, (big,) * 2)) == \
        "pipelined_all_gather"                                    # direct's schedule on 2
    assert kernel(build_plan("all_gather", "direct", 0, 9, (big,) * 9)) == "run_program"
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big - 1,) * 4)) == "run_program"
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big, big, big, big + 4))) == \
        "run_program"                                             # uneven blocks
    assert kernel(build_plan("all_gather", "direct", 1, 4, (16 * big, 16 * big, 16 * big,
                                                            16 * big + 4))) == \
        "nccl send/recv"                                          # uneven, over the limit
    assert kernel(build_plan("all_to_all", "direct", 1, 3, even(3)[:2] + (
        (big, big, big - 4),))) == "run_program"
    assert kernel(build_plan("all_gather", "ring", 1, 4, (big,) * 4)) == "run_program"
    assert kernel(build_plan("all_to_all", "ring", 1, 4, even(4, 16 * big))) == \
        "nccl send/recv"
    executor.pipeline = 0
    assert kernel(build_plan("all_gather", "direct", 1, 4, (big,) * 4)) == "run_program"
    assert kernel(build_plan("all_to_all", "direct", 1, 4, even(4, 16 * big))) == \
        "nccl send/recv"
