"""Hierarchical collectives: one plan composed from an intra-host and an inter-host schedule.

Name: ``hierarchical:<intra>+<inter>@<topology>``, e.g. ``hierarchical:ring+ring@64x8``,
``hierarchical:ring+recursive_doubling@3,5``, ``hierarchical:direct+ring@map:0,1,0,1``.
``<intra>`` and ``<inter>`` are registered algorithms (aliases allowed: ``rabenseifner``);
``<topology>`` is ``Topology``'s text (``topology.py``: host sizes or a rank -> host map).
The name is the whole plan: every rank, the simulator, the cost model and every executor
build the same steps from it, and two names of one plan (``@8,8`` and ``@2x8``) have one
canonical form (``canonical_name``). A name without ``@<topology>`` is refused here (schedules
see no environment); ``qualify(name, topology)`` adds one, which is what a group does with
``COLLECTIVES_TOPOLOGY``.

Each part runs on a sub-group of ranks: the sub-schedule is built for its sub-rank and
sub-size (``build_plan``, so it is the same plan the flat algorithm runs) and embedded: its
peers renamed to global ranks, its buffers placed in the caller's buffers or in scratch. The
parts follow one another on every rank, so messages of one part never meet another's.

Lanes. With hosts of sizes L_0..L_{H-1}, K = min L_h *lanes* cross between hosts: lane k is
the rank of local index k on every host (its *lane rank*); ranks of local index >= K (only
on hosts larger than the smallest) take part inside their host only. Even hosts have K = L,
the textbook scheme; one rank per host has K = 1 (the inter algorithm alone); a single host
has no inter part. For block-shaped collectives each rank's block belongs to lane
(local index mod K): block *class* C(h, k) = the blocks of host h's ranks k, k+K, k+2K, ...
(its lane rank's own first); a lane rank carries its class across hosts and hands the extra
blocks to (or takes them from) their owners inside its host.

Decompositions (H hosts, lanes as above):

- all_reduce: the vector is cut into K lanes; intra reduce_scatter on every host (lane k to
  local rank k, nothing to local ranks >= K) -> inter all_reduce of lane k among the lane-k
  ranks -> intra all_gather. Each lane crosses once per host pair in the inter step; every
  rank ends with the same bits (the inter all_reduce gives its lane's ranks one result, the
  all_gather copies it).
- reduce_scatter: the input is packed class by class (class k of every host, hosts in
  order) -> intra reduce_scatter (class k of every host, summed over the host, to lane rank
  k) -> inter reduce_scatter among the lane-k ranks (class C(h, k) to host h's lane rank) ->
  each lane rank keeps its own block and sends the extras of its class to their owners.
- all_gather: the mirror: owners of extra blocks send them to their lane rank -> inter
  all_gather of the classes among the lane-k ranks -> intra all_gather of the lanes' classes
  -> unpacked into rank order.
- broadcast: the vector is cut into K lanes; on the root's host the intra scatter (from the
  root; its local order rotated so that the root is lane 0) hands lane k to lane rank k ->
  inter broadcast of lane k among the lane-k ranks, from the root's host -> intra all_gather
  of the lanes (van de Geijn per level). An intra algorithm without a scatter (``direct``)
  scatters in one step of direct sends.
- all_to_all: each rank packs what it sends by the destination's class -> intra all_to_all
  (class k's data to lane rank k) -> inter all_to_all among the lane-k ranks (host g's class
  k to host g's lane rank) -> each lane rank files its own block and sends every other
  member of its class the blocks meant for it, in source order. The inter step carries all
  the data crossing hosts, as a flat exchange does, in H-1 instead of p-1 messages per rank.

Packing and unpacking are local copies (γ/2 per byte in the model), made only where the
order differs from the buffer's own (never on a single host, for all_reduce or broadcast).

Limits: the inter parts cross hosts once per host pair per lane, but the lanes of a host share
its network link (the two-level model prices that); on hosts larger than the smallest the
ranks past K wait out the inter part, and the lane ranks carry their classes' extra blocks
(hosts of 1 and 7: the 7-rank host's lane rank carries all 7 blocks across); with one rank
per host there are only the inter parts and the packing. reduce, gather, scatter and barrier
have no hierarchical form.
"""
from __future__ import annotations

