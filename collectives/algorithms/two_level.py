"""The two-level model: any schedule, flat or hierarchical, priced over ranks grouped into
hosts, with the links inside a host (``intra``: a transport's ``DEFAULTS``) and those between
hosts (``inter``: ``params.INTER_HOST_DEFAULTS``, or a machine's own) as two link classes.

``predict`` replays every rank's plan (``cost.replay`` with ``hosts``): a message between two
hosts costs inter α + β·n and holds a rail of each host's network link for its β·n, so ranks
of one host that cross at once share its bandwidth; everything else is the one-level model.
Exact for what runs, and as slow as the replay: fine at 64 x 8 for all but the flat ring's
2(p-1) steps on every rank.

``estimate`` is what scales to 1024 x 8 (8192 ranks), for hosts of equal size (even hosts
with more than a few thousand transfers to replay; replayed otherwise):

- hierarchical: its parts one after another, each priced by the one-level model at its own
  size: the intra parts on one host with ``intra``; the inter part on H ranks with ``inter``
  whose β is multiplied by the lanes sharing a host's link (K lanes over ``inter.ports``
  rails). Every rank finishes a part before it starts the next, so the parts add up; the
  tests hold the sum to the full replay at small sizes.
- flat ring: every step of the ring has a rank whose right neighbour is on another host, and
  a ring moves at its slowest link: the ring's closed form with the slower class's α and β
  (inter, unless a host's own links are slower), plus its reductions at intra γ.
- flat recursive doubling (Rabenseifner), binomial tree: their closed forms round by round,
  each round inside a host (partner distance < L, hosts of L ranks, powers of two) or across
  it; a round across has the rank's host link carrying what all its ranks that cross send
  (recursive doubling: all L, tree: one).

Other flat schedules at that scale: None (not priced).
"""
from __future__ import annotations

import math

from . import cost
from .formulas import formula
from .hierarchical import PARTS, is_hierarchical, parse, qualify
from .params import Params
from .topology import Topology

# replayed up to this many transfers and local operations in all (a few seconds in Python)
REPLAY_WORK = 400_000


def predict(collective: str, algorithm: str, topology, nbytes: int, *, intra: Params,
            inter: Params, itemsize: int = 4) -> float:
    """Seconds of ``algorithm`` (flat, or hierarchical: ``hierarchical:<intra>+<inter>``,
    the topology added where the name has none) for a uniform call of ``nbytes``
    (``cost.uniform_counts``) on ``topology``, every rank's plan replayed."""
    topology = Topology.of(topology)
    algorithm = qualify(algorithm, topology)
    counts = cost.uniform_counts(collective, topology.size, nbytes, itemsize)
    return cost.predict(collective, algorithm, topology.size, counts, 0, itemsize, intra,
                        hosts=topology.host_map, inter=inter)


def estimate(collective: str, algorithm: str, topology, nbytes: int, *, intra: Params,
             inter: Params, itemsize: int = 4) -> float | None:
    """Seconds of ``algorithm`` on ``topology``: ``predict`` where replaying is cheap, the
    forms of the module text where it is not (None where there is none)."""
    topology = Topology.of(topology)
    algorithm = qualify(algorithm, topology)
    p = topology.size
    even = len(set(topology.sizes)) == 1 and topology.contiguous
    if not even or _work(collective, algorithm, p, nbytes, itemsize) <= REPLAY_WORK:
        return predict(collective, algorithm, topology, nbytes, intra=intra, inter=inter,
                       itemsize=itemsize)
    H, L = len(topology.hosts), topology.sizes[0]
    if is_hierarchical(algorithm):
        return _hierarchical(collective, algorithm, H, L, nbytes, intra, inter, itemsize)
    return _flat(collective, algorithm, H, L, nbytes, intra, inter, itemsize)


def _work(collective, algorithm, p, nbytes, itemsize):
    """About how many operations the replay walks: rank 0's times the world size (plans of
    hierarchical names are built for rank 0 only here, which is cheap)."""
    if not is_hierarchical(algorithm) and algorithm == "ring" and p > 1024:
        return math.inf               # 2(p-1) steps on every rank: never worth building
    return cost.counted_work(collective, algorithm, p, nbytes, itemsize)


