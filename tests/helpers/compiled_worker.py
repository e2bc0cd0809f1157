"""The start every compiled-executor worker under ``mpiexec`` shares (test_compiled_executor,
test_window): the MPI world, or the SKIP line its launching test reads when mpi4py or the
compiled executor is missing here; and, for the launching test, why it cannot launch."""
import importlib.util


def launch_skip_reason():
    """Why a test cannot run compiled-executor workers under mpiexec here, or None."""
    import mpiexec      # here, not at the top: the workers themselves need no pytest
    if not mpiexec.have_mpi():
        return mpiexec.SKIP_REASON
    try:
        built = importlib.util.find_spec("collectives.executors._mpi_exec") is not None
    except ImportError:          # collectives itself not importable from here
        built = False
    if not built:
        return ("compiled executor not built: run `python setup.py build_ext --inplace` "
                "(needs Cython and mpi.h)")
    return None


def compiled_world():
    """(comm, rank, size) when mpi4py and the compiled executor are usable; else None, after
    printing why (rank 0 for the executor; every rank when mpi4py itself is missing)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        print(f"SKIP mpi4py: {exc}", flush=True)
        return None
    from collectives.executors import compiled
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if not compiled.available():
        if rank == 0:
            print(f"SKIP compiled executor unavailable: {compiled.status()}", flush=True)
        return None
    return comm, rank, size
