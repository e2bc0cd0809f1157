"""Two hosts: the socket transport between two network namespaces joined by a veth pair, one
launcher ("node") per namespace, 2 ranks each, as a real two-node job would run
(``python -m collectives.run --nnodes 2 --node-rank k --master-addr <node 0> ...`` with a shared
COLLECTIVES_SECRET). Every collective with every algorithm, a subgroup that spans both hosts
and point-to-point traffic across them are checked against exact expected values; and the
job's sockets are checked to sit on the veth address, not on 0.0.0.0 or loopback.

Needs root and iproute2 (``ip``); otherwise skipped with the reason. About 5 s.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from collectives.algorithms import capabilities

from reliability_jobs import VethPair, _env, write_script

pytestmark = pytest.mark.slow

LIMIT = 60            # seconds for the whole job; the ranks' own timeout (20 s) fires first
MASTER_PORT = 29517   # any port works: the namespaces are fresh and empty

SIZES = (1, 7, 1000, 40003)
JOB = """
from datetime import timedelta
import socket as pysocket
from collectives.algorithms import capabilities
from collectives.transports.socket import _bind_host

def expect(ok, what):
    if not ok:
        raise AssertionError(f"rank {rank}: {what}")

def same(got, want, what):
    expect(got.dtype == want.dtype and got.shape == want.shape and (got == want).all(),
           f"{what}: got {got[:8]}..., want {want[:8]}...")

dist.init_process_group("gloo", timeout=timedelta(seconds=20))
rank, p = dist.get_rank(), dist.get_world_size()
expect(p == 4, f"world size {p}")
caps = capabilities()
checked = 0
SIZES = @SIZES@          # uneven splits, and one that needs many TCP segments
for algorithm in [None, *caps["all_reduce"]]:
    for count in SIZES:
        base = np.arange(count, dtype=np.int64)
        x = base * (rank + 1)
        dist.all_reduce(x, algorithm=algorithm)
        same(x, base * 10, f"all_reduce {algorithm} {count}")
        f = np.full(count, rank + 0.5)
        dist.all_reduce(f, op=dist.ReduceOp.MAX, algorithm=algorithm)
        same(f, np.full(count, 3.5), f"all_reduce MAX {algorithm} {count}")
        checked += 2
for algorithm in [None, *caps["all_gather"]]:
    for count in SIZES:
        base = np.arange(count, dtype=np.int32)
        outs = [np.empty(count, np.int32) for _ in range(p)]
        dist.all_gather(outs, base + 1000 * rank, algorithm=algorithm)
        for r in range(p):
            same(outs[r], base + 1000 * r, f"all_gather {algorithm} {count} from {r}")
        checked += 1
for algorithm in [None, *caps["reduce_scatter"]]:
    for count in SIZES:
        base = np.arange(count, dtype=np.int64)
        out = np.empty(count, np.int64)
        dist.reduce_scatter(out, [base + 100 * rank + j for j in range(p)], algorithm=algorithm)
        same(out, 4 * base + 600 + 4 * rank, f"reduce_scatter {algorithm} {count}")
        checked += 1
for algorithm in [None, *caps["all_to_all"]]:
    for count in SIZES:
        outs = [np.empty(count, np.float32) for _ in range(p)]
        dist.all_to_all(outs, [np.full(count, 10 * rank + j, np.float32) for j in range(p)],
                        algorithm=algorithm)
        for j in range(p):
            same(outs[j], np.full(count, 10 * j + rank, np.float32),
                 f"all_to_all {algorithm} {count} from {j}")
        checked += 1
for algorithm in [None, *caps["broadcast"]]:
    for count in SIZES:
        for src in range(p):
            y = np.arange(count, dtype=np.float64) * (7 if rank == src else -1)
            dist.broadcast(y, src=src, algorithm=algorithm)
            same(y, np.arange(count, dtype=np.float64) * 7, f"broadcast {algorithm} {count} {src}")
            checked += 1

