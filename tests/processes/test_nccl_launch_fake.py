"""``init_process_group("nccl")`` in real processes, as README's Launching section starts them
(``mpiexec -n N python train.py``, ``python -m collectives.run``), on the fake CuPy/NCCL of
``nccl_fake`` (no GPU here): rank, size and the NCCL unique id come from MPI under mpiexec,
and a rank that raises ends the job quickly, its communicator aborted. The same on GPUs:
tests/gpu/test_nccl_usability.py.
"""
import subprocess
import sys

from mpiexec import needs_mpi
from reliability_jobs import ROOT, _env, explain, mpi_job, write_script
from repo import HELPERS

CI_BOUND = 20.0          # seconds for a whole job that must end early (a hang is 60 s)

JOB = """
import hashlib
sys.path.insert(0, os.environ["HELPERS_DIR"])
from nccl_fake import Comm, World

fake = World(2)
modules = fake.modules()
nccl = modules["cupy.cuda.nccl"]
nccl.get_unique_id = lambda: tuple(os.urandom(128))


class Communicator(Comm):
    # cupy.cuda.nccl.NcclCommunicator(ndev, unique id, rank) over the fake, one rank here
    def __init__(self, ndev, uid, rank):
        fake.rank = rank
        super().__init__(fake, rank)
        self.ndev, self.uid = ndev, bytes(uid)

    def abort(self):
        super().abort()
        os.write(1, f"ABORTED rank {self.rank}\\n".encode())
        if os.environ.get("ABORT_MARKS"):      # output the job's teardown cannot lose
            open(os.path.join(os.environ["ABORT_MARKS"], f"aborted.{self.rank}"), "w").close()


nccl.NcclCommunicator = Communicator
sys.modules.update(modules)

# Each process holds a one-rank fake, so nothing can travel between the ranks' fake NCCL: the
# decision table's agreement (an all_gather when a group is made) has no fake to ride on.
from collectives.group import ProcessGroup
ProcessGroup._agree = lambda self, table: None
# A real communicator returns once every rank has joined, so rank 0 may then delete the id
# from the store; the fake returns at once, and the other rank could find the id gone.
import collectives.transports.nccl as nccl_transport
nccl_transport._forget_unique_id = lambda rank, world_size, store: None

dist.init_process_group("nccl", timeout=30)
rank, transport = dist.get_rank(), dist.group.WORLD.transport
report(rank=rank, size=dist.get_world_size(), ndev=transport.comm.ndev, device=transport.device,
       uid=hashlib.sha256(transport.comm.uid).hexdigest())
if os.environ.get("RAISE_ON") == str(rank):
    raise RuntimeError(f"rank {rank} fails")
if os.environ.get("RAISE_ON"):
    time.sleep(60)                 # a peer blocked on it (in a real job: inside an NCCL call)
dist.destroy_process_group()
"""



@needs_mpi
def test_nccl_under_mpiexec_takes_rank_size_and_unique_id_from_mpi(tmp_path):
    # before: ValueError: rendezvous 'env://': environment variable MASTER_ADDR is not set
    job = mpi_job(tmp_path, JOB, 2, env={"HELPERS_DIR": HELPERS}, limit=60)
    assert job["rc"] == 0, explain(job)
    by_rank = {r["rank"]: r for r in job["results"]}
    assert sorted(by_rank) == [0, 1], explain(job)
    assert {r["size"] for r in by_rank.values()} == {2}
    assert {r["ndev"] for r in by_rank.values()} == {2}
    assert len({r["uid"] for r in by_rank.values()}) == 1      # one id, from rank 0 by MPI
    assert [by_rank[r]["device"] for r in (0, 1)] == [0, 1]     # the MPI local rank


@needs_mpi
def test_a_rank_that_raises_under_mpiexec_aborts_nccl_and_the_job(tmp_path):
    # The fake's abort marks a file: its stdout line races MPI_Abort, which may end the job
    # before mpiexec forwards what rank 1 wrote (seen once in CI).
    job = mpi_job(tmp_path, JOB, 2, env={"HELPERS_DIR": HELPERS, "RAISE_ON": "1",
                                         "ABORT_MARKS": str(tmp_path)}, limit=60)
    assert job["rc"] != 0 and job["wall"] < CI_BOUND, explain(job)
    assert (tmp_path / "aborted.1").exists(), explain(job)
    assert "RuntimeError: rank 1 fails" in job["stderr"], explain(job)
    assert ("rank 1 of 2 raised an uncaught RuntimeError; aborting its NCCL communicator and "
            "the MPI job") in job["stderr"], explain(job)


def test_a_rank_that_raises_under_the_launcher_aborts_its_communicator(tmp_path):
    # before: the communicator was left to be destroyed at exit, which on GPUs waited on the
    # peers blocked in NCCL calls: the launcher never saw the rank fail
    script = write_script(tmp_path, JOB)
    env = _env({"HELPERS_DIR": HELPERS, "RAISE_ON": "1"})
    proc = subprocess.run([sys.executable, "-m", "collectives.run", "--standalone",
                           "--nproc-per-node", "2", script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "[rank 1]:ABORTED rank 1" in proc.stdout, out
    assert "rank 1 of 2 raised an uncaught RuntimeError; aborting its NCCL communicator\n" \
        in proc.stderr, out
    assert "worker rank 1" in proc.stderr, out
