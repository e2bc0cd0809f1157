"""The compiled repeat path of peer-memory groups (executors/_peer_lane.pyx) on the CPU: a
ProcessGroup of 2 ranks (this process is rank 0) over a stand-in transport, whose executor is
the real PeerExecutor over stand-in memory and CuPy; the driver's launch is a recorder. What
matters: a repeated call launches from the lane with exactly the kernel parameters the
Python path gives the same call, advances the call sequence alike, and every case the lane
does not own (odd buffers, overlap, another stream, moved memory, a reported error, a
concurrent caller, another executor) reaches the Python path, which handles or refuses it."""
import ctypes
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from collectives import executors
from collectives.executors import peer as peer_executor
from collectives.transports import peer as peer_memory
from collectives.group import ConcurrentCalls, ProcessGroup

lane_module = pytest.importorskip("collectives.executors._peer_lane",
                                  reason="the compiled repeat path is not built")

from test_peer_host_side import memory  # noqa: E402  (tests/local, beside this file)

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                          ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)


class LaunchAttribute(ctypes.Structure):     # cuda.h's CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):        # cuda.h's CUlaunchConfig
    _fields_ = [(name, ctypes.c_uint) for name in ("grid_x", "grid_y", "grid_z", "block_x",
                                                   "block_y", "block_z", "shared")] + \
               [("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)),
                ("n_attrs", ctypes.c_uint)]


class DeviceArray:
    """Stands in for cupy.ndarray: ``size`` elements at a device address."""

    def __init__(self, ptr, size, dtype=np.float32, ndim=1, contiguous=True):
        self.data = SimpleNamespace(ptr=ptr)
        self.dtype, self.size, self.ndim = np.dtype(dtype), size, ndim
        self.itemsize = self.dtype.itemsize
        self.nbytes = size * self.itemsize
        self.flags = SimpleNamespace(c_contiguous=contiguous)
        self._c_contiguous = contiguous                 # as CuPy's: the lane reads this
        self.copied_from = None

    def __setitem__(self, index, other):          # output[...] = input: the copy, recorded
        self.copied_from = other


class Stream:
    def __init__(self, ptr):
        self.ptr, self.waited = ptr, []

    def wait_event(self, event):
        self.waited.append(event)

    def record(self):
        return ("event", self.ptr)

    def is_capturing(self):
        return False


class Rig:
    """The group, its executor, and every launch of either path, as (path, function, blocks,
    stream, the values of all the kernel's parameters)."""

    def __init__(self, monkeypatch, lane=True, overlap=False):
        monkeypatch.setenv("COLLECTIVES_PEER_LANE", "1" if lane else "0")
        mem, _ = memory(monkeypatch)
        mem.size = 2
        mem.layout, mem.last_stream = object(), None
        self.words = (ctypes.c_int32 * 4)()
        mem.words = self.words
        mem.flags_ptr, mem.error_ptr = 77, 88
        mem.peer_flags_array = SimpleNamespace(data=SimpleNamespace(ptr=66))
        mem.peer_heaps_array = SimpleNamespace(data=SimpleNamespace(ptr=44))
        mem.cupy.asarray = lambda a: SimpleNamespace(data=SimpleNamespace(ptr=1000 + len(a)))
        monkeypatch.setattr(peer_executor.cuda_peer, "program_kernel", lambda *a: SimpleNamespace(
            kernel=SimpleNamespace(ptr=4242)))
        uploads = iter(range(9000, 1 << 30, 4096))      # each device copy an address of its own
        monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(
            asarray=lambda a: SimpleNamespace(data=SimpleNamespace(ptr=next(uploads)))))
        self.stream = Stream(5)
        streams = self
        executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
        executor.copy_engine, executor.side = {}, None
        executor.failed, executor._entries, executor.memory = None, {}, mem
        executor.limit, executor.eager, executor.lines, executor.fences = 4, 1 << 20, 1 << 16, 0
        executor.most, executor.direct, executor.in_place, executor.pipeline = 0, False, 0, 0
        executor.transport, executor.agreed = SimpleNamespace(rank=0), {}
        executor.cupy = SimpleNamespace(cuda=SimpleNamespace(
            get_current_stream=lambda: streams.stream))
        self.executor, self.memory = executor, mem
        self.launches = []

        def entry_of(params):
            return next(e for _, e in executor._entries.values()
                        if getattr(e, "params", None) == params)

        def python_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            self.launches.append(("python", function, gx, bx, stream,
                                  [v.value for v in entry_of(params).values]))

        def lane_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            self.launches.append(("lane", function, gx, bx, stream or 0,
                                  [v.value for v in entry_of(params).values]))
            return 0
        monkeypatch.setattr(peer_executor, "_launch", python_launch)
        self.recorder = LAUNCH(lane_launch)           # kept alive as long as the rig
        monkeypatch.setattr(peer_executor, "launch_address",
                            lambda: ctypes.cast(self.recorder, ctypes.c_void_p).value)

        def lane_launch_ex(config, function, params, extra):
            c = LaunchConfig.from_address(config)
            attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.n_attrs)]
            self.launches.append(("lane", function, c.grid_x, c.block_x, c.stream or 0,
                                  [v.value for v in entry_of(params).values],
                                  (c.grid_y, c.grid_z, c.block_y, c.block_z, c.shared, attrs)))
            return 0
        self.recorder_ex = LAUNCH_EX(lane_launch_ex)
        monkeypatch.setattr(peer_executor, "launch_ex_address", lambda: ctypes.cast(
            self.recorder_ex, ctypes.c_void_p).value if overlap else 0)
        xp = SimpleNamespace(__name__="cupy", ndarray=DeviceArray)
        transport = SimpleNamespace(rank=0, size=2, xp=xp, max_tag=None, name="nccl",
                                    native=None, device=0, carries_signatures=False,
                                    offers=())
        monkeypatch.setattr(executors, "select", lambda transport: executors.Executor(
            executor, executor.model_name, peer=executor))
        monkeypatch.setattr(ProcessGroup, "_agree", lambda group, table: None)  # one process
        self.group = ProcessGroup(transport, backend="nccl", timeout=60.0)

    def call(self, collective, input, output, **kw):
        self.group.prepare(collective, input=input, output=output, **kw)()
        return self.launches[-1]


