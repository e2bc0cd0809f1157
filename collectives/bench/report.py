"""The bench's output: the table (one line per record, nccl-tests' columns), the summary (best
per size, auto against the best, where ring and the log-p algorithms cross, the run's noise),
the run's metadata, JSON, CSV, the plot and the progress bar.

Verdicts are only printed where the run can support them: the noise is the spread of one
schedule's time over the rounds (``fit.run_noise``: the median over rows of (max - min) /
median of a row's round p50s; with one round, auto's row against its choice's own row), and
a claim ("ring is faster at 64K", "auto within 10% of the best") whose difference is inside
that noise is printed as a tie or as "within the noise" instead.
"""
from __future__ import annotations

import csv
import json
import os
import platform
import sys
import time
from dataclasses import asdict

import numpy as np

from . import fit
from .cases import format_size


COLUMNS = [("size", 10), ("count", 10), ("dtype", 8), ("op", 5), ("algorithm", 21),
           ("p50_us", 11), ("p99_us", 11), ("algbw", 8), ("busbw", 8), ("vs_native", 9),
           ("model_us", 10), ("meas/mod", 8), ("wrong", 6)]
_SHORT = {"recursive_doubling": "rec_doubling",     # so "auto:<chosen>" fits its column
          "ring_bidirectional": "ring_bidir"}


def _algorithm_cell(r: dict) -> str:
    if r["algorithm"] == "auto" and r.get("chosen"):
        return "auto:" + _SHORT.get(r["chosen"], r["chosen"])
    if r["algorithm"] == "native" and r.get("native_name"):
        return "native:" + r["native_name"]
    base, colon, variant = r["algorithm"].partition(":")     # ring:sendrecv, ring:graph, ...
    return _SHORT.get(base, base) + colon + variant


def header(collective=None) -> str:
    line = " ".join(f"{name:>{width}}" for name, width in COLUMNS)
    rule = "#" + "-" * (len(line) - 1)
    title = f"# {collective}" if collective else ""
    return "\n".join(filter(None, [title, "#" + line[1:], rule]))


def format_record(r: dict) -> str:
    ratio = "" if r.get("ratio_to_native") is None else f"{r['ratio_to_native']:.2f}x"
    if r["algorithm"] == "native":
        ratio = "1.00x"
    predicted = "" if r.get("predicted_us") is None else f"{r['predicted_us']:.1f}"
    error = "" if r.get("model_error") is None else f"{r['model_error']:.2f}"
    cells = [format_size(r["size"]), r["count"], r["dtype"], r["op"], _algorithm_cell(r),
             f"{r['time_p50_us']:.1f}", f"{r['time_p99_us']:.1f}", f"{r['algbw_gbs']:.3f}",
             f"{r['busbw_gbs']:.3f}", ratio, predicted, error, r["wrong"]]
    return " ".join(f"{str(c):>{w}}" for c, (_, w) in zip(cells, COLUMNS))


def run_noise(records) -> dict:
    """The run's noise: ``fraction`` (how far two measurements of one schedule differ, the
    median over rows), how it was measured (``from``), and with rounds the worst row's spread
    over its rounds and how many rows had rounds."""
    fraction, how = fit.run_noise(records)
    noise = {"fraction": fraction, "from": how}
    spreads = [_spread(r["round_p50_us"]) for r in records if len(r.get("round_p50_us") or ()) > 1]
    if spreads:
        noise.update(worst=max(spreads), rows=len(spreads))
    return noise


def _spread(times) -> float:
    mid = float(np.median(times))
    return (max(times) - min(times)) / mid if mid > 0 else 0.0


def _beyond(ratio: float, threshold: float, noise: float) -> bool:
    """Whether a measured ``ratio`` is further from ``threshold`` than the run's noise: only
    then can the run say on which side of it the truth lies."""
    return abs(ratio / threshold - 1.0) > noise


