"""``bench.py --backend nccl`` under the launcher, on the CPU.

Two layers. (1) The whole NCCL benchmark (``bench.nccl.run_from_bench``) runs as one thread
per rank on the CPU fake of CuPy/NCCL (``nccl_fake``), each rank joining the way a rank of
``collectives.run`` does: env:// rendezvous on a TCPStore the "launcher" (the test) serves,
the NCCL id through that store, and the host-side barriers and reductions through
``StoreHost``; rows must come back for every (collective, size, algorithm) with 0 wrong.
The fake is one process, so it is made thread-aware here (the current rank, the open NCCL
group and its depth per thread; ``drain`` under a lock) and given the few calls the benchmark
adds (event timing, ``empty_like``, comparisons, NCCL's allReduce as grouped send/recv plus a
host reduction, the unique id, device properties). Its timings mean nothing. (2)
``StoreHost`` alone in real processes started by ``collectives.run``: barrier ordering,
exact max/sum over several rounds, and the store left empty of its round keys.

Not covered here (GPU only): real CUDA events and kernels, NCCL's own collectives, graph rows
(``--graph-max 0``) and the self-launch's GPU count.
"""
import json
import os
import subprocess
import sys
import threading
import traceback
import types

import numpy as np
import pytest

import nccl_fake
from nccl_fake import FakeArray, World

from collectives.store import TCPStore

JOIN_SECONDS = 60   # a hang dumps every thread's stack, then fails
_NCCL_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64,
                5: np.uint64, 6: np.float16, 7: np.float32, 8: np.float64}


class ThreadedWorld(World):
    """The fake with one thread per rank: rank and NCCL group state are per thread."""

    def __init__(self, size):
        self._tls = threading.local()
        self._lock = threading.RLock()
        super().__init__(size)

    def _slot(name, default):
        return property(lambda self: getattr(self._tls, name, default),
                        lambda self, value: setattr(self._tls, name, value))

    rank = _slot("rank", 0)
    depth = _slot("depth", 0)
    group = _slot("group", None)
    del _slot

    def drain(self, *args, **kwargs):
        with self._lock:
            return super().drain(*args, **kwargs)


def _all_reduce(world):
    """NCCL allReduce as the fake can run it: one group exchanging whole buffers with every
    peer, then a host reduction queued on the same stream."""
    def all_reduce(comm, send_ptr, recv_ptr, count, nccl_type, op, stream_ptr):
        if op != 0:
            raise NotImplementedError("fake allReduce: sum only")
        dtype = np.dtype(_NCCL_DTYPES[nccl_type])
        nbytes = count * dtype.itemsize
        peers = [p for p in range(world.size) if p != comm.rank]
        inbox = world.empty(count * len(peers), dtype)
        world.group_start()
        for i, peer in enumerate(peers):
            world.group_part(comm.rank, ("send", peer, send_ptr, nbytes), stream_ptr)
            world.group_part(comm.rank, ("recv", peer, inbox.data.ptr + i * nbytes, nbytes),
                             stream_ptr)
        world.group_end()
        memory = world.memory

        def reduce():
            total = memory.bytes_at(send_ptr, nbytes).view(dtype).copy()
            for i in range(len(peers)):
                total += inbox.np[i * count:(i + 1) * count]
            memory.bytes_at(recv_ptr, nbytes).view(dtype)[...] = total
        world.stream_of(stream_ptr).enqueue(reduce)
    return all_reduce


def _install(world, monkeypatch):
    modules = world.modules()
    cupy, cuda, nccl = modules["cupy"], modules["cupy.cuda"], modules["cupy.cuda.nccl"]
    cupy.empty_like = lambda a: world.empty(a.size, a.dtype)
    cupy.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    cuda.Device = lambda index: types.SimpleNamespace(use=lambda: None)
    cuda.get_elapsed_time = lambda start, end: 1.0          # ms; the fake has no clock
    cuda.runtime.getDeviceProperties = lambda index: {"name": b"fake GPU"}
    nccl.get_unique_id = lambda: bytes(range(128))
    joined = threading.Barrier(world.size, timeout=30)

    def communicator(size, uid, rank):     # like ncclCommInitRank: returns once all joined
        joined.wait()
        return nccl_fake.Comm(world, rank)
    nccl.NcclCommunicator = communicator
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)

    def synchronize(event):
        while not event.done:
            world.drain(partial=True)

    monkeypatch.setattr(nccl_fake.Event, "synchronize", synchronize, raising=False)
    monkeypatch.setattr(nccl_fake.Stream, "synchronize",
                        lambda stream: synchronize(stream.record()), raising=False)
    monkeypatch.setattr(nccl_fake.Comm, "allReduce", _all_reduce(world), raising=False)
    monkeypatch.setattr(FakeArray, "flags", types.SimpleNamespace(c_contiguous=True),
                        raising=False)            # cupy's flags: no writeable
    monkeypatch.setattr(FakeArray, "ndim", 1, raising=False)
    monkeypatch.setattr(FakeArray, "__ne__", lambda a, b: a.np != b.np, raising=False)
    host_fill = FakeArray.__setitem__

    def setitem(array, key, value):          # device to device: a copy on the current stream
        if not isinstance(value, FakeArray):
            return host_fill(array, key, value)
        if key is not Ellipsis or value.nbytes != array.nbytes:
            raise NotImplementedError("fake cupy: whole-array copies only")
        world.memcpy_async(array.data.ptr, value.data.ptr, array.nbytes, 3,
                           world.current_stream().ptr)
    monkeypatch.setattr(FakeArray, "__setitem__", setitem)

    def reduce_kernel(op, dtype):          # a CUDA kernel: runs when its stream gets there
        from collectives.kernels.reduce import reducer
        host = reducer(op, dtype)
        return lambda dst, a, b: world.launch(lambda: host(dst.np, a.np, b.np))
    import collectives.kernels.cuda
    monkeypatch.setattr(collectives.kernels.cuda, "reduce_kernel", reduce_kernel)