def same_launch(a, b):
    return a[1:] == b[1:]


@pytest.mark.parametrize("case", ["out_of_place", "in_place", "no_input"])
def test_a_repeated_all_reduce_launches_from_the_lane_as_the_python_path_would(monkeypatch,
                                                                                 case):
    rig = Rig(monkeypatch)
    out = DeviceArray(0x20000, 1024)
    inp = {"out_of_place": DeviceArray(0x10000, 1024), "in_place": out, "no_input": None}[case]
    first = rig.call("all_reduce", inp, out, algorithm="direct")
    again = rig.call("all_reduce", inp, out, algorithm="direct")
    assert (first[0], again[0]) == ("python", "lane") and same_launch(first, again)
    values = again[5]
    assert values[3] == (0x10000 if case == "out_of_place" else 0)     # input read, or none
    assert values[6] == 0x20000 and values[20] == 0
    rig.group._lane = None                                    # the Python path, same call
    assert same_launch(rig.call("all_reduce", inp, out, algorithm="direct"), again)


def test_each_call_gets_its_own_buffers_and_the_sequence_advances_alike(monkeypatch):
    rig = Rig(monkeypatch)
    group = rig.group
    rig.call("all_gather", DeviceArray(0x1000, 256), DeviceArray(0x9000, 512), algorithm="ring")
    for i in range(1, 4):
        before = group._sequence
        got = rig.call("all_gather", DeviceArray(0x1000 * (i + 1), 256),
                       DeviceArray(0x9000 * (i + 1), 512), algorithm="ring")
        assert got[0] == "lane" and group._sequence == before + 1
        assert (got[5][3], got[5][6]) == (0x1000 * (i + 1), 0x9000 * (i + 1))
    assert group._lane.launched == 3


