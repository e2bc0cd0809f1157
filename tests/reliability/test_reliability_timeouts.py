"""Timeouts at the edges, on real processes over the socket transport: inf, 1e300 and
``timedelta.max`` are no deadline wherever a timeout enters (init_process_group, new_group,
a collective's ``timeout=``, Work.wait, and p2p through its group's timeout), never an
overflow; NaN and negative timeouts are a ValueError on every rank alike, before anything
moves, and the job goes on afterwards as if the call had not been made. The stores apply the
same rule (test_store_hardening.py)."""
from reliability_jobs import explain, socket_job

FOREVER = """
from datetime import timedelta

FOREVER = {"inf": float("inf"), "1e300": 1e300, "timedelta.max": timedelta.max}
rank = int(os.environ["RANK"])
peer = 1 - rank


def exchange(buf, group=None):
    if rank == 0:
        dist.send(buf, peer, group=group)
        dist.recv(buf, peer, group=group)
    else:
        dist.recv(buf, peer, group=group)
        dist.send(buf, peer, group=group)


def per_call(forever):
    # a group with a deadline; each call's own timeout is none
    dist.init_process_group("gloo", timeout=30)
    x = np.full(1 << 16, rank + 1.0)
    dist.all_reduce(x, timeout=forever)
    works = [dist.all_reduce(np.full(4096, 1.0), async_op=True, timeout=forever)
             for _ in range(8)]
    assert all(w.wait(timeout=forever) for w in works)
    dist.barrier(timeout=forever)
    buf = np.full(1 << 14, float(rank))
    work = dist.irecv(buf, peer) if rank else dist.isend(buf, peer)
    work.wait(timeout=forever)
    dist.monitored_barrier(timeout=forever)
    dist.destroy_process_group()
    return bool((x == 3).all()) and buf[0] == 0.0


def per_group(forever):
    # groups without a deadline: their collectives and p2p wait as long as it takes
    dist.init_process_group("gloo", timeout=forever)
    x = np.full(1 << 16, rank + 1.0)
    dist.all_reduce(x)
    buf = np.full(1 << 14, float(rank))
    exchange(buf)
    sub = dist.new_group([0, 1], timeout=forever)
    y = np.full(1 << 16, float(rank))
    dist.broadcast(y, src=1, group=sub)
    exchange(buf, sub)
    dist.barrier(group=sub)
    dist.destroy_process_group()
    return bool((x == 3).all() and (y == 1).all()) and buf[0] == 0.0


for name, forever in FOREVER.items():
    for entry in (per_call, per_group):
        try:
            report(forever=name, entry=entry.__name__, ok=bool(entry(forever)))
        except Exception as exc:
            report(forever=name, entry=entry.__name__, **failure(exc))
            os._exit(1)             # the other rank fails on the dropped connection
"""


def test_huge_timeouts_are_no_deadline_everywhere(tmp_path):
    records = socket_job(tmp_path, FOREVER, 2, limit=90)
    expected = [(name, entry) for name in ("inf", "1e300", "timedelta.max")
                for entry in ("per_call", "per_group")]
    for record in records:
        assert record["rc"] == 0, explain(records)
        assert [(r["forever"], r["entry"]) for r in record["results"]] == expected, \
            explain(records)
        assert all(r["ok"] for r in record["results"]), explain(records)


BAD = """
from datetime import timedelta

BAD = {"nan": float("nan"), "-1": -1, "timedelta(-1 s)": timedelta(seconds=-1)}
rank = int(os.environ["RANK"])


def refused(call):
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


for name, bad in BAD.items():
    said = refused(lambda: dist.init_process_group("gloo", timeout=bad))
    assert not dist.is_initialized()
    report(where="init_process_group", bad=name, said=said)
dist.init_process_group("gloo", timeout=30)
size = dist.get_world_size()
for name, bad in BAD.items():
    x = np.full(1024, rank + 1.0)
    report(where="all_reduce", bad=name, said=refused(lambda: dist.all_reduce(x, timeout=bad)),
           untouched=bool((x == rank + 1.0).all()))
    report(where="barrier", bad=name, said=refused(lambda: dist.barrier(timeout=bad)))
    report(where="new_group", bad=name,
           said=refused(lambda: dist.new_group(list(range(size)), timeout=bad)))
    work = dist.all_reduce(x, async_op=True)
    report(where="Work.wait", bad=name, said=refused(lambda: work.wait(timeout=bad)))
    work.wait()
    report(where="after", bad=name, ok=bool((x == size * (size + 1) / 2).all()))
dist.destroy_process_group()
"""


def test_nan_and_negative_timeouts_fail_every_rank_before_anything_moves(tmp_path):
    records = socket_job(tmp_path, BAD, 2, limit=60)
    for rank, record in enumerate(records):
        assert record["rc"] == 0, explain(records)
        results = record["results"]
        assert len(results) == 3 + 3 * 5, explain(records)
        for result in results:
            if result["where"] == "after":
                assert result["ok"], explain(records)       # the job went on, in step
                continue
            said = result["said"]
            assert said and "timeout" in said and result["where"] in said, (result, explain(records))
            assert result.get("untouched", True), (result, explain(records))
            if result["where"] in ("all_reduce", "barrier", "new_group"):
                assert f"rank {rank}" in said, result
