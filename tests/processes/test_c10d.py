"""The torch backend "collectives" (collectives/c10d.py): torch.distributed, DDP, FSDP2 and
DTensor on our algorithms.

In this process (one rank): registration, the stores between torch and us, Work, errors.
In real processes (jobs under jobs/, each killed at a limit so a hang fails): every
collective through torch.distributed against exact values, then DDP / FSDP2 training, on 2
ranks under our launcher and on 3 ranks under torchrun's environment variables set by hand
(rank 0 hosting torch's own TCPStore); parameters bitwise identical across ranks, equal to
gloo's (2 ranks, same seeds) and to one process's training within float rounding.
"""
import os
import re
import signal
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import collectives.c10d as c10d  # noqa: E402
from collectives.errors import CollectiveTimeout  # noqa: E402
from collectives.store import HashStore, TCPStore  # noqa: E402

from repo import JOBS, ROOT  # noqa: E402

JOB_LIMIT = 90          # seconds; a job past it is killed and the test fails
VARIANTS = ("plain", "allreduce_hook", "custom_hook", "powersgd", "no_sync", "fsdp2")
TRAINING = os.path.join(JOBS, "c10d_training.py")


# -- helpers -----------------------------------------------------------------------------------


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for name in ("COLLECTIVES_SECRET", "COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE",
                 "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(extra)
    return env


def _finish(procs, what):
    """Wait for every process; past JOB_LIMIT kill them all (their sessions) and fail."""
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=JOB_LIMIT)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait()
        pytest.fail(f"{what} hung: killed after {JOB_LIMIT} s")
    return [proc.returncode for proc in procs], "".join(outputs)


