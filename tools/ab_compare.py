"""Old tree against new tree from interleaved bench runs (``--json`` of bench.py, any backend):
DIR holds old_<i>.json and new_<i>.json. Per row: the median over runs of the time, new/old,
and each row's ratio to the native baseline of its own run (what BENCHMARKS.md reports).
Native's own new/old (unchanged code) is the run's noise.

    python tools/ab_compare.py DIR [PREFIX]      # PREFIX: e.g. gpu_ for gpu_old_1.json
"""
import glob
import json
import os
import statistics
import sys


def records(path):
    data = json.load(open(path))
    for r in data.get("records") or data.get("rows") or []:
        t = r.get("time_p50_us", r.get("time_us"))
        yield (r["collective"], r["algorithm"].split(":")[0], r["size"]), t


def main():
    d = sys.argv[1]
    prefix = sys.argv[2] if len(sys.argv) > 2 else ""
    rows = {}
    for t in ("old", "new"):
        for path in sorted(glob.glob(os.path.join(d, f"{prefix}{t}_*.json"))):
            for key, us in records(path):
                rows.setdefault(key, {"old": [], "new": []})[t].append(us)
    by = {}
    print(f"{'collective':15} {'algorithm':19} {'bytes':>10} {'old us':>9} {'new us':>9} "
          f"{'new/old':>7} {'old/native':>10} {'new/native':>10}")
    for key in sorted(rows):
        o, n = rows[key]["old"], rows[key]["new"]
        native = rows.get((key[0], "native", key[2]))
        if not o or not n:
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        by.setdefault(key[1], []).append(mn / mo)
        ro = rn = float("nan")
        if native and native["old"] and native["new"]:
            ro = statistics.median(native["old"]) / mo
            rn = statistics.median(native["new"]) / mn
        print(f"{key[0]:15} {key[1]:19} {key[2]:10d} {mo:9.1f} {mn:9.1f} {mn / mo:7.3f} "
              f"{ro:10.3f} {rn:10.3f}")
    for alg, ratios in sorted(by.items()):
        print(f"{alg:19} new/old geometric mean {statistics.geometric_mean(ratios):.3f} "
              f"(rows {min(ratios):.2f} .. {max(ratios):.2f}, {len(ratios)} rows)")


if __name__ == "__main__":
    main()