import functools

from .schedule import (Copy, Matrix, Recv, Reduce, Region, Send, Step, build_plan, family,
                       is_family_name, REGISTRY)
from .topology import Topology

PREFIX = "hierarchical"

# collective -> (what the intra algorithm must implement, what the inter one must)
PARTS = {
    "all_reduce": (("reduce_scatter", "all_gather"), ("all_reduce",)),
    "reduce_scatter": (("reduce_scatter",), ("reduce_scatter",)),
    "all_gather": (("all_gather",), ("all_gather",)),
    "broadcast": (("all_gather",), ("broadcast",)),    # scatter too, where intra has one
    "all_to_all": (("all_to_all",), ("all_to_all",)),
}
SUPPORTED = tuple(PARTS)


# -- names -------------------------------------------------------------------------------------


def _aliased(collective, name):
    from . import ALIASES         # the package's table of other names (it imports this module)
    return ALIASES.get(collective, {}).get(name, name)


def parse(collective: str, name: str) -> tuple[str, str, Topology]:
    """(intra, inter, topology) of ``hierarchical:<intra>+<inter>@<topology>`` (``name``
    with or without the prefix); ValueError naming ``collective`` and what is wrong."""
    rest = name[len(PREFIX) + 1:] if name.startswith(PREFIX + ":") else name
    where = f"{collective} algorithm '{PREFIX}:{rest}'"
    pair, at, spec = rest.rpartition("@")
    if not at:
        raise ValueError(f"{where}: a hierarchical algorithm needs a topology: name it "
                         f"('{PREFIX}:{rest}@3,5', '@64x8', '@map:0,1,0,1') or set "
                         f"COLLECTIVES_TOPOLOGY for the group to add it")
    if collective not in PARTS:
        raise ValueError(f"{where}: {collective} has no hierarchical form; hierarchical "
                         f"algorithms exist for {', '.join(SUPPORTED)}")
    names = pair.split("+")
    if len(names) != 2 or not all(names):
        raise ValueError(f"{where}: expected {PREFIX}:<intra>+<inter>@<topology>, two "
                         f"registered algorithms joined by '+'")
    try:
        topology = Topology.parse(spec)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    intra_needs, inter_needs = PARTS[collective]
    where_run = {"intra-host": "inside each host", "inter-host": "across hosts"}
    resolved = []
    for level, algorithm, needs in (("intra-host", names[0], intra_needs),
                                    ("inter-host", names[1], inter_needs)):
        for part in needs:
            canonical = _aliased(part, algorithm)
            if canonical not in REGISTRY.get(part, {}):
                have = sorted(n for n in REGISTRY.get(needs[0], {})
                              if all(n in REGISTRY.get(c, {}) for c in needs))
                raise ValueError(
                    f"{where}: the {level} algorithm {algorithm!r} has no {part} (hierarchical "
                    f"{collective} runs {' and '.join(needs)} {where_run[level]}); {level} "
                    f"algorithms with {' and '.join(needs)}: {', '.join(have)}")
        resolved.append(_aliased(needs[0], algorithm))
    return resolved[0], resolved[1], topology


def name_of(intra: str, inter: str, topology) -> str:
    """``hierarchical:<intra>+<inter>@<topology spec>``."""
    return f"{PREFIX}:{intra}+{inter}@{Topology.of(topology).spec}"


def canonical_name(collective: str, name: str) -> str:
    """The one name of the plan ``name`` stands for (aliases resolved, the topology's
    shortest text); ValueError as ``parse``."""
    intra, inter, topology = parse(collective, name)
    return name_of(intra, inter, topology)