def test_calls_of_alternating_shapes_each_launch_their_own_program(monkeypatch):
    """The lane compares a call with the previous one field by field before it builds and
    hashes the key: calls that alternate sizes, dtypes or algorithms each still launch the
    program the Python path gave their own shape, never the previous call's."""
    rig = Rig(monkeypatch)
    shapes = [(1024, np.float32, "direct"), (2048, np.float32, "direct"),
              (1024, np.int32, "direct"), (1024, np.float32, "ring")]
    first = {}
    for n, dtype, algorithm in shapes:
        first[(n, dtype, algorithm)] = rig.call(
            "all_reduce", DeviceArray(0x10000, n, dtype), DeviceArray(0x90000, n, dtype),
            algorithm=algorithm)
        assert first[(n, dtype, algorithm)][0] == "python"
    assert len({launch[5][0] for launch in first.values()}) == len(shapes)   # four programs
    for n, dtype, algorithm in shapes * 2 + shapes[::-1]:
        got = rig.call("all_reduce", DeviceArray(0x10000, n, dtype),
                       DeviceArray(0x90000, n, dtype), algorithm=algorithm)
        assert got[0] == "lane" and same_launch(got, first[(n, dtype, algorithm)])


def test_out_of_place_all_reduce_runs_the_read_input_first_plan_and_in_place_the_plain_one(
        monkeypatch):
    """Two plans of one shape: the one that reads input (out of place) and the one that
    runs on output alone (the same memory): each its own executor entry, as in Python."""
    rig = Rig(monkeypatch)
    out = DeviceArray(0x20000, 1024)
    a = rig.call("all_reduce", DeviceArray(0x10000, 1024), out, algorithm="ring")
    b = rig.call("all_reduce", out, out, algorithm="ring")
    c = rig.call("all_reduce", DeviceArray(0x30000, 1024), out, algorithm="ring")
    d = rig.call("all_reduce", out, out, algorithm="ring")
    assert [x[0] for x in (a, b, c, d)] == ["python", "python", "lane", "lane"]
    assert c[5][:3] == a[5][:3] and d[5][:3] == b[5][:3] and a[5][0] != b[5][0]  # programs
    assert (c[5][3], d[5][3]) == (0x30000, 0)


@pytest.mark.parametrize("odd", ["two_d", "strided", "partial_overlap", "wrong_type"])
def test_what_the_lane_does_not_own_takes_the_python_path(monkeypatch, odd):
    rig = Rig(monkeypatch)
    out = DeviceArray(0x20000, 1024)
    rig.call("all_reduce", DeviceArray(0x10000, 1024), out, algorithm="direct")
    inp = {"two_d": DeviceArray(0x10000, 1024, ndim=2),
           "strided": DeviceArray(0x10000, 1024, contiguous=False),
           "partial_overlap": DeviceArray(0x20000 + 64, 1024),
           "wrong_type": SimpleNamespace(dtype=np.dtype(np.float32), size=1024, ndim=1)}[odd]
    count = len(rig.launches)
    if odd == "partial_overlap":      # the Python path copies input into output first, then
        got = rig.call("all_reduce", inp, out, algorithm="direct")   # runs on output alone
        assert out.copied_from is inp and got[0] == "python" and got[5][3] == 0
        assert len(rig.launches) == count + 1
    else:
        with pytest.raises((TypeError, ValueError), match="all_reduce on rank 0"):
            rig.call("all_reduce", inp, out, algorithm="direct")
        assert len(rig.launches) == count
    assert rig.group._lane.launched == 0