@pytest.mark.parametrize("size", [2, 3])
def test_nccl_bench_through_launcher_rendezvous(size, monkeypatch, tmp_path):
    from collectives.bench import nccl as bench_nccl
    from collectives.executors import nccl as executor

    world = ThreadedWorld(size)
    _install(world, monkeypatch)
    # what collectives.run gives each worker, less RANK/WORLD_SIZE (threads share os.environ)
    server = TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                      timeout=30)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("COLLECTIVES_USE_AGENT_STORE", "1")
    monkeypatch.setenv(executor.ENV_SEGMENT, "0")
    monkeypatch.setenv(executor.ENV_GRAPH, "0")
    out = tmp_path / "bench.json"
    status, errors = [None] * size, []

    def rank_main(rank):
        try:
            world.rank = rank
            args = types.SimpleNamespace(
                collectives="all_reduce,all_to_all", algorithms="ring,recursive_doubling",
                sizes="96,480", dtype="float32", json=str(out), graph_max="0", iters=1)
            group, _ = bench_nccl.nccl_group(timeout=30, init_method="env://", rank=rank,
                                             world_size=size)
            assert isinstance(group.bench_host, bench_nccl.StoreHost)
            status[rank] = bench_nccl.run_from_bench(args, group)
        except BaseException:        # reported below with the rank
            errors.append((rank, traceback.format_exc()))

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS)
    if any(t.is_alive() for t in threads):
        import faulthandler
        faulthandler.dump_traceback(all_threads=True)
    server.close()
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, "\n".join(f"rank {r}: {e}" for r, e in errors)
    assert status == [0] * size
    rows = json.loads(out.read_text())["records"]
    want = {(c, s, a) for c in ("all_reduce", "all_to_all") for s in (96, 480)
            for a in ("native", "ring", "ring:ceiling", "recursive_doubling",
                      "recursive_doubling:ceiling")}
    assert {(r["collective"], r["size"], r["algorithm"]) for r in rows} == want
    assert all(r["wrong"] == 0 and r["world_size"] == size for r in rows)
    assert all(r["time_p50_us"] > 0 and r["ratio_to_native"] > 0 for r in rows)


