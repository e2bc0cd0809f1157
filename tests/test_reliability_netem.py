"""A slow and lossy network: the socket transport between two network namespaces joined by a
veth pair, with ``tc netem`` adding 15 ms ± 5 ms of delay and 2 % loss in each direction.
Collectives of every algorithm, small and 1 MiB, must complete with exact results (TCP
retransmits; nothing of ours may time out, hang or garble).

Needs root and iproute2 (``ip``, ``tc``) with netns and netem support; otherwise skipped with
the reason. CI installs iproute2 first (``.ci/run``).
"""
import os
import shutil
import subprocess

import pytest

from reliability_jobs import explain, socket_job

NETEM = ["delay", "15ms", "5ms", "loss", "2%"]


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def namespaces():
    """Two namespaces ns-a (10.77.<n>.1) and ns-b (.2) over a veth pair with netem on both
    ends; yields their names and addresses, removes them afterwards."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not (shutil.which("ip") and shutil.which("tc")):
        pytest.skip("needs iproute2 (ip and tc): apt-get install -y iproute2")
    tag = os.getpid() % 10000
    a, b = f"coll-a{tag}", f"coll-b{tag}"
    subnet = f"10.77.{tag % 250}"
    made = []
    try:
        for ns in (a, b):
            result = _ip("netns", "add", ns)
            if result.returncode:
                pytest.skip(f"cannot create a network namespace: {result.stderr.strip()}")
            made.append(ns)
        steps = [
            ("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}"),
            ("link", "set", f"va{tag}", "netns", a), ("link", "set", f"vb{tag}", "netns", b),
            ("-n", a, "addr", "add", f"{subnet}.1/24", "dev", f"va{tag}"),
            ("-n", b, "addr", "add", f"{subnet}.2/24", "dev", f"vb{tag}"),
            ("-n", a, "link", "set", f"va{tag}", "up"), ("-n", b, "link", "set", f"vb{tag}", "up"),
            ("-n", a, "link", "set", "lo", "up"), ("-n", b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            result = _ip(*step)
            if result.returncode:
                pytest.skip(f"cannot set up the veth pair (ip {' '.join(step)}): "
                            f"{result.stderr.strip()}")
        for ns, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            result = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev,
                                     "root", "netem", *NETEM], capture_output=True, text=True,
                                    timeout=20)
            if result.returncode:
                pytest.skip(f"tc netem is not available: {result.stderr.strip()}")
        yield (a, f"{subnet}.1"), (b, f"{subnet}.2")
    finally:
        for ns in made:
            _ip("netns", "del", ns)


LOSSY = """
dist.init_process_group("gloo", timeout=60)
rank, p = dist.get_rank(), dist.get_world_size()
checked = 0
t0 = time.monotonic()
for algorithm in ("ring", "tree", "recursive_doubling"):
    for count in (7, 1000, 1 << 18):
        x = np.arange(count, dtype=np.float64) * (rank + 1)
        dist.all_reduce(x, algorithm=algorithm)
        assert (x == np.arange(count) * 3).all(), (algorithm, count)
        outs = [np.empty(count, np.int32) for _ in range(p)]
        dist.all_gather(outs, np.full(count, rank + 5, np.int32), algorithm=algorithm)
        assert all((o == r + 5).all() for r, o in enumerate(outs)), (algorithm, count)
        y = np.full(count, rank, np.float32)
        dist.broadcast(y, src=1, algorithm=algorithm)
        assert (y == 1).all()
        checked += 3
works = [dist.all_reduce(np.ones(64), async_op=True) for _ in range(50)]
for w in works:
    w.wait()
checked += 50
report(rank=rank, checked=checked, seconds=time.monotonic() - t0)
"""


def test_socket_transport_over_a_slow_lossy_link(tmp_path, namespaces):
    (ns_a, addr_a), (ns_b, _) = namespaces
    prefix = {0: ["ip", "netns", "exec", ns_a], 1: ["ip", "netns", "exec", ns_b]}
    records = socket_job(tmp_path, LOSSY, 2, env={"MASTER_ADDR": addr_a}, prefix=prefix,
                         limit=150)
    assert all(r["rc"] == 0 for r in records), explain(records)
    for record in records:
        result = record["results"][0]
        print(f"\nnetem {' '.join(NETEM)}: rank {result['rank']} checked {result['checked']} "
              f"collectives in {result['seconds']:.1f} s")
        assert result["checked"] == 77