def test_another_stream_a_moved_memory_and_a_new_timeout_go_through_python(monkeypatch):
    rig = Rig(monkeypatch)
    inp, out = DeviceArray(0x10000, 1024), DeviceArray(0x20000, 1024)
    rig.call("all_reduce", inp, out, algorithm="direct")
    assert rig.call("all_reduce", inp, out, algorithm="direct")[0] == "lane"
    rig.stream = Stream(6)                         # the next call orders after the last one
    got = rig.call("all_reduce", inp, out, algorithm="direct")
    assert got[0] == "python" and got[4] == 6 and rig.stream.waited
    assert rig.call("all_reduce", inp, out, algorithm="direct")[0] == "lane"
    before = got[5][5]
    rig.memory.ensure(1 << 24)                     # the staging memory moves
    got = rig.call("all_reduce", inp, out, algorithm="direct")
    assert got[0] == "python" and got[5][5] == rig.memory.data_ptr != before
    assert rig.call("all_reduce", inp, out, algorithm="direct")[0] == "lane"
    # one plan under two timeouts: the entry's deadline set by Python on every change
    got = rig.call("all_reduce", inp, out, algorithm="direct", timeout=2.0)
    assert got[0] == "python" and got[5][15] == int(2e9)
    got = rig.call("all_reduce", inp, out, algorithm="direct")
    assert got[0] == "python" and got[5][15] == int(60e9)
    assert rig.call("all_reduce", inp, out, algorithm="direct")[0] == "lane"


def test_a_reported_error_raises_from_the_python_path_and_nothing_launches(monkeypatch):
    rig = Rig(monkeypatch)
    inp, out = DeviceArray(0x10000, 1024), DeviceArray(0x20000, 1024)
    rig.call("all_reduce", inp, out, algorithm="direct")
    rig.words[0], rig.words[1], rig.words[2] = 1, 0, 1          # a timeout waiting for rank 1
    count = len(rig.launches)
    with pytest.raises(peer_executor.CollectiveTimeout, match="rank 0: timed out .* rank 1"):
        rig.call("all_reduce", inp, out, algorithm="direct")
    with pytest.raises(peer_executor.CollectiveTimeout):          # and every later call
        rig.call("all_reduce", inp, out, algorithm="direct")
    assert len(rig.launches) == count


def test_a_second_thread_inside_a_call_is_refused_as_on_the_python_path(monkeypatch):
    rig = Rig(monkeypatch)
    group = rig.group
    inp, out = DeviceArray(0x10000, 1024), DeviceArray(0x20000, 1024)
    rig.call("all_reduce", inp, out, algorithm="direct")
    aborted = []
    group.transport.abort = lambda *a, **k: aborted.append(True)
    inside, done = threading.Event(), threading.Event()

    def hold():
        took = group._enter("broadcast")
        inside.set()
        done.wait(10)
        group._leave(took)
    t = threading.Thread(target=hold)
    t.start()
    inside.wait(10)
    try:
        with pytest.raises(ConcurrentCalls, match="all_reduce"):
            rig.call("all_reduce", inp, out, algorithm="direct")
    finally:
        done.set()
        t.join()


def test_a_copy_of_the_group_with_another_executor_never_uses_the_lane(monkeypatch):
    """The bench's and peer_check's send/recv twin: the group's __dict__ copied, its
    executor swapped. Its calls must reach its own executor."""
    rig = Rig(monkeypatch)
    inp, out = DeviceArray(0x10000, 1024), DeviceArray(0x20000, 1024)
    rig.call("all_reduce", inp, out, algorithm="direct")
    twin = ProcessGroup.__new__(ProcessGroup)
    twin.__dict__.update(rig.group.__dict__)
    ran = []
    twin.execute = lambda plan, transport, buffers, *a, **k: ran.append(plan)
    twin.prepare("all_reduce", input=inp, output=out, algorithm="direct")()
    assert len(ran) == 1 and rig.group._lane.launched == 0


def test_avg_and_the_lane_switched_off_stay_on_the_python_path(monkeypatch):
    rig = Rig(monkeypatch)
    out = DeviceArray(0x20000, 1024)
    finished = []
    monkeypatch.setattr(rig.group, "_finish", lambda *a: finished.append(a))
    for _ in range(3):
        assert rig.call("all_reduce", out, out, algorithm="direct", op="avg")[0] == "python"
    assert len(finished) == 3
    off = Rig(monkeypatch, lane=False)
    assert off.group._lane is None
    for _ in range(2):
        assert off.call("all_reduce", out, out, algorithm="direct")[0] == "python"