def qualify(name: str, topology) -> str:
    """``name`` with ``@<topology>`` added where it is a hierarchical name without one (a
    group's ``COLLECTIVES_TOPOLOGY``); every other name as it is."""
    if topology is None or not isinstance(name, str) or not name.startswith(PREFIX + ":") \
            or "@" in name:
        return name
    return f"{name}@{Topology.of(topology).spec}"


def is_hierarchical(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX + ":") and is_family_name(name)


@family(PREFIX)
def resolve(collective: str, rest: str):
    """The schedule function ``hierarchical:<rest>`` stands for (one per canonical name)."""
    intra, inter, topology = parse(collective, rest)
    return _schedule(collective, intra, inter, topology)


@functools.lru_cache(maxsize=256)
def _schedule(collective, intra, inter, topology):
    body = _BODIES[collective]
    name = name_of(intra, inter, topology)

    def schedule(rank, size, *args):
        topology.check_size(size, f"{collective} ({name}) on rank {rank}")
        yield from body(_Layout(topology, rank), intra, inter, *args)
    schedule.__name__ = schedule.__qualname__ = f"{collective}_{PREFIX}"
    schedule.__doc__ = f"{collective}: {intra} inside hosts, {inter} across ({topology.spec})."
    return schedule


# -- embedding a sub-schedule ----------------------------------------------------------------


def _place(region, buffers):
    base = buffers[region.buffer]
    return Region(base.buffer, base.offset + region.offset, region.count)


def _embedded(collective, algorithm, members, sub_rank, args, buffers):
    """The steps of ``algorithm``'s ``collective`` as sub-rank ``sub_rank`` of ``members``
    (sub-rank i is global rank members[i]) runs them, its buffers placed by ``buffers``
    (sub-schedule buffer name -> the global region it starts at). A copy onto itself (a
    buffer placed on another's place) is left out."""
    plan = build_plan(collective, algorithm, sub_rank, len(members), *args)
    for step in plan.steps:
        sends = tuple(Send(members[s.peer], _place(s.region, buffers)) for s in step.sends)
        recvs = tuple(Recv(members[r.peer], _place(r.region, buffers)) for r in step.recvs)
        local = []
        for op in step.local:
            if isinstance(op, Copy):
                src, dst = _place(op.src, buffers), _place(op.dst, buffers)
                if src != dst:
                    local.append(Copy(src, dst))
            elif isinstance(op, Reduce):
                local.append(Reduce(_place(op.dst, buffers), _place(op.a, buffers),
                                    _place(op.b, buffers)))
            else:
                raise TypeError(f"hierarchical: cannot embed local op {op!r}")
        yield Step(sends, recvs, tuple(local))


def _moves(keys, src: dict, dst: dict) -> list:
    """Copies taking every key's region in ``src`` to its region in ``dst`` (runs adjacent
    on both sides merged into one copy); empty ones left out."""
    copies = []
    for key in keys:
        a, b = src[key], dst[key]
        if not a.count:
            continue
        if copies:
            last = copies[-1]
            if last.src.buffer == a.buffer and last.src.end == a.offset and \
                    last.dst.buffer == b.buffer and last.dst.end == b.offset:
                copies[-1] = Copy(last.src._replace(count=last.src.count + a.count),
                                  last.dst._replace(count=last.dst.count + b.count))
                continue
        copies.append(Copy(a, b))
    return copies


def _places(keys, count_of, base: Region) -> dict:
    """key -> its region when ``keys`` lie back to back from ``base``'s offset."""
    out, offset = {}, base.offset
    for key in keys:
        n = count_of(key)
        out[key] = Region(base.buffer, offset, n)
        offset += n
    return out


def _arranged(keys, count_of, src: dict, where: Region):
    """(region, copies): the items ``keys`` back to back, taken from ``src``: where they
    already lie so in ``src``, that region and no copies; else ``where`` (scratch) and the
    copies that fill it."""
    total = sum(count_of(k) for k in keys)
    copies = _moves(keys, src, _places(keys, count_of, where))
    if not copies:
        return Region(where.buffer, where.offset, 0), []
    if len(copies) == 1 and copies[0].src.count == total:
        return copies[0].src, []
    return Region(where.buffer, where.offset, total), copies


