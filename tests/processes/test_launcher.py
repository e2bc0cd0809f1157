"""The launcher with real processes: torchrun's environment, output prefixes, failure
propagation and exit codes, ``-m``; and an unmodified gloo-style script, both under the
launcher and started by hand with multiprocessing and MASTER_ADDR/MASTER_PORT."""
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np

from repo import ROOT


def launch(tmp_path, script, *flags, args=(), timeout=60):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLLECTIVES_SECRET", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "collectives.run", *flags, str(path), *args],
                          env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return proc, time.monotonic() - t0


def test_environment_and_prefixes(tmp_path):
    script = """
        import json, os
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "COLLECTIVES_SECRET"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
        print("second line")
    """
    proc, _ = launch(tmp_path, script, "--standalone", "--nproc-per-node", "3")
    assert proc.returncode == 0, proc.stderr
    records = {}
    for line in proc.stdout.splitlines():
        prefix, _, rest = line.partition(":")
        assert prefix.startswith("[rank ") and prefix.endswith("]"), line
        if rest.startswith("{"):
            records[int(prefix[6:-1])] = json.loads(rest)
    assert sorted(records) == [0, 1, 2]
    assert proc.stdout.count("second line") == 3
    secrets = {r["COLLECTIVES_SECRET"] for r in records.values()}
    assert len(secrets) == 1 and len(secrets.pop()) >= 32        # one fresh secret per job
    for rank, env in records.items():
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3" and env["GROUP_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0


def test_bind_to_core_puts_each_worker_on_one_core_of_the_launcher_s(tmp_path):
    """--bind-to core: local rank i runs on the i-th core the launcher may use (round robin
    past the last), from before it runs anything; without it every worker may use them all.
    (On the 2-core VM the bench's ranks bound so moved 18-23 % between rounds, unbound
    51-54 %: BENCHMARKS.md section 4.)"""
    script = """
        import json, os
        print(json.dumps([int(os.environ["LOCAL_RANK"]), sorted(os.sched_getaffinity(0))]))
    """
    mine = sorted(os.sched_getaffinity(0))
    for flags, expect in ((("--bind-to", "core"), lambda i: [mine[i % len(mine)]]),
                          ((), lambda i: mine)):
        proc, _ = launch(tmp_path, script, "--standalone", "--nproc-per-node", "3", *flags)
        assert proc.returncode == 0, proc.stderr
        seen = dict(json.loads(line.partition(":")[2]) for line in proc.stdout.splitlines())
        assert seen == {i: expect(i) for i in range(3)}, (flags, seen)


def test_failure_stops_the_others_and_propagates_the_code(tmp_path):
    script = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            time.sleep(0.3)        # fails once the others run (either way, they must stop)
            sys.exit(3)
        time.sleep(60)
    """
    proc, elapsed = launch(tmp_path, script, "--standalone", "--nproc-per-node", "3")
    assert proc.returncode == 3
    assert "worker rank 1" in proc.stderr and "code 3" in proc.stderr
    assert elapsed < 20


def test_the_first_worker_to_fail_is_named_not_the_peers_that_fail_because_of_it(tmp_path):
    """Rank 2 leaves with code 3 while its peers wait for it in a collective: they fail at
    once (and may end before it, which closes its connections first), yet the launcher names
    rank 2 and its code and returns 3; peers that ended on their own meanwhile are called
    consequences (the others are stopped); the peers' errors say rank 2 left with code 3."""
    script = """
        import os, sys
        import numpy as np
        import collectives as dist
        dist.init_process_group("gloo")
        x = np.ones(1000)
        dist.all_reduce(x)
        if dist.get_rank() == 2:
            sys.exit(3)
        dist.all_reduce(x)
    """
    proc, elapsed = launch(tmp_path, script, "--standalone", "--nproc-per-node", "3")
    assert proc.returncode == 3, proc.stderr
    assert re.search(r"collectives.run: worker rank 2 \(local rank 2, pid \d+\) exited with "
                     r"code 3, the first to fail; stopped the other workers", proc.stderr), \
        proc.stderr
    assert proc.stderr.count("the first to fail") == 1, proc.stderr
    after = re.findall(r"collectives.run: after it, (.*) \(consequences of that failure\)",
                       proc.stderr)
    assert after in ([], ["worker rank 0 exited with code 1"], ["worker rank 1 exited with code 1"],
                     ["worker rank 0 exited with code 1, worker rank 1 exited with code 1"]), \
        proc.stderr
    for rank in (0, 1):
        assert re.search(rf"\[rank {rank}\]:.*TransportError: .*rank 2 aborted the job: exiting "
                         rf"with code 3", proc.stderr), proc.stderr
    assert elapsed < 20


def test_killed_worker_exit_code(tmp_path):
    script = """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """
    proc, elapsed = launch(tmp_path, script, "--standalone", "--nproc-per-node", "2")
    assert proc.returncode == 128 + 9 and "SIGKILL" in proc.stderr and elapsed < 20


def test_bad_flags():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "collectives.run", "--nnodes", "1:4", "x.py"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "elastic" in proc.stderr


GLOO_SCRIPT = """
    import sys
    import numpy as np
    import collectives as dist

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    data = np.full(1000, rank + 1.0, np.float32)
    dist.all_reduce(data)
    assert (data == size * (size + 1) / 2).all(), data[:4]
    print("sum", float(data[0]), "args", sys.argv[1:])
    dist.destroy_process_group()
"""


def test_gloo_script_under_the_launcher(tmp_path):
    proc, _ = launch(tmp_path, GLOO_SCRIPT, "--standalone", "--nproc-per-node", "3",
                     args=("--lr", "0.1"))
    assert proc.returncode == 0, proc.stderr
    for rank in range(3):
        assert f"[rank {rank}]:sum 6.0 args ['--lr', '0.1']" in proc.stdout


def test_module_mode(tmp_path):
    (tmp_path / "mymod.py").write_text("import os; print('module rank', os.environ['RANK'])\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "collectives.run", "--standalone",
                           "--nproc-per-node", "2", "-m", "mymod"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "[rank 1]:module rank 1" in proc.stdout


def _tutorial_worker(rank, size, port, results):
    # The torch.distributed tutorial pattern: the parent sets MASTER_ADDR/PORT by hand.
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import collectives as dist
    dist.init_process_group("gloo", rank=rank, world_size=size)
    data = np.arange(8, dtype=np.float64) * (rank + 1)
    dist.all_reduce(data)
    results.put((rank, data.tolist()))
    dist.destroy_process_group()


def test_multiprocessing_with_master_addr_by_hand():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_tutorial_worker, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    expected = (np.arange(8) * 3.0).tolist()
    assert got == {0: expected, 1: expected}
