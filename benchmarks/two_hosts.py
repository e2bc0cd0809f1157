"""Two hosts on one machine: flat against hierarchical collectives over a slow link.

Makes two network namespaces joined by a veth pair (the two-host tests' ``VethPair``), shapes
the link in both directions with ``tc`` (``netem`` rate and delay where the kernel has it,
else ``tbf``: the rate alone, no added delay), and runs the bench (``benchmarks/bench.py
--backend socket``) as a two-node job: one ``python -m collectives.run --nnodes 2`` launcher
per namespace, ``--per-host`` ranks each, ``COLLECTIVES_TOPOLOGY=2x<per-host>``. Inside a
namespace the socket transport takes shared memory (same boot id, hostname, network namespace
and uid); between them, TCP over the shaped veth. Then it prints, per collective and size,
each algorithm's measured time beside the two-level model's prediction (the bench records'
``predicted_us``: inside a host the tuning file's or the transport's parameters, between
hosts the link as shaped: ``inter`` in the tuning file the job reads), the best flat and the
best hierarchical and their ratio, and ``auto``'s pick; and removes the namespaces.

Needs root and iproute2 (``ip``, ``tc``): exits 77 with the reason where the namespaces or
the shaping cannot be made. Every result is checked by the bench (exit 1 when any is wrong).

    sudo .venv/bin/python benchmarks/two_hosts.py --rate 1gbit --delay 2ms \\
        --out benchmarks/results/two_hosts_2x4_1gbit

``--calibrate`` fits the parameters inside a host on the job's own ranks first (ranks 0 and 1,
one host) instead of taking the transport's defaults; ``--tiny`` is the test's run (two
sizes, one round).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "helpers"))   # VethPair, the tests' helper

from collectives import tuning_file  # noqa: E402
from collectives.algorithms.params import DEFAULTS, Params  # noqa: E402

FLAT = ("ring", "recursive_doubling", "tree", "direct")
HIERARCHICAL = ("hierarchical:ring+ring", "hierarchical:ring+recursive_doubling",
                "hierarchical:recursive_doubling+recursive_doubling",
                "hierarchical:direct+direct")
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
SIZES = "64K:16M"
MASTER_PORT = 29533
SKIPPED = 77        # the exit status where two hosts cannot be made here (the reason on stderr)
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits(text: str) -> float:
    """``1gbit``, ``500mbit`` -> bits per second (tc's units)."""
    match = re.fullmatch(r"([0-9.]+)\s*([kmg]?bit)", text.strip().lower())
    if not match:
        raise ValueError(f"--rate {text!r}: expected a rate as tc writes it (1gbit, 500mbit)")
    return float(match.group(1)) * UNITS[match.group(2)]


def delay_seconds(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)\s*(ms|us|s)", text.strip().lower())
    if not match:
        raise ValueError(f"--delay {text!r}: expected 2ms, 500us or 0s")
    return float(match.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[match.group(2)]


def shape(pair, rate: str, delay: str) -> dict:
    """The qdisc on both veth ends: netem (rate and delay) where the kernel has it, else tbf
    (rate only). {"qdisc", "delay_s" (what was really added), "command"}; ValueError where
    neither works."""
    bits, wait = rate_bits(rate), delay_seconds(delay)
    # queue: a quarter of a second of the link, so TCP fills it without drops on a burst
    queue_bytes = max(1 << 20, int(bits / 8 / 4))
    choices = [("netem", ["netem", "delay", delay, "rate", rate,
                          "limit", str(max(1000, queue_bytes // 1500))]),
               ("tbf", ["tbf", "rate", rate, "burst", "256kb", "limit", str(queue_bytes)])]
    failed = {}
    for name, qdisc in choices:
        results = [pair.run_in(side, "tc", "qdisc", "add", "dev", pair.devices[side], "root",
                               *qdisc) for side in (0, 1)]
        errors = [r.stderr.strip() for r in results if r.returncode]
        if not errors:
            return {"qdisc": name, "delay_s": wait if name == "netem" else 0.0,
                    "command": "tc qdisc add dev <veth> root " + " ".join(qdisc)}
        failed[name] = errors[0]
        for side in (0, 1):
            pair.run_in(side, "tc", "qdisc", "del", "dev", pair.devices[side], "root")
    raise ValueError(f"cannot shape the veth link: {failed}")


def inter_params(rate: str, added_delay: float, intra: Params) -> Params:
    """The link as the two-level model prices it: a message costs the socket transport's own
    step (``intra.alpha``) plus the delay added on the link; one host's link carries
    ``rate`` of payload (TCP/IP headers: 1448 of every 1514 bytes on the wire); one rail."""
    payload = rate_bits(rate) / 8 * 1448 / 1514
    return Params(alpha=intra.alpha + added_delay, beta=1 / payload, gamma=intra.gamma)


def launch(pair, per_host: int, bench_args: list, env: dict, limit: float) -> list:
    """One ``collectives.run`` per namespace; [(returncode, stdout, stderr)] of node 0, 1.
    Both are killed (their whole process groups) at ``limit`` seconds."""
    procs = []
    for node in (0, 1):
        command = [*pair.exec_prefix(node), sys.executable, "-m", "collectives.run",
                   "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
                   str(per_host), "--master-addr", pair.addresses[0], "--master-port",
                   str(MASTER_PORT), os.path.join(ROOT, "benchmarks", "bench.py"),
                   *bench_args]
        # torch's gloo (the bench's baseline) on this namespace's end of the link
        procs.append(subprocess.Popen(command, env={**env, "GLOO_SOCKET_IFNAME":
                                                    pair.devices[node]},
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      start_new_session=True, cwd=ROOT))
    deadline = time.monotonic() + limit
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n[killed after {limit:.0f} s]"
        outputs.append((proc.returncode, out, err))
    return outputs


def job_env(tuning: str, topology: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    for name in ("COLLECTIVES_ALGORITHM", "COLLECTIVES_DEBUG"):
        env.pop(name, None)
    env.update({"COLLECTIVES_TUNING": tuning, "COLLECTIVES_TOPOLOGY": topology,
                "COLLECTIVES_SECRET": os.urandom(16).hex(), "PYTHONUNBUFFERED": "1"})
    return env


# ---------------------------------------------------------------------------------------------
# The report


def _ms(us):
    return "-" if us is None or not math.isfinite(us) else f"{us / 1e3:.2f}"


def compare(records) -> list[dict]:
    """Per (collective, size): every row's measured and predicted µs, the best flat and best
    hierarchical (measured), their ratio (> 1: hierarchical faster) and auto's pick."""
    rows: dict = {}
    for r in records:
        key = (r["collective"], r["size"])
        row = rows.setdefault(key, {"collective": r["collective"], "bytes": r["size"],
                                    "measured_us": {}, "predicted_us": {}, "wrong": 0})
        row["measured_us"][r["algorithm"]] = r["time_p50_us"]
        row["predicted_us"][r["algorithm"]] = r.get("predicted_us")
        row["wrong"] += r.get("wrong", 0)
        if r["algorithm"] == "auto":
            row["auto"] = r.get("chosen")
    out = []
    for key in sorted(rows, key=lambda k: (COLLECTIVES.index(k[0]) if k[0] in COLLECTIVES
                                           else 99, k[1])):
        row = rows[key]
        measured = row["measured_us"]
        flat = [(t, n) for n, t in measured.items() if n in FLAT]
        hier = [(t, n) for n, t in measured.items() if n.startswith("hierarchical:")]
        row["best_flat"] = min(flat)[::-1] if flat else None
        row["best_hierarchical"] = min(hier)[::-1] if hier else None
        row["speedup"] = (min(flat)[0] / min(hier)[0]) if flat and hier else None
        row["ratios"] = {n: measured[n] / p for n, p in row["predicted_us"].items()
                         if p and n in measured}
        out.append(row)
    return out


def table(rows) -> str:
    """Markdown: one table per collective, ms measured (predicted) per algorithm."""
    names = []
    for row in rows:
        names += [n for n in row["measured_us"] if n not in names and n != "auto"]
    short = {n: n.replace("hierarchical:", "h:").replace("recursive_doubling", "rd")
             for n in names}
    lines = []
    for collective in dict.fromkeys(r["collective"] for r in rows):
        mine = [r for r in rows if r["collective"] == collective]
        lines += ["", f"### {collective}: ms measured (predicted)", "",
                  "| size | " + " | ".join(short[n] for n in names) +
                  " | best flat / best hier. | auto picked |",
                  "|---" * (len(names) + 3) + "|"]
        for r in mine:
            cells = [f"{_ms(r['measured_us'].get(n))} ({_ms(r['predicted_us'].get(n))})"
                     for n in names]
            speed = f"{r['speedup']:.2f}" if r["speedup"] else "-"
            best = f"{short.get(r['best_flat'][0], '-')} / " \
                   f"{short.get(r['best_hierarchical'][0], '-')}" if r["speedup"] else ""
            auto = r.get("auto", "-") or "-"
            auto = auto.replace("hierarchical:", "h:").replace("recursive_doubling", "rd")
            lines.append(f"| {_size(r['bytes'])} | " + " | ".join(cells) +
                         f" | {speed} ({best}) | {auto} |")
    ratios = [v for r in rows for v in r["ratios"].values()]
    if ratios:
        inside = sum(0.75 <= v <= 1.33 for v in ratios)
        lines += ["", f"measured / predicted over {len(ratios)} rows: median "
                      f"{sorted(ratios)[len(ratios) // 2]:.2f}, {min(ratios):.2f} .. "
                      f"{max(ratios):.2f}; within 0.75-1.33: {inside} of {len(ratios)}"]
    return "\n".join(lines)


def _size(n):
    for suffix, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--rate", default="1gbit", help="the link's rate each way (tc's units)")
    p.add_argument("--delay", default="2ms", help="delay added each way (netem only)")
    p.add_argument("--per-host", type=int, default=4, help="ranks per namespace")
    p.add_argument("--collectives", default=",".join(COLLECTIVES))
    p.add_argument("--algorithms", default=",".join(FLAT + HIERARCHICAL + ("auto",)))
    p.add_argument("--sizes", default=SIZES, help="the bench's --sizes")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.3)
    p.add_argument("--calibrate", action="store_true",
                   help="fit the parameters inside a host on the job's ranks first")
    p.add_argument("--tiny", action="store_true", help="two sizes, one round (the test's run)")
    p.add_argument("--limit", type=float, default=3600, help="seconds before the job is killed")
    p.add_argument("--out", help="folder for the bench's JSON, the comparison and report.md")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny:
        args.sizes, args.rounds, args.min_time = "64K,1M", 1, 0.05
    from reliability_jobs import VethPair
    out = os.path.abspath(args.out or f"/tmp/two_hosts_{os.getpid()}")
    os.makedirs(out, exist_ok=True)
    topology = f"2x{args.per_host}"
    pair = VethPair("t")
    try:
        reason = pair.create()
        if reason:
            print(f"two_hosts: {reason}", file=sys.stderr)
            return SKIPPED
        try:
            link = shape(pair, args.rate, args.delay)
        except ValueError as exc:
            print(f"two_hosts: {exc}", file=sys.stderr)
            return SKIPPED
        intra = DEFAULTS["socket"]
        inter = inter_params(args.rate, link["delay_s"], intra)
        tuning = os.path.join(out, "tuning.json")
        if os.path.exists(tuning):
            os.remove(tuning)
        tuning_file.save_inter_params(tuning, "socket", inter)
        if link["qdisc"] != "netem" and delay_seconds(args.delay) > 0:
            print(f"# this kernel has no netem: the link is shaped by tbf (rate {args.rate}), "
                  f"no delay added", flush=True)
        print(f"# {topology} over {pair.addresses[0]} | {pair.addresses[1]}, {link['command']}"
              f"; model between hosts: {inter.describe()}", flush=True)
        records = os.path.join(out, "bench.json")
        bench = ["--backend", "socket", "--collectives", args.collectives,
                 "--algorithms", args.algorithms, "--sizes", args.sizes,
                 "--rounds", str(args.rounds), "--min-time", str(args.min_time),
                 "--json", records, "--no-progress"]
        if args.calibrate:
            bench += ["--calibrate", tuning]
        t0 = time.monotonic()
        outputs = launch(pair, args.per_host, bench, job_env(tuning, topology), args.limit)
        seconds = time.monotonic() - t0
        stats = [pair.qdisc_stats(side)["text"] for side in (0, 1)]
    finally:
        pair.close()
    for node, (rc, stdout, stderr) in enumerate(outputs):
        with open(os.path.join(out, f"node{node}.log"), "w") as f:
            f.write(stdout + "\n--- stderr\n" + stderr)
    if any(rc for rc, _, _ in outputs):
        for node, (rc, stdout, stderr) in enumerate(outputs):
            print(f"--- node {node}: rc={rc}\n{stdout[-3000:]}\n{stderr[-3000:]}",
                  file=sys.stderr)
        return max(rc for rc, _, _ in outputs) or 1
    data = json.load(open(records))
    rows = compare(data["records"])
    head = (f"# two hosts x {args.per_host} ranks (network namespaces), {link['qdisc']} "
            f"{args.rate}" + (f" + {args.delay}" if link["delay_s"] else " (no delay added)")
            + f"; job {seconds:.0f} s; {os.cpu_count()} cores\n# command: "
            + " ".join(["python", *sys.argv]))
    text = head + "\n" + table(rows)
    print(text)
    summary = {"topology": topology, "link": {**link, "rate": args.rate},
               "inter": inter.__dict__, "intra": tuning_file.load_params("socket", tuning).__dict__,
               "command": " ".join(sys.argv), "seconds": seconds, "qdisc_stats": stats,
               "rows": rows, "wrong": sum(r["wrong"] for r in rows)}
    with open(os.path.join(out, "two_hosts.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text + "\n")
    return 1 if summary["wrong"] else 0


if __name__ == "__main__":
    if not shutil.which("ip"):
        sys.exit("two_hosts: needs iproute2 (apt-get install -y iproute2)")
    sys.exit(main())