class _Scratch:
    """Scratch regions handed out back to back; ``end`` is where sub-schedules' own scratch
    starts (they run one after another, so they share it)."""

    def __init__(self):
        self.end = 0

    def take(self, count):
        region = Region("scratch", self.end, count)
        self.end += count
        return region

    def rest(self):
        return Region("scratch", self.end, 0)


class _Layout:
    """Where ``rank`` sits: its host ``h``, local index ``j``, the lanes ``K``."""

    def __init__(self, topology, rank):
        self.topology = topology
        self.rank = rank
        self.hosts = topology.hosts
        self.H = len(self.hosts)
        self.h = topology.host_of(rank)
        self.j = topology.local_index(rank)
        self.host = self.hosts[self.h]
        self.L = len(self.host)
        self.K = min(topology.sizes)

    def lane(self, k):
        """The lane-k ranks, host by host (sub-rank = host index)."""
        return tuple(host[k] for host in self.hosts)

    def members(self, g, k):
        """Class C(g, k): host g's ranks of local index k, k+K, ... (lane rank first)."""
        return self.hosts[g][k::self.K]


def _pad(lanes, length):
    """The K lanes' counts, then 0 for the local ranks past them."""
    lanes = tuple(lanes)
    return lanes + (0,) * (length - len(lanes))


# -- the collectives ---------------------------------------------------------------------------


def _all_reduce(at, intra, inter, count):
    from .schedule import partition
    K, j, L = at.K, at.j, at.L
    lanes = partition(count, K, "output")
    whole = Region("output", 0, count)
    scratch = _Scratch()
    if L == 1:             # one rank on this host (so one lane): the inter part in place
        if at.H > 1:
            yield from _embedded("all_reduce", inter, at.lane(0), at.h, (count,),
                                 {"output": whole, "scratch": scratch.rest()})
        return
    counts = _pad((lane.count for lane in lanes), L)
    mine = scratch.take(counts[j])
    yield from _embedded("reduce_scatter", intra, at.host, j, (counts,),
                         {"input": whole, "output": mine, "scratch": scratch.rest()})
    if j < K and at.H > 1:
        yield from _embedded("all_reduce", inter, at.lane(j), at.h, (counts[j],),
                             {"output": mine, "scratch": scratch.rest()})
    yield from _embedded("all_gather", intra, at.host, j, (counts,),
                         {"input": mine, "output": whole, "scratch": scratch.rest()})


def _classes(at, counts):
    """(class totals [g][k], packed order of the blocks: class k of host 0, of host 1, ...,
    for k = 0..K-1)."""
    totals = [[sum(counts[r] for r in at.members(g, k)) for k in range(at.K)]
              for g in range(at.H)]
    order = [r for k in range(at.K) for g in range(at.H) for r in at.members(g, k)]
    return totals, order


def _by_rank(counts, buffer):
    """rank -> its block's region in a buffer laid out in rank order."""
    out, offset = {}, 0
    for rank, n in enumerate(counts):
        out[rank] = Region(buffer, offset, n)
        offset += n
    return out


def _reduce_scatter(at, intra, inter, counts):
    K, j, L, h = at.K, at.j, at.L, at.h
    totals, order = _classes(at, counts)
    scratch = _Scratch()
    packed, copies = _arranged(order, counts.__getitem__, _by_rank(counts, "input"),
                               scratch.take(sum(counts)))
    if copies:
        yield Step(local=tuple(copies))
    lane_totals = _pad((sum(totals[g][k] for g in range(at.H)) for k in range(K)), L)
    if L == 1:             # the packed input is this rank's whole lane already
        reduced = packed
    else:
        reduced = scratch.take(lane_totals[j])
        yield from _embedded("reduce_scatter", intra, at.host, j, (lane_totals,),
                             {"input": packed, "output": reduced, "scratch": scratch.rest()})
    if j >= K:
        lane_rank = at.host[j % K]
        yield Step(recvs=(Recv(lane_rank, Region("output", 0, counts[at.rank])),))
        return
    members = at.members(h, j)
    own = Region("output", 0, counts[at.rank])
    if at.H > 1:
        result = own if len(members) == 1 else scratch.take(totals[h][j])
        inter_counts = tuple(totals[g][j] for g in range(at.H))
        yield from _embedded("reduce_scatter", inter, at.lane(j), h, (inter_counts,),
                             {"input": reduced, "output": result, "scratch": scratch.rest()})
    else:
        # one host: the reduced lane holds every host's class k; here just this host's
        result = reduced
    if result == own:
        return
    pieces = _places(members, counts.__getitem__, result)
    yield Step(sends=tuple(Send(r, pieces[r]) for r in members[1:] if counts[r]),
               local=(Copy(pieces[at.rank], own),))


