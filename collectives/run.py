"""The launcher: ``python -m collectives.run --nproc-per-node N script.py args...``.

torchrun's flags and environment: ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``, ``--standalone`` (one node, loopback, a free port), and
``-m module`` in place of a script. Each worker gets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and COLLECTIVES_SECRET: yours if set,
else a fresh random secret per job on one node. With several nodes and no COLLECTIVES_SECRET
the launcher says so and every process uses this user's secret file (``collectives.auth``),
which works where the nodes share the home directory; otherwise set COLLECTIVES_SECRET,
identically, on every node.

Node 0's launcher runs the TCPStore server itself (it outlives any worker, and holds its port
from the start, so ``--standalone`` has no port race); workers connect to it as clients
(COLLECTIVES_USE_AGENT_STORE=1). Every output line is prefixed ``[rank N]:``. When a worker
fails, the launcher stops the others (SIGTERM, then SIGKILL after a grace period) and exits
with that worker's code, naming it. Limits: no elastic restarts (``--nnodes 1:4`` is refused).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from .auth import SECRET_ENV, SecretFileError, job_secret, new_secret, secret_file_path

GRACE_SECONDS = 5.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="collectives-run",
        description="Start N worker processes per node with torchrun's environment variables.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1",
                   help="workers on this node: an integer, or 'auto'/'cpu' for one per CPU core")
    p.add_argument("--nnodes", default="1", help="number of nodes (a fixed integer)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=29500)
    p.add_argument("--standalone", action="store_true",
                   help="one node: loopback address and a free port chosen by the launcher")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run the target as an executable, not through python")
    p.add_argument("target", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = p.parse_args(argv)

    if ns.nproc_per_node in ("auto", "cpu"):
        ns.nproc_per_node = os.cpu_count() or 1
    try:
        ns.nproc_per_node = int(ns.nproc_per_node)
    except ValueError:
        p.error(f"--nproc-per-node must be an integer or 'auto', got {ns.nproc_per_node!r}")
    try:
        ns.nnodes = int(ns.nnodes)
    except ValueError:
        p.error(f"--nnodes must be a fixed integer (elastic ranges are not supported), "
                f"got {ns.nnodes!r}")
    if ns.nproc_per_node < 1 or ns.nnodes < 1:
        p.error("--nproc-per-node and --nnodes must be >= 1")
    if not 0 <= ns.node_rank < ns.nnodes:
        p.error(f"--node-rank {ns.node_rank} is out of range for --nnodes {ns.nnodes}")
    if ns.standalone:
        if ns.nnodes != 1:
            p.error("--standalone means one node; drop --nnodes or --standalone")
        ns.master_addr, ns.master_port = "127.0.0.1", 0
    if ns.module and ns.no_python:
        p.error("-m and --no-python cannot be combined")
    return ns


def _pump(stream, sink, prefix: bytes):
    """Copy ``stream`` to ``sink`` line by line, each line prefixed; binary-safe."""
    for line in iter(stream.readline, b""):
        sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        sink.flush()
    stream.close()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode      # killed by signal N -> 128+N


def launch(ns) -> int:
    world_size = ns.nproc_per_node * ns.nnodes
    secret = os.environ.get(SECRET_ENV)
    if not secret and ns.nnodes == 1:
        secret = new_secret()          # one node: a secret for this job alone
    elif not secret:
        # Several nodes: a secret made here could not reach the other nodes' launchers, so
        # every process falls back to the per-user secret file. Check it now, and say loudly
        # that the nodes must share it.
        try:
            job_secret()
        except SecretFileError as exc:
            sys.stderr.write(f"collectives.run: {exc}\n")
            return 2
        sys.stderr.write(f"collectives.run: --nnodes {ns.nnodes} without {SECRET_ENV}: every "
                         f"process authenticates with the per-user secret file "
                         f"{secret_file_path()}, so the job works only if every node has the "
                         f"same file (a shared home directory). Otherwise set {SECRET_ENV} to "
                         f"one value on every node, e.g. $(python -c 'import secrets; "
                         f"print(secrets.token_hex(32))')\n")
        secret = None

    store = None
    if ns.node_rank == 0:
        from .store import TCPStore
        # Listen on the master address's interface only (loopback for --standalone).
        store = TCPStore(ns.master_addr, ns.master_port, world_size, is_master=True,
                         wait_for_workers=False, secret=secret)
        port = store.port
    else:
        port = ns.master_port

    if ns.no_python:
        command = [ns.target]
    elif ns.module:
        command = [sys.executable, "-u", "-m", ns.target]
    else:
        command = [sys.executable, "-u", ns.target]
    command += ns.args

    workers = []
    pumps = []
    for local_rank in range(ns.nproc_per_node):
        rank = ns.node_rank * ns.nproc_per_node + local_rank
        env = dict(os.environ)
        env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                   LOCAL_WORLD_SIZE=str(ns.nproc_per_node), GROUP_RANK=str(ns.node_rank),
                   ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size),
                   MASTER_ADDR=ns.master_addr, MASTER_PORT=str(port),
                   PYTHONUNBUFFERED="1", **({SECRET_ENV: secret} if secret else {}))
        env["COLLECTIVES_USE_AGENT_STORE"] = "1"     # node 0's launcher runs the store
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=False)
        prefix = f"[rank {rank}]:".encode()
        for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=_pump, args=(stream, sink, prefix), daemon=True)
            t.start()
            pumps.append(t)
        workers.append((rank, local_rank, proc))

    def forward(signum, _frame):
        for _, _, proc in workers:
            if proc.poll() is None:
                proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = None
    try:
        while True:
            running = 0
            for rank, local_rank, proc in workers:
                code = proc.poll()
                if code is None:
                    running += 1
                elif code != 0 and failed is None:
                    failed = (rank, local_rank, proc, code)
            if failed is not None or running == 0:
                break
            time.sleep(0.05)
        if failed is not None:
            _stop(workers)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for t in pumps:
            t.join(2.0)
        if store is not None:
            store.close()

    if failed is None:
        return 0
    rank, local_rank, proc, code = failed
    how = (f"was killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
           else f"exited with code {code}")
    sys.stderr.write(f"collectives.run: worker rank {rank} (local rank {local_rank}, pid "
                     f"{proc.pid}) {how}; stopped the other workers\n")
    sys.stderr.flush()
    return _exit_code(code)


def _stop(workers):
    for _, _, proc in workers:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + GRACE_SECONDS
    for _, _, proc in workers:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv=None) -> None:
    sys.exit(launch(parse_args(argv)))


if __name__ == "__main__":
    main()