def _hierarchical(collective, algorithm, H, L, nbytes, intra, inter, itemsize):
    intra_name, inter_name, _ = parse(collective, algorithm)
    # the lanes of a host cross at once, sharing its link; their reductions are the host's
    shared = Params(alpha=inter.alpha, beta=inter.beta * max(1.0, L / inter.ports),
                    gamma=intra.gamma, local_alpha=intra.local_alpha)
    n = nbytes
    parts = {
        "all_reduce": [("reduce_scatter", intra_name, L, n, intra),
                       ("all_reduce", inter_name, H, n / L, shared),
                       ("all_gather", intra_name, L, n, intra)],
        "reduce_scatter": [("reduce_scatter", intra_name, L, n, intra),
                           ("reduce_scatter", inter_name, H, n / L, shared)],
        "all_gather": [("all_gather", inter_name, H, n / L, shared),
                       ("all_gather", intra_name, L, n, intra)],
        "broadcast": [("broadcast", inter_name, H, n / L, shared),
                      ("all_gather", intra_name, L, n, intra)],
        # what crosses: (H-1)/H of every rank's buffer, H rank-blocks of n/H each per lane
        "all_to_all": [("all_to_all", intra_name, L, n, intra),
                       ("all_to_all", inter_name, H, n, shared)],
    }[collective]
    if collective == "broadcast":
        parts.insert(0, ("scatter", intra_name, L, n, intra))
    total = 0.0
    for part, name, size, volume, params in parts:
        if size == 1:
            continue
        per_call = _call_bytes(part, size, volume)
        seconds = cost.estimate(part, name, size, max(1, int(per_call)), params, itemsize)
        if not math.isfinite(seconds):
            return None
        total += seconds
    return total


def _call_bytes(collective, size, n):
    """``cost.uniform_counts``' nbytes for a part whose n (as in ``formulas``) is ``n``."""
    if collective == "scatter":
        return n / size
    return n


def _flat(collective, algorithm, H, L, nbytes, intra, inter, itemsize):
    p = H * L
    n = float(nbytes)
    if algorithm == "ring":
        # the slower of the two link classes sets the pace of every step
        block = n / p if collective != "broadcast" else n
        gamma = intra.gamma_at(block, L)
        closed = [formula(collective, "ring", p, n, Params(alpha=a, beta=b, gamma=gamma),
                          itemsize, copies=True)
                  for a, b in ((inter.alpha, inter.beta), (intra.alpha, intra.beta_at(block)))]
        if closed[0] is None:
            return None
        reductions = (p - 1) if collective in ("all_reduce", "reduce_scatter") else 0
        return max(closed) + reductions * intra.local_alpha
    power = p & (p - 1) == 0 and L & (L - 1) == 0
    if not power or collective != "all_reduce":
        return None
    lg, count = int(math.log2(p)), -(-int(nbytes) // itemsize)

    def hop(distance, nbytes_moved, crossing_per_host, reduced):
        if distance < L:
            a, b = intra.alpha, intra.beta_at(nbytes_moved)
        else:
            a, b = inter.alpha, inter.beta * max(1.0, crossing_per_host / inter.ports)
        local = intra.local_alpha + nbytes_moved * intra.gamma_at(nbytes_moved, L)
        return a + nbytes_moved * b + (local if reduced else 0.0)

    if algorithm == "recursive_doubling":
        from .recursive_doubling import RABENSEIFNER_MIN_BLOCK
        if count >= RABENSEIFNER_MIN_BLOCK * p:      # halving p/2, p/4, ...; doubling back
            halving = sum(hop(p >> (k + 1), n / 2 ** (k + 1), L, 1) for k in range(lg))
            doubling = sum(hop(1 << k, n * (1 << k) / p, L, 0) for k in range(lg))
            return halving + doubling
        return sum(hop(1 << k, n, L, 1) for k in range(lg))
    if algorithm == "tree":                 # binomial reduce up, broadcast down: one per host
        return sum(hop(1 << k, n, 1, 1) + hop(1 << k, n, 1, 0) for k in range(lg))
    return None


def hierarchical_names(collective: str, pairs) -> list[str]:
    """``hierarchical:<intra>+<inter>`` for each (intra, inter) pair that has ``collective``'s
    parts (no topology: ``predict`` and ``estimate`` add theirs)."""
    intra_needs, inter_needs = PARTS[collective]
    from .schedule import REGISTRY
    return [f"hierarchical:{a}+{b}" for a, b in pairs
            if all(a in REGISTRY.get(c, {}) for c in intra_needs)
            and all(b in REGISTRY.get(c, {}) for c in inter_needs)]