def test_nccl_bench_rows_beside_ours(monkeypatch, tmp_path, capsys):
    """Where the group runs its plans on another executor than NCCL send/recv (peer memory
    on GPUs; a stand-in here), each of our rows has an ``<alg>:sendrecv`` twin: the same
    schedule on the NCCL send/recv executor over the same transport, checked like the others.
    torch's SymmetricMemory rows need CUDA in torch: without it one line says why they are
    absent and the run goes on; the multicast switches are off in the environment."""
    size = 2
    world = ThreadedWorld(size)
    _install(world, monkeypatch)
    from collectives.bench import nccl as bench_nccl
    from collectives.executors import nccl as executor
    from collectives.group import ProcessGroup
    from collectives.store import HashStore
    from collectives.transports import nccl as nccl_transport
    monkeypatch.setenv(executor.ENV_SEGMENT, "0")
    store = HashStore()
    status, errors = [None] * size, []
    out = tmp_path / "b.json"

    def rank_main(rank):
        try:
            world.rank = rank
            transport = nccl_transport.create(rank, size, store=store, timeout=30)
            group = ProcessGroup(transport, backend="nccl", timeout=30)
            group.execute = lambda *a, **k: executor.execute(*a, **k)   # not send/recv itself
            host = bench_nccl.StoreHost(store, rank, size, timeout=30)
            args = types.SimpleNamespace(collectives="all_reduce", algorithms="ring,auto",
                                         sizes="64", dtype="float32", json=str(out),
                                         graph_max="0", iters=1)
            status[rank] = bench_nccl.run_from_bench(args, group, host)
        except BaseException:
            errors.append((rank, traceback.format_exc()))

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_SECONDS)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, "\n".join(f"rank {r}: {e}" for r, e in errors)
    assert status == [0, 0]
    rows = json.loads(out.read_text())["records"]
    assert [r["algorithm"] for r in rows] == ["native", "ring", "ring:sendrecv", "ring:ceiling",
                                              "auto"]
    assert all(r["wrong"] == 0 for r in rows)
    assert rows[2]["chosen"] == "ring" and rows[1]["ratio_to_ceiling"] > 0
    text = capsys.readouterr().out
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        assert text.count("# no symm_mem rows: ") == 1, text
    assert "symm_mem" not in {r["algorithm"].split(":")[0] for r in rows}
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def test_nccl_bench_wrong_results_are_counted_over_ranks(monkeypatch, tmp_path):
    """A broken native all_reduce on one rank must show as wrong elements in every rank's
    row and a failing exit status: the sum travels through the store."""
    size = 2
    world = ThreadedWorld(size)
    _install(world, monkeypatch)
    good = nccl_fake.Comm.allReduce

    def broken(comm, send_ptr, recv_ptr, count, nccl_type, op, stream_ptr):
        good(comm, send_ptr, recv_ptr, count, nccl_type, op, stream_ptr)
        if comm.rank == 1:
            view = world.memory.bytes_at(recv_ptr, 4 * count).view(np.float32)
            world.stream_of(stream_ptr).enqueue(lambda: view.__setitem__(slice(0, 3), -1))
    monkeypatch.setattr(nccl_fake.Comm, "allReduce", broken)
    from collectives.bench import nccl as bench_nccl
    from collectives.store import HashStore
    store = HashStore()
    status = [None] * size

    def rank_main(rank):
        world.rank = rank
        from collectives.transports import nccl as nccl_transport
        from collectives.group import ProcessGroup
        transport = nccl_transport.create(rank, size, store=store, timeout=30)
        group = ProcessGroup(transport, backend="nccl", timeout=30)
        host = bench_nccl.StoreHost(store, rank, size, timeout=30)
        args = types.SimpleNamespace(collectives="all_reduce", algorithms="ring", sizes="64",
                                     dtype="float32", json=str(tmp_path / "b.json"),
                                     graph_max="0", iters=1)
        status[rank] = bench_nccl.run_from_bench(args, group, host)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert status == [1, 1]
    native = [r for r in json.loads((tmp_path / "b.json").read_text())["records"]
              if r["algorithm"] == "native"]
    # 3 wrong elements on rank 1, in the two checked calls (the first warm-up, the last timed)
    assert [r["wrong"] for r in native] == [6]


def test_store_host_under_the_launcher():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "tests", "helpers", "store_host_job.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root,
                                                                     os.environ.get("PYTHONPATH")])))
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "MPI_LOCALRANKID"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-m", "collectives.run", "--standalone",
                           "--nproc-per-node", "3", script], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line.split(":", 1)[1].split() for line in done.stdout.splitlines()
                   if " ok " in f" {line.split(':', 1)[-1]} ")
    assert [line[:2] for line in lines] == [["ok", "0"], ["ok", "1"], ["ok", "2"]], done.stdout
    assert all(line[2] == "0" for line in lines), lines     # finished rounds leave no keys


