"""A slow and lossy network: the socket transport between two network namespaces joined by a
veth pair, shaped in each direction. Collectives of every algorithm, small and 1 MiB, must
complete with exact results (TCP retransmits; nothing of ours may time out, hang or garble).

The shaping is ``tc netem`` (15 ms ± 5 ms delay, 2 % loss) where the kernel has it. Where it
does not (no ``sch_netem``, as on CI's VMs), ``tbf`` makes the link slow and lossy instead: a
30 Mbit/s rate with a 4 KiB burst and an 8 KiB queue, so bursts overflow the queue and the
qdisc drops packets that TCP must retransmit. tbf adds no fixed delay, only queueing and
serialisation. After the job the test reads ``tc -s qdisc`` and the namespaces' TCP counters
and, for tbf, asserts that packets were really dropped and retransmitted.

Needs root and iproute2 (``ip``, ``tc``; ``.ci/run`` installs it); otherwise skipped with the
reason. About 6 s with tbf; the job is killed after 45 s, so a hang fails the test instead
of stalling CI.
"""
import shutil
import time

import pytest

from reliability_jobs import VethPair, explain, job, socket_job

pytestmark = pytest.mark.slow

NETEM = ["netem", "delay", "15ms", "5ms", "loss", "2%"]
TBF = ["tbf", "rate", "30mbit", "burst", "4kb", "limit", "8kb"]
LIMIT = 45


@pytest.fixture
def lossy_link(request):
    """Two namespaces over a veth pair with netem (else tbf) on both ends: (pair, shaping)."""
    if not shutil.which("tc"):
        pytest.skip("needs iproute2's `tc`: apt-get install -y iproute2")
    pair = VethPair("n")
    request.addfinalizer(pair.close)      # runs on failure and on skip too
    reason = pair.create()
    if reason:
        pytest.skip(reason)
    why_not = {}
    for shaping in (NETEM, TBF):
        results = [pair.run_in(side, "tc", "qdisc", "add", "dev", pair.devices[side], "root",
                               *shaping) for side in (0, 1)]
        failed = [r.stderr.strip() for r in results if r.returncode]
        if not failed:
            return pair, shaping
        why_not[shaping[0]] = failed[0]
        for side in (0, 1):      # one end may have taken it: start the next choice clean
            pair.run_in(side, "tc", "qdisc", "del", "dev", pair.devices[side], "root")
    pytest.skip(f"neither netem nor tbf can shape the veth link: {why_not}")


LOSSY = job("lossy_link.py")


def test_socket_transport_over_a_slow_lossy_link(tmp_path, lossy_link):
    pair, shaping = lossy_link
    prefix = {0: pair.exec_prefix(0), 1: pair.exec_prefix(1)}
    t0 = time.monotonic()
    records = socket_job(tmp_path, LOSSY, 2, env={"MASTER_ADDR": pair.addresses[0]},
                         prefix=prefix, limit=LIMIT)
    seconds = time.monotonic() - t0
    assert all(r["rc"] == 0 for r in records), explain(records)
    for record in records:
        assert record["results"][0]["checked"] == 77, explain(records)
    dropped = [pair.qdisc_stats(side)["dropped"] for side in (0, 1)]
    retransmitted = [pair.tcp_retransmits(side) for side in (0, 1)]
    job = max(r["results"][0]["seconds"] for r in records)
    print(f"\n{' '.join(shaping)}: 2 ranks, 77 collectives each, exact; collectives {job:.1f} s, "
          f"job {seconds:.1f} s; qdisc dropped {dropped[0]} + {dropped[1]} packets, TCP "
          f"retransmitted {retransmitted[0]} + {retransmitted[1]} segments")
    if shaping[0] == "tbf":
        # The link must really have been lossy both ways, or this test proves nothing.
        assert min(dropped) > 0, [pair.qdisc_stats(side)["text"] for side in (0, 1)]
        assert min(retransmitted) > 0, retransmitted