def launch(nproc, script, *args, cwd, env=None):
    """Our launcher: ``python -m collectives.run --standalone --nproc-per-node N``."""
    proc = subprocess.Popen([sys.executable, "-m", "collectives.run", "--standalone",
                             "--nproc-per-node", str(nproc), script, *args],
                            env=_env(**(env or {})), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    codes, output = _finish([proc], f"collectives.run {os.path.basename(script)}")
    return codes[0], output


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def by_hand(nproc, script, *args, cwd, env=None):
    """torchrun's environment set by hand: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (rank 0
    runs torch's TCPStore), one process per rank."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, script, *args],
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                                       LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), **(env or {})),
                              cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
             for r in range(nproc)]
    codes, output = _finish(procs, f"{os.path.basename(script)} by hand")
    return max(codes, key=abs), output


@pytest.fixture
def one_rank():
    """A one-rank default group on our backend, in this process."""
    dist.init_process_group("collectives", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=20))
    yield dist.group.WORLD
    dist.destroy_process_group()


# -- in this process ---------------------------------------------------------------------------


def test_registered_for_cpu_and_cuda():
    assert "collectives" in dist.Backend.backend_list
    assert dist.Backend.COLLECTIVES == "collectives"
    assert dist.Backend.backend_capability["collectives"] == ["cpu", "cuda"]
    assert dist.is_backend_available("collectives")


def test_one_rank_group_runs_every_call(one_rank):
    pg = one_rank
    assert isinstance(pg, c10d.ProcessGroupCollectives) and pg.name() == "collectives"
    assert dist.get_backend() == "collectives" and (pg.rank(), pg.size()) == (0, 1)
    t = torch.arange(4.0)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert torch.equal(t, torch.arange(4.0))
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, c10d.Work) and work.wait() is True and work.is_success()
    assert work.get_future().value()[0] is t and work.exception() is None
    out = torch.empty(4)
    dist.all_gather_into_tensor(out, t)
    dist.reduce_scatter_tensor(out, t)
    dist.all_to_all_single(out, t)
    assert torch.equal(out, t)
    lst = [torch.empty(4)]
    dist.all_gather(lst, t)
    dist.gather(t, lst, dst=0)
    dist.scatter(out, [t], src=0)
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    dist.barrier()
    assert torch.equal(lst[0], t) and torch.equal(out, t)


def test_bad_input_names_the_call_and_rank(one_rank):
    pg = one_rank
    with pytest.raises(ValueError, match=r"all_reduce on rank 0: tensor is not contiguous"):
        dist.all_reduce(torch.zeros(3, 3).t())
    with pytest.raises(TypeError, match=r"all_reduce on rank 0: tensor is on meta"):
        dist.all_reduce(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match=r"all_reduce on rank 0: .*PREMUL_SUM"):
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
    with pytest.raises(TypeError, match=r"all_reduce on rank 0: ReduceOp.BAND .* float32"):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match=r"all_reduce on rank 0: tensors must be a list of "
                                         r"exactly one tensor"):
        pg.allreduce([torch.ones(1), torch.ones(1)])
    with pytest.raises(ValueError, match=r"all_gather on rank 0: output_tensors must hold 1"):
        pg.allgather([[torch.ones(1), torch.ones(1)]], [torch.ones(1)])
    with pytest.raises(TypeError, match=r"all_gather on rank 0: output_tensors\[0\] has dtype "
                                        r"int64"):
        pg.allgather([[torch.ones(1, dtype=torch.int64)]], [torch.ones(1)])
    with pytest.raises(ValueError, match=r"all_gather on rank 0: output has 3 elements"):
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))
    with pytest.raises(ValueError, match=r"all_to_all_single on rank 0: output_split_sizes"):
        dist.all_to_all_single(torch.empty(2), torch.ones(2), [3], [2])
    with pytest.raises(ValueError, match=r"send on rank 0: peer 0 must be another rank"):
        pg.send([torch.ones(1)], 0, 0)
    with pytest.raises(ValueError, match=r"broadcast on rank 0: root rank 3 is out of range"):
        opts = dist.BroadcastOptions()
        opts.rootRank = 3
        pg.broadcast([torch.ones(1)], opts)
    t = torch.ones(2)                      # the group goes on after refused calls
    dist.all_reduce(t)
    assert torch.equal(t, torch.ones(2))


def test_work_wait_timeout_then_completes(one_rank):
    """A receive that nobody sends to times out in wait() and stays pending; a matching
    message later completes it (here from this rank's own transport, as a peer would)."""
    pg = one_rank
    got = torch.empty(2)
    work = pg.recv_anysource([got], 3)
    with pytest.raises(CollectiveTimeout):
        work.wait(timedelta(seconds=0.1))
    assert not work.is_completed()
    transport = pg.group.transport
    transport.isend(torch.tensor([1.0, 2.0]).numpy(), 0, pg.group.p2p_tag(3))
    assert work.wait() and torch.equal(got, torch.tensor([1.0, 2.0]))
    assert work.get_future().value()[0] is got


def _cuda_looking(values, index=0):
    """A CPU tensor that says it is on cuda:``index`` (torch without CUDA makes none): what
    the routing sees of a CUDA tensor; nothing may move it."""
    class CudaLooking(torch.Tensor):
        @property
        def device(self):
            return torch.device("cuda", index)
    return torch.Tensor._make_subclass(CudaLooking, torch.as_tensor(values))


def test_cuda_tensors_without_a_gpu_transport_are_a_clear_error(one_rank, monkeypatch):
    """Raised before anything moves, naming the call, the rank, the device and why; the
    group goes on."""
    monkeypatch.setattr(c10d.transports, "available",
                        lambda name: (False, f"no {name} here: cupy is not importable"))
    pg = one_rank
    t = _cuda_looking([1.0, 2.0])
    with pytest.raises(RuntimeError, match=r"all_reduce on rank 0: the tensors are on cuda:0, "
                                           r"and the collectives backend runs CUDA tensors on "
                                           r"its nccl transport, which is not usable here: no "
                                           r"nccl here: cupy is not importable"):
        pg.allreduce([t])
    with pytest.raises(RuntimeError, match=r"all_gather_single on rank 0: .*cuda:0"):
        pg.all_gather_single(_cuda_looking([0.0, 0.0]), t)
    assert torch.equal(t, torch.tensor([1.0, 2.0]))
    u = torch.ones(2)
    dist.all_reduce(u)
    assert torch.equal(u, torch.ones(2))


def test_a_call_on_two_devices_is_refused(one_rank):
    pg = one_rank
    with pytest.raises(ValueError, match=r"all_gather_single on rank 0: the tensors of one call "
                                         r"must be on one device, got cpu, cuda:0"):
        pg.all_gather_single(torch.empty(2), _cuda_looking([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"all_gather on rank 0: .*got cpu, cuda:1"):
        pg.allgather([[torch.empty(2)]], [_cuda_looking([1.0, 2.0], 1)])


def test_cuda_calls_go_to_one_gpu_group_on_the_tensors_device(one_rank, monkeypatch):
    """The first CUDA call makes the GPU transport on its tensors' GPU, with the group's rank,
    size, store and timeout; a later call on another GPU is refused by name. CPU calls stay
    on the socket group."""
    made = []

    class Made(Exception):
        pass

    class FakeModule:
        @staticmethod
        def create(**kwargs):
            made.append(kwargs)
            raise Made()
    monkeypatch.setattr(c10d.transports, "available", lambda name: (True, "fake"))
    monkeypatch.setattr(c10d.transports, "module", lambda name: FakeModule)
    pg = one_rank
    with pytest.raises(Made):
        pg.broadcast([_cuda_looking([1.0], 3)], dist.BroadcastOptions())
    assert made == [dict(rank=0, world_size=1, store=pg._store, timeout=20.0, device=3)]

    class Placed:
        transport = type("T", (), {"device": 3})()
    monkeypatch.setattr(pg, "_gpu", Placed())
    with pytest.raises(ValueError, match=r"broadcast on rank 0: the tensors are on cuda:1, but "
                                         r"this process group runs on cuda:3"):
        pg.broadcast([_cuda_looking([1.0], 1)], dist.BroadcastOptions())
    u = torch.ones(2)
    dist.all_reduce(u)                 # CPU tensors: the socket group, as before
    assert torch.equal(u, torch.ones(2)) and pg.group is pg._main


def test_sparse_all_reduce_one_rank(one_rank):
    """Sparse COO tensors sum as gloo's do (the facade's code: collectives.sparse)."""
    t = torch.sparse_coo_tensor([[0, 2, 0]], [1.0, 2.0, 3.0], (4,))
    dist.all_reduce(t)
    assert t.is_sparse and torch.equal(t.to_dense(), torch.tensor([4.0, 0.0, 2.0, 0.0]))
    with pytest.raises(ValueError, match="all_reduce on rank 0: sparse tensors reduce with "
                                         "ReduceOp.SUM only"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)


def test_barrier_timeout_says_timed_out_naming_rank_and_peer():
    """torch's tests (and code written for gloo) match ' Timed out ' in a barrier's timeout;
    ours says it, and still where it waited: operation, rank, step, peer."""
    import threading
    store = dist.HashStore()
    groups = {}

    def make(rank):
        groups[rank] = c10d.ProcessGroupCollectives(store, rank, 2, timedelta(seconds=20))
    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    opts = dist.BarrierOptions()
    opts.timeout = timedelta(seconds=0.3)
    try:
        with pytest.raises(CollectiveTimeout) as caught:
            groups[0].barrier(opts).wait()
    finally:
        for pg in groups.values():
            pg.abort()
    message = str(caught.value)
    assert re.search(" (Timed out|closed|timeout) ", message), message
    assert re.search(r"barrier \(\w+\) on rank 0, step 1 of \d+: Timed out after 0\.\d+ s; "
                     r"rank 0: \w+ (from|to) rank 1 ", message), message


def test_torch_store_under_our_store_interface():
    """What the socket transport's rendezvous needs from the store torch hands the backend."""
    inner = dist.HashStore()
    store = c10d._TorchStore(dist.PrefixStore("pg", inner), 5.0)
    store.set("a", b"1")
    assert store.get("a") == b"1" and store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.check(["a"]) and not store.check(["b"]) and store.num_keys() >= 2
    store.set_timeout(0.1)
    with pytest.raises(CollectiveTimeout, match="missing keys"):
        store.get("never")
    assert store.delete_key("a") and not store.check(["a"])


def test_our_store_under_torch_store_interface():
    """The launcher's store as a torch.distributed.Store (env:// under collectives.run)."""
    ours = c10d._LauncherStore(HashStore(timeout=5))    # torch holds only its C++ half
    store = dist.PrefixStore("default", ours)
    store.set("k", "v")
    assert store.get("k") == b"v" and store.add("c", 4) == 4
    store.wait(["k"])
    assert store.check(["k"]) and store.compare_set("k", "v", "w") == b"w"
    assert store.get("k") == b"w" and store.delete_key("k")


@pytest.mark.parametrize("backend", ["collectives", "gloo"])
def test_env_rendezvous_uses_our_launchers_store(monkeypatch, backend):
    """Under collectives.run the launcher's store holds MASTER_PORT and speaks our protocol:
    torch's env:// gets that store instead of starting a TCPStore of its own there."""
    server = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10)
    try:
        for name, value in dict(COLLECTIVES_USE_AGENT_STORE="1", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(server.port), RANK="0",
                                WORLD_SIZE="1").items():
            monkeypatch.setenv(name, value)
        made = len(c10d._launcher_stores)
        dist.init_process_group(backend, timeout=timedelta(seconds=20))
        assert len(c10d._launcher_stores) == made + 1    # torch was handed our store
        try:
            t = torch.ones(3)
            dist.all_reduce(t)
            assert torch.equal(t, torch.ones(3)) and dist.get_backend() == backend
        finally:
            dist.destroy_process_group()
    finally:
        server.close()


# -- in real processes -------------------------------------------------------------------------
# One job per world size runs c10d_suite.py's checks and then the training (each start of
# torch costs seconds per rank on a small machine): 2 ranks under our launcher, 3 under
# torchrun's variables set by hand with COLLECTIVES_ALGORITHM forcing ring for all_reduce;
# gloo trains on 2 ranks for the comparison.


def _load(out, nproc):
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


def _job_ok(code, output, nproc):
    assert code == 0 and "FAIL" not in output, output[-6000:]
    assert output.count("OK rank") == nproc and output.count("TRAINED rank") == nproc, \
        output[-6000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """(our parameters per rank, gloo's, our job's output): our backend under collectives.run,
    gloo under torchrun's variables."""
    tmp = tmp_path_factory.mktemp("c10d_two")
    ours, gloo = tmp / "ours", tmp / "gloo"
    ours.mkdir()
    gloo.mkdir()
    code, output = launch(2, TRAINING, "collectives", str(ours), "--suite", cwd=tmp)
    _job_ok(code, output, 2)
    code, gloo_output = by_hand(2, TRAINING, "gloo", str(gloo), cwd=tmp)
    assert code == 0 and gloo_output.count("TRAINED rank") == 2, gloo_output[-6000:]
    return _load(ours, 2), _load(gloo, 2), output


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory):
    """(our parameters per rank, our job's output): torchrun's variables, ring all_reduce."""
    tmp = tmp_path_factory.mktemp("c10d_three")
    code, output = by_hand(3, TRAINING, "collectives", str(tmp), "--suite", cwd=tmp,
                           env=dict(COLLECTIVES_ALGORITHM="all_reduce=ring",
                                    COLLECTIVES_DEBUG="INFO"))
    _job_ok(code, output, 3)
    return _load(tmp, 3), output


def _training():
    sys.path.insert(0, JOBS)
    try:
        import c10d_training
    finally:
        sys.path.remove(JOBS)
    return c10d_training


def _check_training(ours, nproc):
    """Bitwise identical on every rank, moved by training, and (where the math is plain data
    parallelism) equal to one process's training on every rank's data within rounding."""
    job = _training()
    start = [p.detach() for p in job.model().parameters()]
    for variant in ours[0]:
        for rank in range(1, nproc):
            for a, b in zip(ours[0][variant], ours[rank][variant]):
                assert torch.equal(a, b), (variant, rank)
        for a, s in zip(ours[0][variant], start):
            assert torch.isfinite(a).all() and not torch.equal(a, s), variant
    for variant in ("plain", "allreduce_hook", "custom_hook", "no_sync", "fsdp2"):
        want = job.reference("no_sync" if variant == "no_sync" else "plain", nproc)
        for a, b in zip(ours[0][variant], want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=variant)


def test_every_collective_2_ranks_under_our_launcher(two_ranks):
    assert two_ranks[2].count("OK rank") == 2


def test_every_collective_3_ranks_under_torchrun_environment(three_ranks):
    assert three_ranks[1].count("OK rank") == 3


def test_ddp_and_fsdp2_2_ranks_match_gloo(two_ranks):
    """DDP (buckets, allreduce_hook, a get_future hook, PowerSGD, no_sync) and FSDP2 on our
    backend and on gloo, same seeds."""
    ours, gloo, _ = two_ranks
    assert set(ours[0]) == set(VARIANTS) | {"powersgd_buckets"}
    for variant in VARIANTS:
        for a, b in zip(ours[0][variant], gloo[0][variant]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=variant)
    _check_training(ours, 2)


def test_ddp_and_fsdp2_3_ranks_forced_ring(three_ranks):
    """On 3 ranks with COLLECTIVES_ALGORITHM=all_reduce=ring: the backend chooses as the
    facade does (the INFO log shows each group's decision table, all_reduce by the override,
    and the model's rows as they are first used, none for all_reduce); PowerSGD over several
    buckets is bitwise identical across ranks (gloo, whose order of calls from callbacks
    depends on timing, hangs there)."""
    ours, output = three_ranks
    assert "COLLECTIVES_ALGORITHM=all_reduce=ring" in output
    assert re.search(r"all_reduce +0\+ +ring +override", output), output
    assert re.search(r"\): reduce_scatter \S+ -> ", output), output
    assert not re.search(r"\): all_reduce \S+ -> ", output), output
    _check_training(ours, 3)