def test_by_hand_without_a_gpu_says_why(monkeypatch, capsys):
    """``bench.py --backend nccl`` with no launcher and no mpiexec self-launches one rank per
    GPU; with no usable GPU it stops before launching, naming the reason."""
    from collectives import bench
    from collectives.transports import nccl as nccl_transport
    for var in ("RANK", "WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                "PMI_SIZE", "MPI_LOCALRANKID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(nccl_transport, "available", lambda: (False, "no CUDA device is visible"))
    assert bench.main(["--backend", "nccl", "--sizes", "1M"]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err


class _OneRank:
    """Host coordination of a job of one rank."""
    rank, size = 0, 1

    def sum(self, value):
        return value

    def max(self, value):
        return value


def _fake_torch(monkeypatch, ops):
    """Just enough of a CUDA torch for SymmetricMemory: numpy buffers, ``ops`` as
    torch.ops.symm_mem, a process group that is always there."""
    class Buffer:
        def __init__(self, count):
            self.a = np.zeros(count, np.float32)

        def copy_(self, source):
            self.a[...] = source

        def __ne__(self, other):
            return self.a != other

    cuda = types.SimpleNamespace(
        is_available=lambda: True, set_device=lambda d: None, set_stream=lambda s: None,
        ExternalStream=lambda ptr: types.SimpleNamespace(synchronize=lambda: None))
    torch = types.ModuleType("torch")
    torch.__version__ = "fake"
    torch.cuda, torch.float32 = cuda, "float32"
    torch.device = lambda *a: a
    torch.from_dlpack = lambda array: array
    torch.ops = types.SimpleNamespace(symm_mem=types.SimpleNamespace(**ops))
    tdist = types.ModuleType("torch.distributed")
    tdist.TCPStore = lambda *a, **k: types.SimpleNamespace(port=29999)
    tdist.is_initialized = lambda: True
    tdist.group = types.SimpleNamespace(WORLD=types.SimpleNamespace(group_name="0"))
    tdist.destroy_process_group = lambda: None
    symm = types.ModuleType("torch.distributed._symmetric_memory")
    symm.empty = lambda count, dtype, device: Buffer(count)
    symm.rendezvous = lambda buf, name: None
    torch.distributed, tdist._symmetric_memory = tdist, symm
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(get_current_stream=lambda: types.SimpleNamespace(ptr=0))
    for name, module in (("torch", torch), ("torch.distributed", tdist), ("cupy", cupy),
                         ("torch.distributed._symmetric_memory", symm)):
        monkeypatch.setitem(sys.modules, name, module)


def test_symmetric_memory_rows_fail_soft(monkeypatch, capsys):
    """torch without an op: no rows and one line naming it. With both ops, an op that refuses
    a size is dropped at that size with one line; the other op's row stays and is checked.
    A reduction they do not offer: no rows, one line."""
    from collectives.bench.cases import Case
    from collectives.bench.symmetric import SymmetricMemory
    from collectives.ops import ReduceOp
    group = types.SimpleNamespace(size=1, rank=0, transport=types.SimpleNamespace(device=0))
    _fake_torch(monkeypatch, {"one_shot_all_reduce": lambda buf, op, name: buf.a.copy()})
    assert SymmetricMemory.open(group, _OneRank()) == (
        None, "RuntimeError: torch fake has no torch.ops.symm_mem.two_shot_all_reduce_")

    def two_shot(buf, op, name):
        raise ValueError("two-shot needs 16-byte aligned blocks")
    _fake_torch(monkeypatch, {"one_shot_all_reduce": lambda buf, op, name: buf.a.copy(),
                              "two_shot_all_reduce_": two_shot})
    symmetric, why = SymmetricMemory.open(group, _OneRank())
    assert why is None
    dtype = np.dtype(np.float32)
    case = Case("all_reduce", 0, 1, 5, dtype, ReduceOp.SUM)
    rows = symmetric.entries(case, case.input, case.expected, 5, dtype, ReduceOp.SUM, _OneRank())
    assert [r.algorithm for r in rows] == ["symm_mem:one_shot"]
    rows[0].call()
    assert rows[0].wrong() == 0
    again = symmetric.entries(case, case.input, case.expected, 5, dtype, ReduceOp.SUM,
                              _OneRank())
    assert [r.algorithm for r in again] == ["symm_mem:one_shot"]
    assert symmetric.entries(case, case.input, case.expected, 5, dtype, ReduceOp.MAX,
                             _OneRank()) == []
    lines = [line for line in capsys.readouterr().out.splitlines() if "symm_mem" in line]
    assert lines == [
        "# no symm_mem rows: symm_mem:two_shot at 5 elements: ValueError: two-shot needs "
        "16-byte aligned blocks",
        "# no symm_mem rows: they reduce with sum in float32, float16, bfloat16 only (this "
        "run: max, float32)"]


def test_symm_rows_share_one_symmetric_allocation_per_group(monkeypatch):
    """The sweep makes a bench anew for every collective and size; each allocating its own
    symmetric memory ran out of the group's 16 allocations on 4 GPUs (the bench failed at
    its 17th). The rows' outputs now come from one allocation per group, grown by 4x when a
    size outgrows it: sizes 4K-1G of three collectives on fresh benches need 5."""
    from collectives.bench import nccl as bench_nccl

    class Group:
        made = []

        def symmetric_empty(self, nbytes, dtype):
            self.made.append(nbytes)
            return np.zeros(nbytes, dtype)
    group = Group()
    for size in [4 << 10 << 2 * k for k in range(10)]:
        for _ in ("all_reduce", "all_gather", "all_to_all"):
            bench = bench_nccl.GpuBench.__new__(bench_nccl.GpuBench)
            bench.group = group
            out = bench._symmetric(np.zeros(size // 4, np.float32))
            assert out.nbytes == size and out.dtype == np.float32
    assert len(group.made) == 5, group.made
