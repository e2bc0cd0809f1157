"""What the tests of every layer share.

Layers, one folder each: ``schedules/`` (pure schedules, lowering, the cost model, the
simulator: no transport), ``local/`` (threads as ranks in this process: the local transport,
the facade, kernels, the fake NCCL), ``processes/`` (real processes: mpiexec, the socket
transport, the launcher, stores, the torch backend), ``reliability/`` (faults, attacks, load,
slow links, two hosts), ``gpu/`` (marked ``gpu``). The markers are registered in setup.cfg.

Helper modules the layers share live in ``helpers/``, put on ``sys.path`` here, so a test
imports ``socket_ranks`` or ``reliability_jobs``, never another test module."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

import local_ranks  # noqa: E402  (needs the path above)
import mpiexec  # noqa: E402
import reliability_jobs  # noqa: E402
from socket_ranks import STORE_SECRET  # noqa: E402


@pytest.fixture
def local_group():
    """``run(n, fn, *args)``: ``fn(rank, *args)`` on n threads, each rank inside the local
    backend's process group; the results in rank order."""
    return local_ranks.spawn


@pytest.fixture
def tcp_store():
    """A TCPStore server on a free port of 127.0.0.1 (secret ``socket_ranks.STORE_SECRET``),
    closed after the test."""
    from collectives.store import TCPStore
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=10,
                     secret=STORE_SECRET)
    yield store
    store.close()


@pytest.fixture
def mpi_command():
    """``command(n, *args)``: the mpiexec command line (Open MPI's root and oversubscribe flags
    where it needs them) that runs ``python args...`` on n ranks; skips without MPI."""
    if not mpiexec.have_mpi():
        pytest.skip(mpiexec.SKIP_REASON)
    return mpiexec.command


@pytest.fixture
def socket_job(tmp_path):
    """``run(body, size, **options)``: a job script on ``size`` processes over the socket
    transport (env:// rendezvous); one record per rank (``reliability_jobs.socket_job``)."""
    def run(body, size, **options):
        return reliability_jobs.socket_job(tmp_path, body, size, **options)
    return run


@pytest.fixture
def mpi_job(tmp_path):
    """``run(body, n, **options)``: a job script under ``mpiexec -n n``; one record for the
    job (``reliability_jobs.mpi_job``). Skips without MPI."""
    if not mpiexec.have_mpi():
        pytest.skip(mpiexec.SKIP_REASON)

    def run(body, n, **options):
        return reliability_jobs.mpi_job(tmp_path, body, n, **options)
    return run
