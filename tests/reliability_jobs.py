"""Helpers for the reliability tests: run a small script as a real multi-process job, on the
socket transport (one ``python`` per rank, env:// rendezvous) or under ``mpiexec``, and read
back what every rank reported.

A job script gets a prelude (imports, ``RANK``, ``report(**fields)``, ``rss_mib()``) and
reports by printing one ``RESULT <json>`` line; the helpers return one dict per rank with
``rc``, ``results`` (the parsed reports), ``stdout``/``stderr`` and ``wall`` seconds. Every
process is killed at ``limit`` seconds, so a hang is a test failure, never a stuck CI.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = '''\
import json, os, signal, sys, threading, time
import numpy as np
import collectives as dist
from collectives.errors import CollectiveError, CollectiveTimeout, TransportError

def report(**fields):
    # one write(2) per line, so lines of ranks sharing mpiexec's stdout never interleave
    sys.stdout.flush()
    os.write(1, ("RESULT " + json.dumps(fields) + "\\n").encode())

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1.0

def failure(exc):
    return {"type": type(exc).__name__, "message": str(exc), "at": time.time()}
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    for name in ("COLLECTIVES_ALGORITHM", "COLLECTIVES_DEBUG", "COLLECTIVES_SECRET",
                 "COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    env.update(extra or {})
    return env


def write_script(tmp_path, body: str, name="job.py") -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as f:
        f.write(PRELUDE + textwrap.dedent(body))
    return path


def parse(stdout: str) -> list:
    return [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]


def socket_job(tmp_path, body, size, *, env=None, per_rank_env=None, limit=60, prefix=()):
    """Run ``body`` on ``size`` processes with env:// rendezvous; one record per rank.
    ``prefix`` wraps each rank's command (e.g. ``ip netns exec ns1``), per rank: a dict."""
    script = write_script(tmp_path, body)
    port = free_port()
    procs = []
    for rank in range(size):
        extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                 "WORLD_SIZE": str(size), "COLLECTIVES_SECRET": "reliability-test"}
        extra.update(env or {})
        extra.update((per_rank_env or {}).get(rank, {}))
        command = [*(prefix.get(rank, ()) if isinstance(prefix, dict) else prefix),
                   sys.executable, script]
        procs.append(subprocess.Popen(command, env=_env(extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)))
    return _collect(procs, limit)


def _collect(procs, limit):
    t0 = time.monotonic()
    records = []
    for proc in procs:
        left = max(0.1, limit - (time.monotonic() - t0))
        try:
            out, err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    other.kill()
            out, err = proc.communicate()
            err += f"\n[killed by the test harness after {limit} s: a hang]"
        records.append({"rc": proc.returncode, "results": parse(out), "stdout": out,
                        "stderr": err, "wall": time.monotonic() - t0})
    return records


def find_mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def have_mpi() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return find_mpiexec() is not None


def mpi_job(tmp_path, body, n, *, env=None, limit=60):
    """Run ``body`` under ``mpiexec -n n``: one record (rc, results of all ranks, output)."""
    script = write_script(tmp_path, body)
    command = [find_mpiexec(), "-n", str(n), sys.executable, script]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        err += f"\n[killed by the test harness after {limit} s: a hang]"
    return {"rc": proc.returncode, "results": parse(out), "stdout": out, "stderr": err,
            "wall": time.monotonic() - t0}


def explain(records) -> str:
    """Every rank's output, for assertion messages."""
    if isinstance(records, dict):
        records = [records]
    return "\n".join(f"--- process {i}: rc={r['rc']} wall={r['wall']:.2f}s\n{r['stdout'][-3000:]}"
                     f"\n{r['stderr'][-3000:]}" for i, r in enumerate(records))
