"""A world size given to init_process_group that the launcher's disagrees with: the launcher
started 2 ranks, the script asks for 4. Every rank says so at once (a ValueError naming the
rank, the argument and $WORLD_SIZE) instead of waiting out the init timeout for ranks 2 and
3, which nobody started."""
import subprocess
import sys
import textwrap

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