def _all_gather(at, intra, inter, counts):
    K, j, L, h = at.K, at.j, at.L, at.h
    totals, order = _classes(at, counts)
    total = sum(counts)
    own = Region("input", 0, counts[at.rank])
    scratch = _Scratch()
    if j >= K:
        yield Step(sends=(Send(at.host[j % K], own),))
        collected = None
    else:
        members = at.members(h, j)
        if len(members) == 1:
            collected = own
        else:
            collected = scratch.take(totals[h][j])
            pieces = _places(members, counts.__getitem__, collected)
            yield Step(recvs=tuple(Recv(r, pieces[r]) for r in members[1:] if counts[r]),
                       local=(Copy(own, pieces[at.rank]),))
    lane_totals = _pad((sum(totals[g][k] for g in range(at.H)) for k in range(K)), L)
    if j < K:
        if at.H > 1:
            lane = scratch.take(lane_totals[j])
            inter_counts = tuple(totals[g][j] for g in range(at.H))
            yield from _embedded("all_gather", inter, at.lane(j), h, (inter_counts,),
                                 {"input": collected, "output": lane,
                                  "scratch": scratch.rest()})
        else:
            lane = collected
    else:
        lane = Region("input", 0, 0)
    final = _by_rank(counts, "output")
    packed_at = _places(order, counts.__getitem__, Region("output", 0, total))
    identity = all(packed_at[r] == final[r] for r in order if counts[r])
    packed = Region("output", 0, total) if identity else scratch.take(total)
    if L == 1:
        packed = lane      # the one lane is every block, packed
    else:
        yield from _embedded("all_gather", intra, at.host, j, (lane_totals,),
                             {"input": lane, "output": packed, "scratch": scratch.rest()})
    copies = _moves(order, _places(order, counts.__getitem__, packed), final)
    if copies:
        yield Step(local=tuple(copies))


def _broadcast(at, intra, inter, count, root):
    from .schedule import partition
    K, L, h = at.K, at.L, at.h
    root_host = at.topology.host_of(root)
    whole = Region("output", 0, count)
    scratch = _Scratch()

    def order(g):          # the root's host in rotated order: the root is lane 0
        host = at.hosts[g]
        if g != root_host:
            return host
        first = host.index(root)
        return host[first:] + host[:first]

    mine = order(h)
    jj = mine.index(at.rank)
    lanes = partition(count, K, "output")
    counts = _pad((lane.count for lane in lanes), L)
    if L == 1:             # one rank here (one lane): the inter part straight into output
        if at.H > 1:
            yield from _embedded("broadcast", inter, tuple(order(g)[0] for g in range(at.H)),
                                 h, (count, root_host),
                                 {"output": whole, "scratch": scratch.rest()})
        return
    held = scratch.take(counts[jj])
    if h == root_host:
        if intra in REGISTRY.get("scatter", {}):
            yield from _embedded("scatter", intra, mine, jj, (counts, 0),
                                 {"input": whole, "output": held, "scratch": scratch.rest()})
        elif jj == 0:
            yield Step(sends=tuple(Send(mine[k], lanes[k]) for k in range(1, K)
                                   if lanes[k].count),
                       local=(Copy(lanes[0], held),))
        elif jj < K:
            yield Step(recvs=(Recv(mine[0], held),))
    if jj < K and at.H > 1:
        yield from _embedded("broadcast", inter, tuple(order(g)[jj] for g in range(at.H)), h,
                             (counts[jj], root_host),
                             {"output": held, "scratch": scratch.rest()})
    yield from _embedded("all_gather", intra, mine, jj, (counts,),
                         {"input": held, "output": whole, "scratch": scratch.rest()})


