"""Markdown tables for BENCHMARKS.md from ``bench.py --json`` files.

    python benchmarks/tables.py results/mpi_8ranks.json [more.json ...]
    python benchmarks/tables.py --auto B.json [more.json ...]   # auto's time / best measured

One table per collective: each size's p50 time of every algorithm as a ratio to the native
baseline of the same run (native time / ours: above 1 is faster), the best of ours, and
``auto``'s pick with its time relative to the best measured algorithm.
"""
import json
import sys
from collections import defaultdict


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def tables(path):
    data = json.load(open(path))
    if "rows" in data or "gpu" in data.get("meta", {}):
        return gpu_tables(path, data)
    meta, records = data.get("meta", {}), data["records"]
    out = [f"`{path}`: {meta.get('backend', '?')}, {meta.get('world_size', '?')} ranks, "
           f"{meta.get('mpi_library', '')}".replace(chr(0), '').strip().rstrip(",")]
    by = defaultdict(dict)
    for r in records:
        if r.get("wrong"):
            out.append(f"WRONG RESULTS in {r['collective']} {r['algorithm']} {r['size']}")
        name = "auto" if r["algorithm"].startswith("auto") else r["algorithm"]
        by[(r["collective"], r["size"])][name] = r
    collectives = sorted({c for c, _ in by}, key=lambda c: [r["collective"] for r in records].index(c))
    for collective in collectives:
        sizes = sorted(s for c, s in by if c == collective)
        names = [n for n in ("ring", "ring_bidirectional", "tree", "recursive_doubling", "direct")
                 if any(n in by[(collective, s)] for s in sizes)]
        out.append("")
        out.append(f"**{collective}** (native time / ours; >1 is faster than native)")
        out.append("")
        out.append("| size | native p50 µs | native busbw GB/s | " + " | ".join(names) +
                   " | best of ours (busbw vs native) | auto's pick | auto / best time |")
        out.append("|" + "---|" * (5 + len(names)) + "---|")
        for size in sizes:
            row = by[(collective, size)]
            native = next((r for n, r in row.items() if n.startswith("native")), None)
            if native is None:
                continue
            t0 = native["time_p50_us"]
            cells = [f"{t0 / row[n]['time_p50_us']:.2f}" if n in row else "–" for n in names]
            ours = [(row[n]["time_p50_us"], n) for n in names if n in row]
            best_t, best = min(ours)
            auto = row.get("auto")
            auto_cells = (f"{auto.get('chosen', '?')} | {auto['time_p50_us'] / best_t:.2f}"
                          if auto else "– | –")
            out.append(f"| {size_label(size)} | {t0:.1f} | {native['busbw_gbs']:.2f} | "
                       + " | ".join(cells) + f" | {best} {t0 / best_t:.2f}× | {auto_cells} |")
    return "\n".join(out)