def test_with_overlap_the_lane_launches_the_same_kernel_allowed_to_start_early(monkeypatch):
    """COLLECTIVES_PEER_OVERLAP: the lane launches through cuLaunchKernelEx with programmatic
    stream serialization (attribute 6, value 1), the same function, grid, block and
    parameters the Python path gives the same call, on the caller's stream."""
    rig = Rig(monkeypatch, overlap=True)
    inp, out = DeviceArray(0x10000, 1024), DeviceArray(0x20000, 1024)
    first = rig.call("all_reduce", inp, out, algorithm="two_shot")
    again = rig.call("all_reduce", inp, out, algorithm="two_shot")
    assert (first[0], again[0]) == ("python", "lane") and first[1:6] == again[1:6]
    assert again[6] == (1, 1, 1, 1, 0, [(6, 1)])


def copy_engine_rig(monkeypatch):
    """A rig whose executor gathers with the copy engines from 1 MiB blocks, rank 1's memory
    mapped here at an address of its own, and every kernel's code as uploaded; the copies
    recorded among the launches as ("copy", dst, src, bytes, kind, stream), the side
    stream's events as ("event", ...)."""
    rig = Rig(monkeypatch)
    executor, mem = rig.executor, rig.memory
    executor.pipeline = 256
    executor.copy_engine = {"all_reduce": 1 << 20, "all_gather": 1 << 20,
                            "all_to_all": 1 << 20}
    monkeypatch.setattr(peer_memory, "_all_gather", lambda transport, blob, *how: [blob] * 2)
    mem.cupy.cuda.runtime.ipcOpenMemHandle = lambda handle, flags: \
        int.from_bytes(handle, "little") + (1 << 40)
    rig.uploaded, addresses = {}, iter(range(1 << 32, 1 << 33, 4096))

    def upload(a):
        ptr = next(addresses)
        rig.uploaded[ptr] = np.array(a)
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(asarray=upload))
    monkeypatch.setattr(peer_executor.cuda_peer, "pipelined_kernel", lambda *a: SimpleNamespace(
        kernel=SimpleNamespace(ptr=4343)))
    monkeypatch.setattr(peer_executor.cuda_peer, "copies_kernel", lambda *a: SimpleNamespace(
        kernel=SimpleNamespace(ptr=4444)))

    class SideStream(Stream):
        def wait_event(self, event):
            rig.launches.append(("side waits", event))

        def record(self):
            return ("event", self.ptr)
    executor.cupy.cuda.runtime = SimpleNamespace(
        memcpyDefault=4, memcpyAsync=lambda *a: rig.launches.append(("copy",) + a))
    executor.cupy.cuda.Stream = lambda non_blocking: SideStream(7)
    return rig


