"""Timeouts at the edges, on real processes over the socket transport: inf, 1e300 and
``timedelta.max`` are no deadline wherever a timeout enters (init_process_group, new_group,
a collective's ``timeout=``, Work.wait, and p2p through its group's timeout), never an
overflow; NaN and negative timeouts are a ValueError on every rank alike, before anything
moves, and the job goes on afterwards as if the call had not been made. The stores apply the
same rule (test_store_hardening.py)."""
from reliability_jobs import explain, job, socket_job

FOREVER = job("huge_timeouts.py")


def test_huge_timeouts_are_no_deadline_everywhere(tmp_path):
    records = socket_job(tmp_path, FOREVER, 2, limit=90)
    expected = [(name, entry) for name in ("inf", "1e300", "timedelta.max")
                for entry in ("per_call", "per_group")]
    for record in records:
        assert record["rc"] == 0, explain(records)
        assert [(r["forever"], r["entry"]) for r in record["results"]] == expected, \
            explain(records)
        assert all(r["ok"] for r in record["results"]), explain(records)


BAD = job("bad_timeouts.py")


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
