"""``python -m collectives.bench.hierarchy``: hierarchical against flat, as the two-level model
predicts them over ranks grouped into hosts (no transport is opened).

For each size, the predicted time of flat schedules (ring, recursive doubling, binomial tree)
and hierarchical ones (``hierarchical:<intra>+<inter>``) on the topology, with a transport's
parameters inside a host (``params.DEFAULTS``) and between hosts
(``params.INTER_HOST_DEFAULTS``, or ``--inter-alpha``/``--inter-gbps``/``--rails``), from
``algorithms.two_level.estimate``: every plan replayed where that is cheap, else the parts'
and rounds' forms (its docstring says which; at 1024 x 8 the flat ring and the hierarchical
parts are priced by form, never simulated). The last columns: the best flat and best
hierarchical time, their ratio (> 1: hierarchical wins), and the crossovers, the sizes from
which the better of the two changes.

    python -m collectives.bench.hierarchy --topology 64x8 --topology 1024x8 --transport socket
"""
from __future__ import annotations

import argparse
import math
import sys

from .. import settings
from ..algorithms import two_level
from ..algorithms.params import DEFAULTS, INTER_HOST_DEFAULTS, Params, inter_host_params
from ..algorithms.topology import Topology
from .cases import format_size, parse_size

FLAT = ("ring", "recursive_doubling", "tree")
PAIRS = (("ring", "ring"), ("ring", "recursive_doubling"), ("ring", "tree"),
         ("recursive_doubling", "recursive_doubling"))
SIZES = tuple(1 << s for s in range(12, 31, 2))          # 4K, 16K, ..., 1G


def compare(collective: str, topology, sizes=SIZES, *, intra: Params, inter: Params,
            flat=FLAT, pairs=PAIRS, itemsize: int = 4) -> list[dict]:
    """One record per size: ``seconds`` by algorithm name (None: not priced), ``best_flat``,
    ``best_hierarchical`` (name, seconds) and ``speedup`` (best flat / best hierarchical)."""
    topology = Topology.of(topology)
    names = list(flat) + two_level.hierarchical_names(collective, pairs)
    rows = []
    for nbytes in sizes:
        seconds = {name: two_level.estimate(collective, name, topology, nbytes, intra=intra,
                                            inter=inter, itemsize=itemsize)
                   for name in names}
        best = {}
        for kind, chosen in (("flat", [n for n in names if n in flat]),
                             ("hierarchical", [n for n in names if n not in flat])):
            priced = [(seconds[n], n) for n in chosen if seconds[n] is not None]
            best[kind] = min(priced) if priced else (math.inf, None)
        rows.append({"collective": collective, "topology": topology.spec, "bytes": nbytes,
                     "seconds": seconds, "best_flat": best["flat"][::-1],
                     "best_hierarchical": best["hierarchical"][::-1],
                     "speedup": best["flat"][0] / best["hierarchical"][0]})
    return rows


def crossovers(rows) -> list[tuple[int, str]]:
    """[(size, 'hierarchical' or 'flat')]: the first size and each size at which the better
    of best flat and best hierarchical changes."""
    out, last = [], None
    for row in rows:
        winner = "hierarchical" if row["speedup"] > 1 else "flat"
        if winner != last:
            out.append((row["bytes"], winner))
            last = winner
    return out


def _time(seconds):
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else \
        f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def table(rows) -> str:
    """A markdown table of ``compare``'s records, the crossovers below it."""
    names = list(rows[0]["seconds"])
    lines = ["| size | " + " | ".join(names) + " | best flat / best hierarchical |",
             "|---" * (len(names) + 2) + "|"]
    for row in rows:
        cells = [_time(row["seconds"][n]) for n in names]
        lines.append(f"| {format_size(row['bytes'])} | " + " | ".join(cells) +
                     f" | {row['speedup']:.2f} |")
    said = ", ".join(f"{winner} from {format_size(size)}" for size, winner in crossovers(rows))
    lines.append("")
    lines.append(f"Crossovers: {said}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.bench.hierarchy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", action="append",
                        help="hosts (COLLECTIVES_TOPOLOGY's form: 64x8, 3,5, map:...); "
                             "repeat for several (default: COLLECTIVES_TOPOLOGY, else 64x8 "
                             "and 1024x8)")
    parser.add_argument("--collective", action="append",
                        choices=["all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                 "all_to_all"], help="default: all_reduce")
    parser.add_argument("--transport", default="socket", choices=sorted(INTER_HOST_DEFAULTS),
                        help="whose parameters (inside a host: DEFAULTS; between hosts: "
                             "INTER_HOST_DEFAULTS)")
    parser.add_argument("--inter-alpha", type=float, help="seconds per message between hosts")
    parser.add_argument("--inter-gbps", type=float, help="GB/s of one host's link")
    parser.add_argument("--rails", type=int, help="network links per host")
    parser.add_argument("--sizes", help="comma-separated sizes (default 4K,16K,...,1G)")
    args = parser.parse_args(argv)
    topologies = args.topology or ([settings.TOPOLOGY().spec] if settings.TOPOLOGY()
                                   else ["64x8", "1024x8"])
    intra = DEFAULTS[args.transport]
    inter = inter_host_params(args.transport)
    changes = {}
    if args.inter_alpha is not None:
        changes["alpha"] = args.inter_alpha
    if args.inter_gbps is not None:
        changes["beta"] = 1 / (args.inter_gbps * 1e9)
    if args.rails is not None:
        changes["ports"] = args.rails
    if changes:
        from dataclasses import replace
        inter = replace(inter, **changes)
    sizes = SIZES if not args.sizes else tuple(parse_size(s) for s in args.sizes.split(","))
    print(f"# two-level model, {args.transport}: inside a host {intra.describe()}; between "
          f"hosts {inter.describe()}, {inter.ports} rail(s) per host")
    for spec in topologies:
        for collective in args.collective or ["all_reduce"]:
            print(f"\n## {collective} on {Topology.parse(spec).spec} "
                  f"({Topology.parse(spec).size} ranks)\n")
            print(table(compare(collective, spec, sizes, intra=intra, inter=inter)))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
