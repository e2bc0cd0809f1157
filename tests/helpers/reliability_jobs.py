"""Helpers for the reliability tests: run a small script as a real multi-process job, on the
socket transport (one ``python`` per rank, env:// rendezvous) or under ``mpiexec``, and read
back what every rank reported.

A job is a program in the jobs folder (``job(name)``: tests/processes/jobs/), or a text that
runs after a prelude of the same imports; it reports with ``reporting.report(**fields)``, one
``RESULT <json>`` line; the helpers return one dict per rank with
``rc``, ``results`` (the parsed reports), ``stdout``/``stderr`` and ``wall`` seconds. Every
process is killed at ``limit`` seconds, so a hang is a test failure, never a stuck CI.

``VethPair`` makes two "hosts" on one machine (two network namespaces joined by a veth pair,
root only) for the two-host and slow-link tests.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import mpiexec
from repo import JOBS, ROOT, child_env  # noqa: F401  (ROOT: the tests that run from the checkout)

# what a job given as text runs first: the imports every job file makes, and ``reporting``
# (``report``, ``failure``, ``rss_mib``) from the jobs folder
PRELUDE = f'''\
import json, os, signal, sys, threading, time
import numpy as np
import collectives as dist
from collectives.errors import CollectiveError, CollectiveTimeout, TransportError
sys.path.insert(0, {JOBS!r})
from reporting import failure, report, rss_mib
'''


def job(name: str) -> str:
    """The path of a job program in the jobs folder (tests/processes/jobs/)."""
    return os.path.join(JOBS, name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = child_env({"PYTHONUNBUFFERED": "1"})
    for name in ("COLLECTIVES_ALGORITHM", "COLLECTIVES_DEBUG", "COLLECTIVES_SECRET",
                 "COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    env.update(extra or {})
    return env


def write_script(tmp_path, body: str, name="job.py") -> str:
    """The script to run: ``body`` itself where it is a job file (``job(name)``), else the
    text ``body`` after the prelude, written to ``tmp_path``."""
    if body.endswith(".py") and os.path.isfile(body):
        return body
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
                 "WORLD_SIZE": str(size), "COLLECTIVES_SECRET": "reliability-test-secret"}
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


def mpi_job(tmp_path, body, n, *, env=None, limit=60):
    """Run ``body`` under ``mpiexec -n n``: one record (rc, results of all ranks, output)."""
    script = write_script(tmp_path, body)
    command = mpiexec.command(n, script)
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


# ---------------------------------------------------------------------------------------------
# Two "hosts" on one machine: network namespaces joined by a veth pair (needs root, iproute2).

_PAIRS_MADE = 0


def _run(command, timeout=20):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(command, 1, "", f"{type(exc).__name__}: {exc}")


class VethPair:
    """Two fresh network namespaces, each holding one end of a veth pair, addressed
    ``10.<s>.<t>.1`` and ``.2``. Names and subnet are derived from the pid and a counter, so
    concurrent runs and several pairs per run never collide. ``create()`` returns None, or the
    reason it cannot be done (not root, no ``ip``, the kernel refuses); ``close()`` removes
    everything and is safe to call at any point, twice included."""

    def __init__(self, label: str):
        global _PAIRS_MADE
        _PAIRS_MADE += 1
        pid = os.getpid()
        tag = f"{pid % 100000}{_PAIRS_MADE % 10}"
        self.namespaces = (f"coll-{label}a{tag}", f"coll-{label}b{tag}")
        self.devices = (f"v{label}a{tag}"[:15], f"v{label}b{tag}"[:15])
        subnet = f"10.{100 + _PAIRS_MADE % 100}.{pid % 250 + 1}"
        self.addresses = (f"{subnet}.1", f"{subnet}.2")
        self._made: list = []

    def exec_prefix(self, side: int) -> list:
        return ["ip", "netns", "exec", self.namespaces[side]]

    def run_in(self, side: int, *command, timeout=20):
        return _run([*self.exec_prefix(side), *command], timeout=timeout)

    def create(self):
        if os.geteuid() != 0:
            return "network namespaces need root (run as root, as CI does)"
        if not shutil.which("ip"):
            return "needs iproute2's `ip`: apt-get install -y iproute2"
        for ns in self.namespaces:
            result = _run(["ip", "netns", "add", ns])
            if result.returncode:
                return f"cannot create a network namespace (ip netns add): {result.stderr.strip()}"
            self._made.append(ns)
        (a, b), (va, vb), (addr_a, addr_b) = self.namespaces, self.devices, self.addresses
        steps = [
            ("link", "add", va, "type", "veth", "peer", "name", vb),
            ("link", "set", va, "netns", a), ("link", "set", vb, "netns", b),
            ("-n", a, "addr", "add", f"{addr_a}/24", "dev", va),
            ("-n", b, "addr", "add", f"{addr_b}/24", "dev", vb),
            ("-n", a, "link", "set", va, "up"), ("-n", b, "link", "set", vb, "up"),
            ("-n", a, "link", "set", "lo", "up"), ("-n", b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            result = _run(["ip", *step])
            if result.returncode:
                return f"cannot set up the veth pair (ip {' '.join(step)}): {result.stderr.strip()}"
        return None

    def qdisc_stats(self, side: int) -> dict:
        """``tc -s qdisc show`` of this side's veth end: the text and the packets dropped."""
        result = self.run_in(side, "tc", "-s", "qdisc", "show", "dev", self.devices[side])
        dropped = sum(int(n) for n in re.findall(r"dropped (\d+)", result.stdout))
        return {"text": result.stdout.strip(), "dropped": dropped}

    def tcp_retransmits(self, side: int) -> int:
        """TCP segments retransmitted in this namespace (its own MIB counters), -1 if unknown."""
        result = self.run_in(side, "cat", "/proc/net/snmp")
        rows = [line.split() for line in result.stdout.splitlines() if line.startswith("Tcp:")]
        if len(rows) != 2 or "RetransSegs" not in rows[0]:
            return -1
        return int(rows[1][rows[0].index("RetransSegs")])

    def close(self):
        # A veth end dies with its namespace, taking its peer along; one left in the root
        # namespace (setup failed half-way) is removed by name.
        for ns in self._made:
            _run(["ip", "netns", "del", ns])
        self._made = []
        for dev in self.devices:
            if os.path.exists(f"/sys/class/net/{dev}"):
                _run(["ip", "link", "del", dev])


