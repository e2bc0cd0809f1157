"""The facade under a real torchrun: its agent runs torch's TCPStore at MASTER_ADDR:MASTER_PORT
(TORCHELASTIC_USE_AGENT_STORE=True), which our store protocol cannot talk to. The ranks reach
it through torch's client; a rank without torch says so at once, with what to do, instead of
waiting out the init timeout for a server that never answers."""
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from repo import ROOT, child_env

pytest.importorskip("torch", reason="torchrun and torch's TCPStore come with torch")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))
pytestmark = pytest.mark.skipif(TORCHRUN is None,
                                reason="torchrun is not installed beside this Python")
LIMIT = 90              # s for a whole torchrun job; a hang is killed and fails the test


def torchrun(tmp_path, script, *args):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    env = child_env({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    for name in ("COLLECTIVES_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT", "RANK",
                 "WORLD_SIZE"):
        env.pop(name, None)
    proc = subprocess.Popen([TORCHRUN, "--standalone", "--nproc-per-node", "2", str(path),
                             *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(proc.pid), proc.pid]:    # workers run in their own sessions
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        err += f"\n[killed by the test after {LIMIT} s: a hang]"
    return proc.returncode, out, err


def _descendants(pid):
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


JOB = """
    import os
    import sys
    import numpy as np
    if sys.argv[1:] == ["without-torch"]:
        sys.modules["torch"] = None             # this rank's Python has no torch
    import collectives as dist

    dist.init_process_group("socket", timeout=float(sys.argv[2]) if sys.argv[2:] else 1800)
    rank, size = dist.get_rank(), dist.get_world_size()
    x = np.full(1000, rank + 1.0)
    dist.all_reduce(x)
    dist.barrier()
    dist.destroy_process_group()
    dist.init_process_group("socket", timeout=30)       # again, on the same agent store
    dist.all_reduce(x)
    os.write(1, f"RESULT {rank} {size} {x[0]}\\n".encode())    # one write: lines never mix
    dist.destroy_process_group()
"""


def test_the_facade_runs_on_torchruns_agent_store(tmp_path):
    rc, out, err = torchrun(tmp_path, JOB, "with-torch", "30")
    assert rc == 0, out + err[-4000:]
    results = sorted(line.split()[1:] for line in out.splitlines() if line.startswith("RESULT"))
    assert results == [["0", "2", "6.0"], ["1", "2", "6.0"]], out + err[-4000:]


def test_without_torch_a_rank_says_what_to_do_at_once(tmp_path):
    rc, out, err = torchrun(tmp_path, JOB, "without-torch")    # the default 30 min timeout
    assert rc != 0 and "killed by the test" not in err, err[-4000:]
    # (torchrun stops the other rank once one fails: it may never get to say it)
    assert re.search(r"RuntimeError: init_process_group on rank [01]: "
                     r"TORCHELASTIC_USE_AGENT_STORE is set", err), err[-4000:]
    assert "python -m collectives.run" in err and "install torch" in err, err[-4000:]