# A subgroup across both hosts (rank 1 on node 0; ranks 2, 3 on node 1), 3 ranks.
members = [1, 2, 3]
group = dist.new_group(members)
if rank in members:
    expect(dist.get_world_size(group) == 3, "subgroup size")
    for algorithm in [None, *caps["all_reduce"]]:
        x = np.arange(5001, dtype=np.int64) * rank
        dist.all_reduce(x, group=group, algorithm=algorithm)
        same(x, np.arange(5001, dtype=np.int64) * 6, f"subgroup all_reduce {algorithm}")
        checked += 1
    for algorithm in [None, *caps["all_gather"]]:
        outs = [np.empty(3, np.int64) for _ in members]
        dist.all_gather(outs, np.full(3, rank, np.int64), group=group, algorithm=algorithm)
        for i, r in enumerate(members):
            same(outs[i], np.full(3, r, np.int64), f"subgroup all_gather {algorithm}")
        checked += 1
    for algorithm in [None, *caps["broadcast"]]:
        y = np.full(777, rank, np.int16)
        dist.broadcast(y, src=3, group=group, algorithm=algorithm)
        same(y, np.full(777, 3, np.int16), f"subgroup broadcast {algorithm}")
        checked += 1

# Point to point across the hosts: 0 <-> 3 blocking, then a ring of isend/irecv.
if rank == 0:
    dist.send(np.arange(100000, dtype=np.int64), dst=3)
    back = np.empty(10, np.int64)
    dist.recv(back, src=3)
    same(back, np.arange(10, dtype=np.int64) * 3, "recv from 3")
elif rank == 3:
    got = np.empty(100000, np.int64)
    dist.recv(got, src=0)
    same(got, np.arange(100000, dtype=np.int64), "recv from 0")
    dist.send(np.arange(10, dtype=np.int64) * 3, dst=0)
inbox = np.empty(65536, np.float64)
works = [dist.isend(np.full(65536, rank, np.float64), dst=(rank + 1) % p),
         dist.irecv(inbox, src=(rank - 1) % p)]
for w in works:
    w.wait()
same(inbox, np.full(65536, (rank - 1) % p, np.float64), "ring isend/irecv")
checked += 2
dist.barrier()

# Where do this job's sockets sit? Every socket in this namespace is ours (it is fresh).
def sockets(path):
    rows = []
    try:
        with open(path) as f:
            next(f)
            for line in f:
                fields = line.split()
                (host, port), (peer, _) = (f.split(":") for f in fields[1:3])
                state = fields[3]
                if len(host) == 8:       # IPv4, little-endian hex
                    host, peer = (pysocket.inet_ntoa(bytes.fromhex(h)[::-1]) for h in (host, peer))
                rows.append({"state": {"0A": "LISTEN", "01": "ESTABLISHED"}.get(state, state),
                             "host": host, "port": int(port, 16), "peer": peer})
    except FileNotFoundError:
        pass
    return rows

node_addr = os.environ["NODE_ADDR"]
loopback = "refused"
if rank == 0:
    # The store listens on the master address; if it listened on 0.0.0.0 this would connect.
    try:
        pysocket.create_connection(("127.0.0.1", int(os.environ["MASTER_PORT"])), 2).close()
        loopback = "connected"
    except ConnectionRefusedError:
        pass
report(rank=rank, checked=checked, node_addr=node_addr, bind_host=_bind_host(None),
       tcp=sockets("/proc/self/net/tcp"), tcp6=sockets("/proc/self/net/tcp6"),
       loopback_to_store=loopback, master_port=int(os.environ["MASTER_PORT"]))
