"""A world size given to init_process_group that the launcher's disagrees with: the launcher
started 2 ranks, the script asks for 4. Every rank says so at once (a ValueError naming the
rank, the argument and $WORLD_SIZE, or under mpiexec MPI's size) instead of waiting out the
init timeout for ranks 2 and 3, which nobody started."""
import subprocess
import sys
import textwrap

import mpiexec
from repo import child_env

SCRIPT = """
    import collectives as dist
    dist.init_process_group("gloo", world_size=4, timeout=20)
    print("joined a world of", dist.get_world_size())
"""


def test_a_world_size_the_launcher_did_not_start_is_an_error_at_once(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = child_env()
    env.pop("COLLECTIVES_SECRET", None)
    proc = subprocess.run([sys.executable, "-m", "collectives.run", "--standalone",
                           "--nproc-per-node", "2", str(path)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "joined" not in said, said
    assert "ValueError: init_process_group on rank " in said, said
    assert "world_size=4 was given, but the launcher started 2 ranks (WORLD_SIZE=2)" in said, said
    assert "did not arrive" not in said, said                   # no wait for ranks 2 and 3


@mpiexec.needs_mpi
def test_under_mpiexec_every_rank_names_itself_the_argument_and_mpis_size(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(SCRIPT).replace('"gloo"', '"mpi"'))
    proc = mpiexec.mpirun(2, path)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "joined" not in said, said
    for rank in (0, 1):
        assert f"ValueError: mpi transport on rank {rank}: world_size=4 was given but MPI " \
               f"says 2 (mpiexec started 2 ranks" in said, said