def test_a_large_pipelined_all_reduce_is_two_launches_with_a_copy_per_peer_between(
        monkeypatch):
    """A two_shot all_reduce run pipelined whose rank's block reaches
    COLLECTIVES_PEER_COPY_ENGINE_BYTES: the kernel launched with the program's blocks and
    gather 2, then the peer's reduced block (after the p - 1 scratch slots of its staging
    memory) copied by the copy engines into its place in the output, on the caller's
    stream, then copies_around's end (one block, mode 1, message 2 chunks + 1), and the
    entry's code as before; every call so, the lane leaving such calls to Python. A block
    below the threshold, or the setting 0: one launch, gather 1, from the lane when
    repeated."""
    rig = copy_engine_rig(monkeypatch)
    executor, mem, uploaded = rig.executor, rig.memory, rig.uploaded
    threads = peer_executor.cuda_peer.THREADS
    block = 1 << 20                                  # bytes of each rank's block
    inp, out = DeviceArray(1 << 24, block // 2), DeviceArray(2 << 24, block // 2)

    def code(launch):                                # the kernel's code as launched
        return uploaded[launch[5][0]].tolist()
    for call in range(3):
        count = len(rig.launches)
        rig.call("all_reduce", inp, out, algorithm="two_shot")
        first, copy, second = rig.launches[count:]
        peer = mem.peer_data[1]
        assert peer == mem.data_ptr + (1 << 40)
        assert first[:2] == ("python", 4343) and first[2] > 1 and first[3] == threads
        count_, chunks, pushers, gather = code(first)
        assert gather == 2 and code(second) == [0, 1, 2 * chunks + 1]
        assert copy == ("copy", (2 << 24) + block, peer + block, block, 4, 5), call
        assert second[:5] == ("python", 4444, 1, threads, 5)
        entry = next(e for _, e in executor._entries.values())
        assert entry.values[0].value == first[5][0]  # the first launch's code again

    small = DeviceArray(3 << 24, block // 2 - 8)      # blocks 16 bytes below the threshold
    gathered = [rig.call("all_reduce", small, small, algorithm="two_shot") for _ in range(2)]
    assert [g[0] for g in gathered] == ["python", "lane"]
    assert [code(g)[3] for g in gathered] == [1, 1] and rig.launches[-1] is gathered[-1]
    executor.copy_engine, executor.side = {}, None
    executor._entries.clear()
    rig.group._lane.clear()
    got = rig.call("all_reduce", inp, out, algorithm="two_shot")
    assert code(got)[3] == 1 and rig.launches[-2][0] != "copy"


@pytest.mark.parametrize("chunk", [1 << 18, 1 << 20], ids=["4 chunks", "1 chunk"])
@pytest.mark.parametrize("collective", ["all_gather", "all_to_all"])
def test_a_large_direct_all_gather_or_all_to_all_is_staged_beside_and_copied_chunk_by_chunk(
        monkeypatch, collective, chunk):
    """A direct all_gather or all_to_all whose every block reaches
    COLLECTIVES_PEER_COPY_ENGINE_BYTES: on a side stream that waits for the caller's,
    copies_around's mode 0 with the program's blocks (the block's bytes, its chunks of
    COLLECTIVES_PEER_COPY_CHUNK_BYTES, one piece: an all_gather's input into the start of
    staging memory, an all_to_all's block for rank 1 into slot 0; then rank 0's own block,
    from the input into the output); on the caller's stream, for each chunk, a one-block
    wait (mode 2: message k + 1 from the stager's blocks) and the chunk of the peer's block
    (the start of its staging memory: this rank's slot there is 0 too) copied into its
    place in the output; the side stream joined; copies_around's end (mode 1, message chunks
    + 1). In one chunk too: the copies once ran with no wait before them, and read what the
    peer had not staged yet (wrong results on 4 x H100). Every call so, from Python.
    Smaller blocks, another schedule, or the setting 0: the program."""
    rig = copy_engine_rig(monkeypatch)
    executor, mem, uploaded = rig.executor, rig.memory, rig.uploaded
    executor.copy_chunk = chunk
    threads = peer_executor.cuda_peer.THREADS
    block = 1 << 20
    chunks = block // chunk
    all_to_all = collective == "all_to_all"
    inp = DeviceArray(1 << 24, block // 4 * (2 if all_to_all else 1))
    out = DeviceArray(2 << 24, block // 2)
    bounds = [(k * block // chunks, (k + 1) * block // chunks) for k in range(chunks)]
    for call in range(2):
        count = len(rig.launches)
        rig.call(collective, inp, out, algorithm="direct")
        side_waits, first, *rounds, second = rig.launches[count:]
        assert side_waits == ("side waits", ("event", 5))
        assert first[:2] == ("python", 4444) and first[2] > 1 and first[3:5] == (threads, 7)
        pieces = [block, 0, 0, 0] if all_to_all else [0, 0, 0, 0]   # (from, into) each
        assert uploaded[first[5][0]].tolist() == [block, 0, chunks, 1] + pieces
        assert first[5][3] == 1 << 24 and first[5][4] == 2 << 24         # input, output
        assert first[5][5] == mem.data_ptr                                # staging
        assert len(rounds) == 2 * chunks
        waits = next(e for _, e in executor._entries.values()
                     if e.kernel == f"copies_{collective}").waits.data.ptr
        for k, (lo, hi) in enumerate(bounds):
            wait, copy = rounds[2 * k:2 * k + 2]
            assert wait[:5] == ("python", 4444, 1, threads, 5)
            assert wait[5][0] == waits + 32 * k
            assert uploaded[waits][k].tolist() == [0, 2, k + 1, first[2]]
            assert copy == ("copy", (2 << 24) + block + lo, mem.peer_data[1] + lo, hi - lo,
                            4, 5), (call, k)
        assert second[:5] == ("python", 4444, 1, threads, 5)
        assert uploaded[second[5][0]].tolist() == [0, 1, chunks + 1]
        assert rig.stream.waited[-1] == ("event", 7), call              # the side joined
    small = DeviceArray(3 << 24, inp.size - 4)     # 8 bytes less in each of 2 blocks
    small_out = DeviceArray(4 << 24, small.size if all_to_all else 2 * small.size)
    for algorithm in ("direct", "ring"):
        got = rig.call(collective, small, small_out, algorithm=algorithm)
        assert got[1] != 4444 and rig.launches[-2][0] != "copy", algorithm
    executor.copy_engine, executor.side = {}, None
    executor._entries.clear()
    rig.group._lane.clear()
    assert rig.call(collective, inp, out, algorithm="direct")[1] != 4444


@pytest.mark.parametrize("collective", ["all_gather", "all_to_all"])
def test_a_large_direct_all_gather_or_all_to_all_runs_pipelined_in_one_launch(monkeypatch,
                                                                            collective):
    """A direct all_gather or all_to_all whose every block reaches
    COLLECTIVES_PEER_PIPELINE_BYTES (the copy engines off, as auto has them for these):
    ``pipelined_reduce_scatter`` with kind 3 (all_gather) or 4 (all_to_all), the block's
    count, its chunks and half the thread blocks pushing; the caller's input and output
    (the kernel writes the output itself: nothing staged), the peers' slots at the start
    of the staging memory (scratch at 0), which holds the p - 1 of them; one launch, from
    the lane when repeated."""
    rig = copy_engine_rig(monkeypatch)
    executor, mem, uploaded = rig.executor, rig.memory, rig.uploaded
    executor.copy_engine = {}
    threads = peer_executor.cuda_peer.THREADS
    block = 1 << 20                                  # bytes of each block, 2 ranks
    all_to_all = collective == "all_to_all"
    inp = DeviceArray(1 << 24, block // 4 * (2 if all_to_all else 1))
    out = DeviceArray(2 << 24, block // 2)
    got = [rig.call(collective, inp, out, algorithm="direct") for _ in range(3)]
    assert [g[0] for g in got] == ["python", "lane", "lane"]
    assert rig.launches[-3:] == got                  # nothing else queued
    for g in got:
        assert g[1] == 4343 and g[3] == threads and g[2] > 1
        count, chunks, pushers, kind = uploaded[g[5][0]].tolist()
        assert (count, kind) == (block // 4, 4 if all_to_all else 3)
        assert chunks == block // peer_executor.PIPELINE_CHUNK_BYTES or chunks == 1
        assert pushers == g[2] * peer_executor.PIPELINE_PUSHERS // 4
        values = g[5]
        assert (values[3], values[4], values[6]) == (1 << 24, 2 << 24, 2 << 24)
        assert values[5] == mem.data_ptr and values[9] == 0
    entry = next(e for _, e in executor._entries.values())
    assert entry.kernel == f"pipelined_{collective}" and not entry.staged
    assert entry.staging >= block and mem.capacity >= entry.staging


def test_copies_that_cannot_be_queued_fail_the_group_for_every_later_call(monkeypatch):
    """A copy (or the second launch) that fails to be queued after the first launch began
    the call: the error is raised, and every later call of the group raises it too, before
    anything is launched (the call's words are half moved: no call may go on from them)."""
    rig = copy_engine_rig(monkeypatch)
    block = 1 << 20
    inp, out = DeviceArray(1 << 24, block // 2), DeviceArray(2 << 24, block // 2)

    def refuse(*args):
        raise RuntimeError("cudaErrorInvalidValue: invalid argument")
    rig.executor.cupy.cuda.runtime.memcpyAsync = refuse
    with pytest.raises(RuntimeError, match="invalid argument"):
        rig.call("all_reduce", inp, out, algorithm="two_shot")
    launched = len(rig.launches)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="invalid argument"):
            rig.call("all_reduce", inp, out, algorithm="two_shot")
    assert len(rig.launches) == launched