dist.barrier()        # nobody leaves while another rank is still reading its sockets
""".replace("@SIZES@", repr(SIZES))


@pytest.fixture
def hosts(request):
    pair = VethPair("h")
    request.addfinalizer(pair.close)      # runs on failure and on skip too
    reason = pair.create()
    if reason:
        pytest.skip(reason)
    return pair


def run_nodes(pair, script, secret, limit):
    """Start one launcher per namespace; wait for both (killing both process groups at
    ``limit``); return [(returncode, stdout, stderr)] for node 0 and node 1."""
    procs = []
    for node in (0, 1):
        command = [*pair.exec_prefix(node), sys.executable, "-m", "collectives.run",
                   "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                   "--master-addr", pair.addresses[0], "--master-port", str(MASTER_PORT), script]
        env = _env({"COLLECTIVES_SECRET": secret, "NODE_ADDR": pair.addresses[node]})
        # Own process group: on a hang, killpg takes the launcher and its workers together.
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
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
            err += f"\n[killed by the test after {limit} s: a hang]"
        outputs.append((proc.returncode, out, err))
    return outputs


def results(stdout):
    """The RESULT lines of a launcher's output (each prefixed ``[rank N]:``)."""
    return [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines()
            if "RESULT " in line]


def test_two_hosts_every_collective_over_a_veth_link(tmp_path, hosts):
    script = write_script(tmp_path, JOB)
    t0 = time.monotonic()
    outputs = run_nodes(hosts, script, secret=os.urandom(16).hex(), limit=LIMIT)
    seconds = time.monotonic() - t0
    explain = "\n".join(f"--- node {n}: rc={rc}\n{out[-4000:]}\n{err[-4000:]}"
                        for n, (rc, out, err) in enumerate(outputs))
    assert [rc for rc, _, _ in outputs] == [0, 0], explain
    by_rank = {r["rank"]: r for _, out, _ in outputs for r in results(out)}
    assert sorted(by_rank) == [0, 1, 2, 3], explain
    node_of = {0: 0, 1: 0, 2: 1, 3: 1}
    caps = capabilities()
    n_ = {c: 1 + len(caps[c]) for c in caps}     # the default choice, then each algorithm
    everyone = (len(SIZES) * (2 * n_["all_reduce"] + n_["all_gather"] + n_["reduce_scatter"]
                              + n_["all_to_all"] + 4 * n_["broadcast"]) + 2)
    in_subgroup = n_["all_reduce"] + n_["all_gather"] + n_["broadcast"]
    for rank, r in by_rank.items():
        addr = hosts.addresses[node_of[rank]]
        assert r["node_addr"] == addr
        # Ranks 1-3 are in the subgroup and count its checks as well.
        assert r["checked"] == everyone + (in_subgroup if rank in (1, 2, 3) else 0), r["checked"]
        # The transport listens where the master is routed from: the veth address.
        assert r["bind_host"] == addr, (rank, r["bind_host"])
        # Nothing of the job on IPv6, on 0.0.0.0 or on loopback: every listener and every
        # connection in the namespace uses this host's veth address.
        assert r["tcp6"] == [], r["tcp6"]
        assert r["tcp"], "no TCP sockets seen in /proc/self/net/tcp"
        assert {s["host"] for s in r["tcp"]} == {addr}, r["tcp"]
    listeners_a = [s for s in by_rank[0]["tcp"] if s["state"] == "LISTEN"]
    assert listeners_a == [{"state": "LISTEN", "host": hosts.addresses[0],
                            "port": MASTER_PORT, "peer": "0.0.0.0"}], listeners_a  # the store
    assert not [s for s in by_rank[2]["tcp"] if s["state"] == "LISTEN"]
    assert by_rank[0]["loopback_to_store"] == "refused"
    # Connections really cross the link: node 1's ranks talk to node 0's address.
    crossing = [s for s in by_rank[2]["tcp"] if s["state"] == "ESTABLISHED"
                and s["peer"] == hosts.addresses[0]]
    assert len(crossing) >= 2, by_rank[2]["tcp"]     # at least ranks 2, 3 -> ranks 0, 1
    print(f"\ntwo hosts ({hosts.addresses[0]} | {hosts.addresses[1]}, 2 ranks each): "
          f"{sum(r['checked'] for r in by_rank.values())} checks passed in {seconds:.1f} s")