def gpu_tables(path, data):
    """bench --backend nccl output: ratios to NCCL native, the p2p ceiling, graph replay.
    Reads the records of every backend (and the ``rows`` older GPU runs wrote)."""
    meta = data["meta"]
    rows = [_old_gpu_row(r) for r in data["rows"]] if "rows" in data else data["records"]
    out = [f"`{path}`: {meta.get('world_size')} x {meta.get('gpu')}, NCCL {meta.get('nccl')}, "
           f"CuPy {meta.get('cupy')}"]
    by = defaultdict(dict)
    for r in rows:
        if r.get("wrong"):
            out.append(f"WRONG RESULTS in {r['collective']} {r['algorithm']} {r['size']}")
        by[(r["collective"], r["size"])][r["algorithm"]] = r
    names = ("ring", "ring_bidirectional", "recursive_doubling", "tree", "direct")
    for collective in dict.fromkeys(r["collective"] for r in rows):
        out += ["", f"**{collective}** (native time / ours; in brackets the share of the point-to-"
                    f"point ceiling reached: the same plan's transfers alone, timed, / ours)", "",
                "| size | native µs | native busbw GB/s | " + " | ".join(names) +
                " | best with graph replay | auto's pick | auto / best time |",
                "|" + "---|" * (3 + len(names)) + "---|---|---|"]
        for size in sorted(s for c, s in by if c == collective):
            row = by[(collective, size)]
            t0 = row["native"]["time_p50_us"]
            cells = []
            for n in names:
                r = row.get(n)
                cells.append("–" if r is None else f"{r['ratio_to_native']:.2f} "
                             f"({r.get('ratio_to_ceiling') or 0:.2f})")
            best_t = min(row[n]["time_p50_us"] for n in names if n in row)
            graphs = [(r["time_p50_us"], a) for a, r in row.items() if a.endswith(":graph")]
            graph = f"{t0 / min(graphs)[0]:.2f} ({min(graphs)[1].split(':')[0]})" if graphs else "–"
            auto = row.get("auto")
            auto_cells = (f"{auto['chosen']} | {auto['time_p50_us'] / best_t:.2f}"
                          if auto else "– | –")
            out.append(f"| {size_label(size)} | {t0:.1f} | {row['native']['busbw_gbs']:.0f} | "
                       + " | ".join(cells) + f" | {graph} | {auto_cells} |")
    return "\n".join(out)


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def auto_table(path):
    """auto's time / the best measured algorithm's at each (collective, size), each the median
    over its rounds (``round_p50_us``; the pooled p50 without rounds), with the geometric
    mean and the worst: how a tuning file (``--tuning``) holds up in a run it was not made
    from; and the same held out (``_held_out``), which removes the minimum's bias."""
    data = json.load(open(path))
    records, meta = data["records"], data.get("meta", {})
    by = defaultdict(dict)
    for r in records:
        if r["algorithm"] == "native" or ":" in r["algorithm"] or r.get("wrong"):
            continue
        by[r["collective"], r["size"]][r["algorithm"]] = r
    rounds = max((r.get("rounds", 1) for r in records), default=1)
    sizes = sorted({s for _, s in by})
    out = [f"`{path}`: {meta.get('backend', '?')}, {meta.get('world_size', '?')} ranks, "
           f"medians over {rounds} rounds; auto's time / the best measured (auto's pick, "
           f"the best if another)", "",
           "| collective | " + " | ".join(size_label(s) for s in sizes) + " |",
           "|---|" + "---|" * len(sizes)]
    ratios, held_out = [], []
    for collective in dict.fromkeys(c for c, _ in by):
        cells = []
        for size in sizes:
            row = by.get((collective, size), {})
            auto = row.get("auto")
            times = {a: _median(r.get("round_p50_us") or [r["time_p50_us"]])
                     for a, r in row.items()}
            ours = {a: t for a, t in times.items() if a != "auto"}
            if auto is None or not ours:
                cells.append("–")
                continue
            best = min(ours, key=ours.get)
            ratio = times["auto"] / ours[best]
            ratios.append(ratio)
            pick = auto.get("chosen", "?")
            cells.append(f"{ratio:.2f} ({pick}{'' if pick == best else ' / ' + best})")
            fold = _held_out(row)
            if fold is not None:
                held_out.append(fold)
        out.append(f"| {collective} | " + " | ".join(cells) + " |")
    if ratios:
        out += ["", _summary("", ratios)]
    if held_out:
        out.append(_summary("held out (the best picked on half the rounds, timed on the "
                            "other half, both ways): ", held_out))
    return "\n".join(out)


def _summary(label, ratios):
    import math
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return (f"{label}geometric mean {geo:.3f}, worst {max(ratios):.2f}, "
            f"{sum(r <= 1.10 for r in ratios)}/{len(ratios)} sizes within 1.10")


def _held_out(row):
    """auto / the best without selection bias: the minimum over rows measured with noise is
    biased low (the luckiest of several rows wins), so the best is picked on the even rounds
    and timed on the odd ones, and the other way round; the geometric mean of the two folds.
    None with fewer than 4 rounds."""
    rounds = {a: r.get("round_p50_us") or [] for a, r in row.items()}
    if "auto" not in rounds or min(len(t) for t in rounds.values()) < 4:
        return None
    folds = []
    for pick, timed in ((0, 1), (1, 0)):
        ours = {a: _median(t[pick::2]) for a, t in rounds.items() if a != "auto"}
        best = min(ours, key=ours.get)
        folds.append(_median(rounds["auto"][timed::2]) / _median(rounds[best][timed::2]))
    return (folds[0] * folds[1]) ** 0.5


def _old_gpu_row(r):
    """A row of the GPU bench's former schema in the fields every backend writes now."""
    r = dict(r, time_p50_us=r["time_us"], ratio_to_native=r.get("vs_native"),
             ratio_to_ceiling=r.get("vs_ceiling"))
    if r["algorithm"].startswith("auto:"):
        r.update(algorithm="auto", chosen=r["algorithm"][5:])
    return r


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(print(__doc__))
    if not sys.argv[1:] or sys.argv[1:] == ["--auto"]:
        sys.exit(__doc__)
    if sys.argv[1:2] == ["--auto"]:
        print("\n\n".join(auto_table(p) for p in sys.argv[2:]))
    else:
        print("\n\n".join(tables(p) for p in sys.argv[1:]))