def _all_to_all(at, intra, inter, counts):
    K, j, L, h, H = at.K, at.j, at.L, at.h, at.H
    rank = at.rank
    scratch = _Scratch()
    classes = [[at.members(g, k) for k in range(K)] for g in range(H)]

    def count(item):       # (source, destination)
        return counts[item[0]][item[1]]

    # what this rank sends, by destination class: class b's of host 0, of host 1, ...
    sending = [(rank, r) for b in range(K) for g in range(H) for r in classes[g][b]]
    inputs, offset = {}, 0
    for r, n in enumerate(counts[rank]):
        inputs[(rank, r)] = Region("input", offset, n)
        offset += n
    packed, copies = _arranged(sending, count, inputs, scratch.take(sum(counts[rank])))
    if copies:
        yield Step(local=tuple(copies))
    # after the intra part, lane rank j holds, from each host rank a in turn, a's data for
    # class j of every host
    arrived = [(s, r) for s in at.host for g in range(H) for r in classes[g][j]] \
        if j < K else []
    if L == 1:
        received = packed
    else:
        intra_counts = Matrix(tuple(
            tuple(sum(counts[s][r] for g in range(H) for r in classes[g][b]) if b < K else 0
                  for b in range(L)) for s in at.host))
        received = scratch.take(sum(count(i) for i in arrived))
        yield from _embedded("all_to_all", intra, at.host, j, (intra_counts,),
                             {"input": packed, "output": received, "scratch": scratch.rest()})
    if j >= K:
        yield Step(recvs=(Recv(at.host[j % K], Region(
            "output", 0, sum(row[rank] for row in counts))),))
        return
    mine = classes[h][j]
    if H > 1:
        # regroup by destination host, then cross: host g's lane rank gets, from each host in
        # turn, that host's ranks' data for class C(g, j)
        outgoing = [(s, r) for g in range(H) for s in at.host for r in classes[g][j]]
        crossing, copies = _arranged(outgoing, count, _places(arrived, count, received),
                                     scratch.take(sum(count(i) for i in outgoing)))
        if copies:
            yield Step(local=tuple(copies))
        inter_counts = Matrix(tuple(
            tuple(sum(counts[s][r] for s in at.hosts[x] for r in classes[y][j])
                  for y in range(H)) for x in range(H)))
        held_items = [(s, r) for x in range(H) for s in at.hosts[x] for r in mine]
        held = scratch.take(sum(count(i) for i in held_items))
        yield from _embedded("all_to_all", inter, at.lane(j), h, (inter_counts,),
                             {"input": crossing, "output": held, "scratch": scratch.rest()})
    else:
        held_items, held = arrived, received
    at_held = _places(held_items, count, held)
    sources = range(len(counts))
    # every member's blocks in source order: the own into output, the others' sent whole
    outbound, sends = [], []
    for r in mine[1:]:
        items = [(s, r) for s in sources]
        region, copies = _arranged(items, count, at_held,
                                   scratch.take(sum(count(i) for i in items)))
        outbound += copies
        if region.count:
            sends.append(Send(r, region))
    filed = _moves([(s, rank) for s in sources], at_held,
                   _places([(s, rank) for s in sources], count,
                           Region("output", 0, 0)))
    if outbound:
        yield Step(local=tuple(outbound))
    yield Step(sends=tuple(sends), local=tuple(filed))


_BODIES = {"all_reduce": _all_reduce, "reduce_scatter": _reduce_scatter,
           "all_gather": _all_gather, "broadcast": _broadcast, "all_to_all": _all_to_all}