# ---------------------------------------------------------------------------------------------
# Jobs the socket and the MPI tests both run (BACKEND picks the transport), and their checks.

CI_BOUND = 10.0          # the promise is 5 s; CI gets slack for a loaded 2-core machine

NEVER_ARRIVES = job("never_arrives.py")


MISMATCHES = job("detail_mismatches.py")


def check_detail_reports(results_by_rank):
    """Every rank raised CollectiveError for every case, naming the field and rank 1."""
    for rank, results in enumerate(results_by_rank):
        by_case = {r["case"]: r for r in results}
        for case in ("counts", "dtype", "op", "operation", "root", "algorithm"):
            got = by_case[case]
            assert got.get("type") == "CollectiveError", (rank, got)
            message = got["message"]
            assert f"on rank {rank}" in message and "mismatched calls" in message, message
            assert case in message, (case, message)
            assert ("ranks [1] differ" in message) if rank != 1 else \
                ("ranks [0,2] differ" in message), message
            assert got["waited"] < CI_BOUND, got
        assert by_case["after"]["ok"] is True, results


SIZE_MISMATCH = job("size_mismatch.py")


# Mismatched calls without COLLECTIVES_DEBUG=DETAIL: messages of the right length, which a
# transport that carries no signature would match (rank 1 would reduce float32 bytes as
# int32). Every rank must raise, naming both calls; the sizes case must say sizes.
CALL_MISMATCHES = job("call_mismatches.py")

# what each case's message must name: both calls' differing field, or the sizes
CALL_MISMATCH_WORDS = {"dtype": ("float32", "int32"), "op": ("SUM", "MAX"),
                       "sizes": ("mismatched sizes",)}


def check_call_mismatch_reports(results_by_rank):
    """Every rank raised a CollectiveError (never a timeout, never a success with another
    call's bytes) for every case, naming this rank, the mismatch and both calls."""
    for rank, results in enumerate(results_by_rank):
        cases = [r for r in results if r["case"] in CALL_MISMATCH_WORDS]
        assert len(cases) == 12, results
        for got in cases:
            assert got.get("type") in ("CallMismatch", "CollectiveError"), (rank, got)
            message = got["message"]
            assert f"all_reduce ({got['algorithm'] or ''}" in message, message
            assert f"on rank {rank}" in message and "mismatched" in message, message
            assert re.search(r"from rank \d|rank \d left this call", message), message
            for word in CALL_MISMATCH_WORDS[got["case"]]:
                assert word in message, (word, message)
            assert got["waited"] < CI_BOUND, got
        after = [r for r in results if r["case"] == "after"]
        assert after and after[0]["ok"] is True, results