def summarize(records: list[dict]) -> dict:
    """Per collective: the best algorithm at each size (ours and overall; ``auto`` is not a
    candidate, it runs one of ours) with the others within the run's noise of it (``tied``),
    auto's time over the best measured algorithm's at that size (``auto_vs_best``, with the one
    auto chose), where ring, tree and recursive doubling cross, each at its best form, measured
    (which is faster over each run of sizes, a tie where the gap is inside the noise) and as
    the model predicts (``crossings``), and the spread of the model's error
    (measured / predicted) over the rows; ``noise`` (``run_noise``) for the whole run."""
    noise = run_noise(records)
    margin = noise["fraction"]
    out = {}
    for collective in dict.fromkeys(r["collective"] for r in records):
        rows = [r for r in records if r["collective"] == collective]
        best = []
        for size in sorted({r["size"] for r in rows}):
            at = [r for r in rows if r["size"] == size]
            ours = [r for r in at if r["algorithm"] not in ("native", "auto")
                    and ":" not in r["algorithm"]]
            top = max(ours, key=lambda r: r["busbw_gbs"]) if ours else None
            auto = next((r for r in at if r["algorithm"] == "auto"), None)
            candidates = [r for r in at if r["algorithm"] != "auto"] or at
            # the same schedule as auto's choice, measured as its own row (if it was)
            pick = next((r for r in ours if auto and r["algorithm"] == auto.get("chosen")),
                        None)
            tied = [r["algorithm"] for r in ours if top and r is not top and
                    not _beyond(r["time_p50_us"], top["time_p50_us"], margin)]
            # ours again with the output in symmetric memory (bench.nccl's <alg>:symm rows,
            # and two_shot:symm_in_place)
            symmetric = max((r for r in at if r["algorithm"].partition(":")[2]
                             in ("symm", "symm_in_place")),
                            key=lambda r: r["busbw_gbs"], default=None)
            # torch's SymmetricMemory all_reduce rows (bench.nccl's symm_mem:one_shot and
            # :two_shot): its best over ours, with or without symmetric memory (the anchor)
            anchor = min((r["time_p50_us"] for r in at
                          if r["algorithm"].startswith("symm_mem:")), default=None)
            fastest = min((r["time_p50_us"] for r in ([top] if top else []) +
                           ([symmetric] if symmetric else [])), default=None)
            best.append({"size": size, "best": top["algorithm"] if top else None,
                         "tied": tied,
                         "busbw_gbs": top["busbw_gbs"] if top else None,
                         "ratio_to_native": top.get("ratio_to_native") if top else None,
                         "overall": max(candidates, key=lambda r: r["busbw_gbs"])["algorithm"],
                         "auto_chose": auto.get("chosen") if auto else None,
                         "auto_vs_best": (auto["time_p50_us"] / top["time_p50_us"])
                         if auto and top else None,
                         "pick_vs_best": (pick["time_p50_us"] / top["time_p50_us"])
                         if pick and top else None,
                         "auto_vs_pick": (auto["time_p50_us"] / pick["time_p50_us"])
                         if pick else None,
                         "symmetric": None if symmetric is None else {
                             "best": symmetric["algorithm"].partition(":")[0],
                             "ratio_to_native": symmetric.get("ratio_to_native")},
                         "anchor": anchor / fastest if anchor and fastest else None})
        errors = sorted(r["model_error"] for r in rows if r.get("model_error"))
        model = ({"min": errors[0], "median": errors[len(errors) // 2], "max": errors[-1]}
                 if errors else None)
        out[collective] = {"best": best, "crossings": crossings(rows, margin),
                           "model_error": model}
    out["noise"] = noise
    return out


# Each family at its best form: the fastest of its members measured at a size (the pipelined
# trees are the tree's best forms, the bidirectional ring the ring's), so that "ring against
# tree" compares the algorithms, not one unpipelined implementation.
FAMILIES = {"ring": ("ring", "ring_bidirectional"),
            "tree": ("tree", "tree_pipelined", "double_binary_tree"),
            "recursive_doubling": ("recursive_doubling",)}


def _best_forms(rows, key):
    """{(family, size): time} and {(family, size): member} of each family's fastest member by
    ``key`` (``time_p50_us`` measured, ``predicted_us`` the model's), where one was timed."""
    times, forms = {}, {}
    for r in rows:
        value = r.get(key)
        family = next((f for f, members in FAMILIES.items() if r["algorithm"] in members), None)
        if family is None or not value:     # unpriced, or free (one rank): nothing to cross
            continue
        at = (family, r["size"])
        if at not in times or value < times[at]:
            times[at], forms[at] = value, r["algorithm"]
    return times, forms


def crossings(rows, noise=0.0) -> dict:
    """Where ring, tree and recursive doubling (each at its best form) cross, measured (ties
    inside the run's ``noise``) and as the model predicts (its ``predicted_us``), for the
    pairs timed at common sizes: {"ring vs tree": {..._crossing's, "predicted": ...,
    "forms": the members other than the family's first that were fastest, by size}}."""
    measured, forms = _best_forms(rows, "time_p50_us")
    predicted, _ = _best_forms(rows, "predicted_us")
    sizes = sorted({r["size"] for r in rows})
    out = {}
    for a, b in (("ring", "tree"), ("ring", "recursive_doubling"),
                 ("tree", "recursive_doubling")):
        common = [s for s in sizes if (a, s) in measured and (b, s) in measured]
        if not common:
            continue
        c = _crossing(a, b, common, measured, noise)
        priced = [s for s in common if (a, s) in predicted and (b, s) in predicted]
        c["predicted"] = _crossing(a, b, priced, predicted, tie="even") if priced else None
        c["forms"] = {f"{family} {format_size(s)}": forms[family, s]
                      for s in common for family in (a, b)
                      if forms[family, s] != FAMILIES[family][0]}
        out[f"{a} vs {b}"] = c
    return out


def _crossing(a, b, sizes, time_at, noise=0.0, tie="tie (within the noise)") -> dict:
    """Which of ``a``/``b`` is faster over each run of sizes (``tie`` where their gap is inside
    the run's ``noise``), and the sizes where the faster one flips."""
    winners = []
    for s in sizes:
        if not _beyond(time_at[a, s], time_at[b, s], noise):
            winners.append("tie")
        else:
            winners.append(a if time_at[a, s] < time_at[b, s] else b)
    runs, start = [], 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or winners[i] != winners[start]:
            span = format_size(sizes[start]) + ("" if i - 1 == start
                                                else f"-{format_size(sizes[i - 1])}")
            runs.append(f"{tie} at {span}" if winners[start] == "tie"
                        else f"{winners[start]} faster at {span}")
            start = i
    decided = [(s, w) for s, w in zip(sizes, winners) if w != "tie"]
    flips = [decided[i][0] for i in range(1, len(decided)) if decided[i][1] != decided[i - 1][1]]
    return {"winners": dict(zip(sizes, winners)), "crosses_at": flips,
            "text": "; ".join(runs) + (f" (crosses at {', '.join(map(format_size, flips))})"
                                       if flips else "")}


def _verdict(worst: float, noise: float) -> str:
    """"within 10%" or "NOT within 10%" where the gap to 1.10 is larger than the noise."""
    if not _beyond(worst, 1.10, noise):
        return f" (the noise, {noise:.0%}, is larger than the gap to 1.10: no verdict)"
    return " (within 10%)" if worst <= 1.10 else " (NOT within 10%)"


def format_noise(noise: dict) -> str:
    how = noise["from"]
    if how == "none measured":
        return ("#  noise: not measured (one round and no auto row): the verdicts below "
                "assume none; --rounds 3 measures it")
    line = f"#  noise: {noise['fraction']:.1%}, {how}"
    if "worst" in noise:
        line += (f" (median over {noise['rows']} rows of one schedule's (max - min) / median "
                 f"over its rounds; worst row {noise['worst']:.1%})")
    return line + "; differences smaller than that are reported as ties"


def format_summary(summary: dict) -> str:
    noise = summary.get("noise") or {"fraction": 0.0, "from": "none measured"}
    margin = noise["fraction"]
    lines = ["", "# Summary: best of our algorithms at each size (busbw, ratio to native)",
             format_noise(noise)]
    for collective, info in summary.items():
        if collective == "noise":
            continue
        cells = []
        for b in info["best"]:
            ratio = "" if b["ratio_to_native"] is None else f" {b['ratio_to_native']:.2f}x"
            name = "~".join([str(b["best"])] + list(b.get("tied") or ()))
            cells.append(f"{format_size(b['size'])}: {name}{ratio}")
        lines.append(f"#  {collective}: " + "; ".join(cells))
        symmetric = [(b["size"], b["symmetric"]) for b in info["best"] if b.get("symmetric")]
        if symmetric:
            lines.append("#    with the output in symmetric memory: " + "; ".join(
                f"{format_size(size)}: {s['best']}"
                + ("" if s["ratio_to_native"] is None else f" {s['ratio_to_native']:.2f}x")
                for size, s in symmetric))
        anchors = [b for b in info["best"] if b.get("anchor") is not None]
        if anchors:
            lines.append("#    SymmetricMemory's best / ours (above 1: ours faster): " + "; ".join(
                f"{format_size(b['size'])}: {b['anchor']:.2f}" for b in anchors))
        autos = [b for b in info["best"] if b.get("auto_vs_best") is not None]
        if autos:
            worst = max(b["auto_vs_best"] for b in autos)
            lines.append("#    auto time / best measured (auto's pick): " + "; ".join(
                f"{format_size(b['size'])}: {b['auto_vs_best']:.2f} ({b['auto_chose']}"
                f"{'' if b['auto_chose'] == b['best'] else ' vs ' + str(b['best'])})"
                for b in autos) + f"  -> worst {worst:.2f}" + _verdict(worst, margin))
        picks = [b for b in autos if b.get("pick_vs_best") is not None]
        if picks:
            # the choice judged by its own row, and how far two rows of one schedule differ:
            # the auto row's ratio above mixes the two
            worst = max(b["pick_vs_best"] for b in picks)
            twins = [b["auto_vs_pick"] for b in picks]
            lines.append(f"#    auto's choice, by its own row / best measured: worst {worst:.2f}"
                         + _verdict(worst, margin)
                         + f"; auto row / that row {min(twins):.2f} .. {max(twins):.2f} "
                         "(one schedule measured twice)")
        for pair, c in info["crossings"].items():
            predicted = c.get("predicted")
            lines.append(f"#    {pair}: {c['text']}"
                         + (f"; the model: {predicted['text']}" if predicted else ""))
            if c.get("forms"):
                lines.append("#      best forms: " + ", ".join(
                    f"{where} {member}" for where, member in c["forms"].items()))
        if info.get("model_error"):
            m = info["model_error"]
            lines.append(f"#    model: measured/predicted {m['min']:.2f} .. {m['max']:.2f} "
                         f"(median {m['median']:.2f})")
    return "\n".join(lines)


def comment(text: str, width: int = 100) -> str:
    """``text`` as '#' lines of at most ``width`` characters (paths are never split)."""
    import textwrap
    return textwrap.fill(text, width, initial_indent="# ", subsequent_indent="#   ",
                         break_long_words=False, break_on_hyphens=False)


def metadata(groups, config) -> dict:
    group = groups[0][0]
    meta = {"backend": group.backend, "world_size": group.size, "host": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "command": " ".join(sys.argv), "time": time.time(),
            "config": {k: v for k, v in asdict(config).items() if k != "extra"}}
    if group.backend == "mpi":
        from ..transports.mpi import library_name
        meta["mpi_library"] = library_name()
    return meta


def write_json(path, meta, records, summary, extra=None):
    """The run as JSON: meta, records, summary, and a backend's extras (the GPU probe)."""
    with open(path, "w") as f:
        json.dump({"meta": meta, "records": records, "summary": summary, **(extra or {})}, f,
                  indent=1)


CSV_FIELDS = ["collective", "algorithm", "backend", "world_size", "size", "count", "dtype",
              "op", "iters", "time_p50_us", "time_p99_us", "algbw_gbs", "busbw_gbs",
              "ratio_to_native", "chosen", "native_name", "predicted_us", "model_error",
              "wrong"]


def write_csv(path, records):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def check_plotting() -> str | None:
    """None when matplotlib can plot, else the message to show."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def write_plot(path, records, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    collectives = list(dict.fromkeys(r["collective"] for r in records))
    margin = run_noise(records)["fraction"]
    styles = {"native": "--", "auto": ":"}
    cols = min(2, len(collectives))
    rows = (len(collectives) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    for ax, collective in zip(axes.flat, collectives):
        for algorithm in dict.fromkeys(r["algorithm"] for r in records
                                       if r["collective"] == collective):
            pts = sorted((r["size"], r["busbw_gbs"]) for r in records
                         if r["collective"] == collective and r["algorithm"] == algorithm)
            name = next((r.get("native_name") for r in records if r["algorithm"] == "native"),
                        None) if algorithm == "native" else None
            ax.plot([s for s, _ in pts], [b for _, b in pts], marker="o", markersize=3,
                    linestyle=styles.get(algorithm, "-"),
                    linewidth=2.2 if algorithm == "native" else 1.5,
                    color="black" if algorithm == "native" else None,
                    label=f"native ({name})" if name else algorithm)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(collective)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        # plain numbers (0.05, 1.2), not 5x10^-2, on the log axis
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.1e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ticks = sorted({r["size"] for r in records if r["collective"] == collective})
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(t) for t in ticks], rotation=45)
        ax.grid(True, which="both", alpha=0.3)
        # where ring, tree and recursive doubling (best forms) cross, measured
        for pair, c in crossings([r for r in records if r["collective"] == collective],
                                 margin).items():
            for size in c["crosses_at"]:
                ax.axvline(size, linestyle=":", color="gray", linewidth=1)
                ax.annotate(pair.replace("recursive_doubling", "RD"), (size, 1.0),
                            xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                            va="top", ha="right", color="gray")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    fig.suptitle(f"{meta['backend']}, {meta['world_size']} ranks, {records[0]['dtype']}"
                 + (f" ({meta['mpi_library']})" if meta.get("mpi_library") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress:
    """A one-line bar on stderr, redrawn in place; cleared before each printed row."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.start = total, stream or sys.stderr, time.monotonic()
        self.width = 0

    def update(self, done: int, label: str):
        frac = done / max(1, self.total)
        bar = "#" * int(24 * frac)
        elapsed = time.monotonic() - self.start
        line = f"[{bar:<24}] {done}/{self.total} {elapsed:5.0f}s  {label}"
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def clear(self):
        self.stream.write("\r" + " " * self.width + "\r")
        self.stream.flush()

    def finish(self):
        self.clear()
