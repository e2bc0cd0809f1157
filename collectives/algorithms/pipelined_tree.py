"""Pipelined binary trees: the vector cut into C chunks that flow through a tree at once.

The binomial trees of ``tree.py`` move the whole vector one level per round, so a rank at
depth d waits for d whole-vector transfers: L(α + nβ) per direction. Here the vector is cut
into C chunks and a rank forwards chunk c while it receives chunk c+1 (and, in all_reduce,
while earlier chunks come back down): once the pipeline is full every link of the tree is
busy every step, and the time is about (fill + C) chunk-times instead of L vector-times, as
in Open MPI's segmented trees and NCCL's tree all_reduce.

The trees. ``binary_tree(p)`` is NCCL's in-order binary tree over ranks 0..p-1: rank v ≠ 0
with lowest set bit b has parent (v ^ b) | 2b, or v ^ b where that is out of range; rank 0 is
the root, with one child. Its depth is ⌈log2 p⌉ and every odd rank is a leaf.
``dual_binary_tree(p)`` is its complement, as NCCL builds its second tree: mirrored (v →
p-1-v) for even p, shifted by one for odd p, so the ranks that are leaves in one tree are
inner nodes in the other (for odd p rank 0 is inner in both).

Slots. Every transfer has a slot, the same number at both of its ends, and a rank's steps are
its slots in order (slots where it moves nothing are no steps). With h(v) the height of v
(leaves 0), d(v) its depth (root 0) and H the root's height:

- up (reduce, all_reduce): v sends chunk c to its parent in slot c + h(v), so its children's
  chunk c arrived, and was reduced into v's, in earlier slots;
- down (broadcast, all_reduce): the root sends chunk c in slot c + s, where s = H if the
  chunk first went up (all_reduce) and 0 otherwise, and v forwards it in slot c + s + d(v),
  having received it in slot c + s + d(v) - 1.

So a step of an inner rank receives chunk c+1 from its children while it sends chunk c up,
and receives a later chunk from its parent while it sends the one before down: chunks at
every level of the tree move in the same step. No step reads or writes a region another
transfer of the same step touches (a rank sends a chunk up long before the result of that
chunk comes back down), and every pair of ranks orders its messages by (slot, tree) at both
ends, which is the order transports match them in.

Chunks. ``chunk_count`` minimizes (C + fill)(α + load·(n/C)β): C = sqrt(fill·load·n·β/α),
fill being the slots before the last chunk can start (2L - 1 for all_reduce, L - 1 for
broadcast and reduce) and load the chunks a busy rank moves per slot in one direction. α and
β are the cost model's defaults for the host transports (``params.DEFAULTS``; schedules do
not know their transport, and plans are cached per rank, size and count): 6250 four-byte
elements. The model prices the plan as it is on every transport, so ``auto`` takes a
pipelined tree only where it is cheaper there. ``chunks=`` overrides the count.

Costs in the α-β-γ model (p ranks, L = ⌈log2 p⌉, n elements, C chunks) with a step's
messages moving at once, sharing the rank's link (the model's ``ports`` at least their
number; with one port each pays its own α, and the replay's first-come-first-served ports
stretch the double tree's steps up to 2x further):

tree_pipelined all_reduce: reduce up the binary tree to rank 0 and broadcast down it, the two
pipelined into each other. An inner rank receives two chunks and sends one up, receives one
and sends two down, per slot: (C + 2L - 1)(α + 3(n/C)β + 2(n/C)γ), → 3nβ + 2nγ for large n
against the binomial tree's 2L·nβ and the ring's 2((p-1)/p)nβ. Limits: 3nβ, not 2nβ, since a
binary tree's inner ranks carry three chunks each way; the double binary tree fixes that.
Every rank ends with rank 0's bits.

tree_pipelined broadcast / reduce: the same tree rooted at ``root`` (relative ranks), down
only or up only: (C + L - 1)(α + 2(n/C)β) (+ 2(n/C)γ for reduce), → 2nβ: latency log p like
the binomial tree, bandwidth within 2x of the pipelined chain (ring, nβ, latency p).
reduce's input is read-only; non-roots accumulate in scratch and never touch output.

double_binary_tree all_reduce (NCCL's double binary tree): half the vector on
``binary_tree(p)``, half on ``dual_binary_tree(p)``, each pipelined as above, in the same
steps. A rank is an inner node in one tree and a leaf in the other, so per slot it moves
three half-chunks and one half-chunk each way: (C + 2L - 1)(α + 2(n/C)β + (n/C)γ),
→ 2nβ + nγ: the ring's bandwidth (up to (p-1)/p) with 2 log p instead of 2(p-1) latency
terms. Limits:
the pipeline's fill costs (2L - 1) chunk-times, so the ring stays ahead where C is small
(mid sizes at small p); for odd p rank 0 is inner in both trees (three reductions per
step, the others two).
Every rank ends with the bits of the two roots (rank 0 for the first half, p-1 or 1 for the
second).

double_binary_tree broadcast / reduce: the two trees rooted at ``root`` (relative ranks;
``rooted_dual_trees``), half the vector down (up) each. The root sends (receives) one
half-chunk to (from) its one child in each tree, every other rank sends and receives two
half-chunks per slot: (C + L - 1)(α + (n/C)β) → nβ (+ nγ for reduce), the
pipelined chain's bandwidth with log p latency. Limits: below a few chunks per level of
depth the fill dominates and the binomial tree is cheaper.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

from .params import DEFAULTS, FALLBACK_TRANSPORT, Params
from .schedule import Copy, Recv, Reduce, Region, Send, Step, algorithm, partition

# The model parameters chunk counts are chosen with (see the module): the host transports'.
PIPELINE_PARAMS = DEFAULTS[FALLBACK_TRANSPORT]
ITEMSIZE = 4            # bytes per element the chunk count assumes (schedules know no dtype)


class Tree(NamedTuple):
    """A rooted tree over nodes 0..p-1: ``parent[v]`` (-1 at the root), ``children[v]``
    (ascending), ``height[v]`` (0 at leaves), ``depth[v]`` (0 at the root)."""
    parent: tuple
    children: tuple
    height: tuple
    depth: tuple
    root: int


def _tree(parent) -> Tree:
    size = len(parent)
    children = [[] for _ in range(size)]
    root = -1
    for v, up in enumerate(parent):
        if up < 0:
            root = v
        else:
            children[up].append(v)
    order, depth = [root], [0] * size          # breadth first: parents before children
    for v in order:
        for u in children[v]:
            depth[u] = depth[v] + 1
            order.append(u)
    height = [0] * size
    for v in reversed(order):
        if children[v]:
            height[v] = 1 + max(height[u] for u in children[v])
    return Tree(tuple(parent), tuple(map(tuple, children)), tuple(height), tuple(depth), root)


@functools.lru_cache(maxsize=64)
def binary_tree(size: int) -> Tree:
    """NCCL's in-order binary tree (``ncclGetBtree``) over 0..size-1, rooted at 0."""
    parent = [-1] * size
    for v in range(1, size):
        bit = v & -v
        up = (v ^ bit) | (bit << 1)
        parent[v] = up if up < size else v ^ bit
    return _tree(parent)


@functools.lru_cache(maxsize=64)
def dual_binary_tree(size: int) -> Tree:
    """The second tree of NCCL's double binary tree (``ncclGetDtree``): ``binary_tree``
    mirrored for even sizes, shifted by one for odd ones; its leaves are the first tree's
    inner nodes."""
    first = binary_tree(size).parent
    if size % 2 == 0:
        def to(v):
            return size - 1 - v
        back = to
    else:
        def to(v):
            return (v - 1) % size

        def back(u):
            return (u + 1) % size
    return _tree([-1 if first[to(v)] < 0 else back(first[to(v)]) for v in range(size)])


@functools.lru_cache(maxsize=64)
def rooted_dual_trees(size: int) -> tuple[Tree, Tree]:
    """``binary_tree`` and ``dual_binary_tree`` both rooted at node 0: in the second, node 0
    (a leaf there, or for odd sizes an inner node) and that tree's root swap places. Every
    other node but one (size-1 for even sizes, 1 for odd) is inner in one tree and a leaf
    in the other."""
    dual = dual_binary_tree(size)
    top = dual.root

    def swap(v):
        return top if v == 0 else 0 if v == top else v
    return binary_tree(size), _tree([-1 if dual.parent[swap(v)] < 0 else
                                     swap(dual.parent[swap(v)]) for v in range(size)])


def chunk_count(count: int, fill: int, load: float, params: Params = PIPELINE_PARAMS,
                itemsize: int = ITEMSIZE) -> int:
    """Chunks for a pipeline of ``fill`` slots before its last chunk can start, whose busiest
    rank moves ``load`` chunks per slot: (C + fill)(α + load·(count/C)·β) is least at
    C = sqrt(fill·load·count·β/α); at least 1, at most ``count``."""
    if count <= 1 or fill <= 0 or params.alpha <= 0:
        return 1
    best = round(math.sqrt(fill * load * count * itemsize * params.beta / params.alpha))
    return max(1, min(count, best))


class _Slots:
    """Transfers and local ops by slot; ``steps()`` yields one Step per slot, in order."""

    def __init__(self):
        self.slots: dict[int, tuple[list, list, list]] = {}

    def add(self, slot, *, send=None, recv=None, local=None):
        entry = self.slots.get(slot)
        if entry is None:
            entry = self.slots[slot] = ([], [], [])
        if send is not None:
            entry[0].append(send)
        if recv is not None:
            entry[1].append(recv)
        if local is not None:
            entry[2].append(local)

    def steps(self):
        for slot in sorted(self.slots):
            sends, recvs, local = self.slots[slot]
            yield Step(tuple(sends), tuple(recvs), tuple(local))


def _lane(slots, tree, v, actual, src, acc, scratch, *, up, down):
    """One tree's transfers for node ``v`` (``actual`` maps nodes to ranks). ``src[c]``,
    ``acc[c]``: chunk c of this node's contribution and of where its children's are reduced
    into (which the down phase also receives into and forwards); ``scratch``: where the
    landing zones start (two per child, alternating by chunk)."""
    kids = tree.children[v]
    parent = tree.parent[v]
    width = max((r.count for r in src), default=0)
    if up:
        # chunk c of a lower child arrives in an earlier slot: it is the first reduced
        order = sorted(range(len(kids)), key=lambda i: (tree.height[kids[i]], i))
        for c in range(len(src)):
            first = src[c]
            for i in order:
                kid = kids[i]
                land = Region("scratch", scratch + ((c % 2) * len(kids) + i) * width,
                              src[c].count)
                slots.add(c + tree.height[kid], recv=Recv(actual(kid), land),
                          local=Reduce(acc[c], first, land))
                first = acc[c]
            if parent >= 0:
                slots.add(c + tree.height[v], send=Send(actual(parent), first))
            elif first != acc[c]:            # a root alone: its input is the result
                slots.add(c, local=Copy(first, acc[c]))
    if down:
        start = tree.height[tree.root] if up else 0
        at = start + tree.depth[v]
        for c in range(len(acc)):
            if parent >= 0:
                slots.add(c + at - 1, recv=Recv(actual(parent), acc[c]))
            for kid in kids:
                slots.add(c + at, send=Send(actual(kid), acc[c]))


def _landing_width(trees, lanes):
    """Scratch elements the landing zones of ``lanes`` (one chunk list per tree) take."""
    return sum(2 * max(map(len, tree.children)) * max((r.count for r in chunks), default=0)
               for tree, chunks in zip(trees, lanes))


def _halves(count, trees, chunks, buffer):
    """The vector cut into one part per tree, each part into ``chunks`` chunks."""
    return [partition(part.count, max(1, min(chunks, part.count)), buffer, part.offset)
            for part in partition(count, len(trees))]


def _fill(trees, up, down):
    """Slots before the last chunk can start (the ``fill`` of ``chunk_count``)."""
    height = max(t.height[t.root] for t in trees)
    return (height if up else 0) + (height if down else 0) - 1


def _rooted(root, size):
    return lambda v: (v + root) % size


def _identity(v):
    return v


# Chunks of the whole vector (n/C elements) a busy rank of a large tree moves per slot in
# one direction: what ``chunk_count`` weighs (see the module).
LOAD = {("tree_pipelined", "all_reduce"): 3, ("tree_pipelined", "broadcast"): 2,
        ("tree_pipelined", "reduce"): 2, ("double_binary_tree", "all_reduce"): 2,
        ("double_binary_tree", "broadcast"): 1, ("double_binary_tree", "reduce"): 1}


def _trees(name, collective, size):
    """The trees schedule ``name`` runs ``collective`` on, one per part of the vector."""
    if name == "tree_pipelined":
        return (binary_tree(size),)
    if collective == "all_reduce":
        return binary_tree(size), dual_binary_tree(size)
    return rooted_dual_trees(size)


def _all_reduce(name, rank, size, count, chunks):
    trees = _trees(name, "all_reduce", size)
    chunks = chunks or chunk_count(count, _fill(trees, True, True), LOAD[name, "all_reduce"])
    slots, scratch = _Slots(), 0
    lanes = _halves(count, trees, chunks, "output")
    for tree, part in zip(trees, lanes):
        _lane(slots, tree, rank, _identity, part, part, scratch, up=True, down=True)
        scratch += _landing_width([tree], [part])
    yield from slots.steps()


def _reduce(name, rank, size, count, root, chunks):
    trees = _trees(name, "reduce", size)
    chunks = chunks or chunk_count(count, _fill(trees, True, False), LOAD[name, "reduce"])
    v = (rank - root) % size
    slots = _Slots()
    ins = _halves(count, trees, chunks, "input")
    if v == 0:
        accs = _halves(count, trees, chunks, "output")
        scratch = 0
    else:          # non-roots accumulate in scratch [0, count); landing zones after it
        accs = [[r._replace(buffer="scratch") for r in part] for part in ins]
        scratch = count
    for tree, src, acc in zip(trees, ins, accs):
        _lane(slots, tree, v, _rooted(root, size), src, acc, scratch, up=True, down=False)
        scratch += _landing_width([tree], [src])
    yield from slots.steps()


def _broadcast(name, rank, size, count, root, chunks):
    trees = _trees(name, "broadcast", size)
    chunks = chunks or chunk_count(count, _fill(trees, False, True), LOAD[name, "broadcast"])
    v = (rank - root) % size
    slots = _Slots()
    for tree, part in zip(trees, _halves(count, trees, chunks, "output")):
        _lane(slots, tree, v, _rooted(root, size), part, part, 0, up=False, down=True)
    yield from slots.steps()


@functools.lru_cache(maxsize=1024)
def shape(name: str, collective: str, size: int, count: int) -> tuple:
    """(chunks, parts, phases) of the pipeline at ``size`` ranks and ``count`` elements with
    the default chunk count: what the cost model's closed form (``formulas``) prices. Each
    transfer moves a chunk of one of ``parts`` parts (n/(parts·C) elements); ``phases`` are
    (slots, messages, reductions): that many slots in which the busiest rank has that many
    transfers each way and that many reductions. all_reduce's are chunks going up alone
    (H slots), up and down at once (C - 1), down alone (the depth D)."""
    up, down = collective != "broadcast", collective != "reduce"
    trees = _trees(name, collective, size)
    height = max(t.height[t.root] for t in trees)
    chunks = chunk_count(count, _fill(trees, up, down), LOAD[name, collective])

    def busiest(up, down):
        sends, recvs, reductions = [0] * size, [0] * size, [0] * size
        for tree in trees:
            for v in range(size):
                kids, parent = len(tree.children[v]), int(tree.parent[v] >= 0)
                sends[v] += (parent if up else 0) + (kids if down else 0)
                recvs[v] += (kids if up else 0) + (parent if down else 0)
                reductions[v] += kids if up else 0
        return max(max(sends), max(recvs)), max(reductions)

    if up and down:
        phases = ((height, *busiest(True, False)), (chunks - 1, *busiest(True, True)),
                  (height, *busiest(False, True)))
    else:
        phases = ((chunks + height - 1, *busiest(up, down)),)
    return chunks, len(trees), phases


@algorithm("all_reduce", "tree_pipelined")
def all_reduce(rank, size, count, chunks=None):
    """Binary tree, pipelined: chunks go up to rank 0 and come back down in the same steps.
    Limits: 3nβ for large n (an inner rank moves three chunks each way per step)."""
    yield from _all_reduce("tree_pipelined", rank, size, count, chunks)


@algorithm("reduce", "tree_pipelined")
def reduce(rank, size, count, root, chunks=None):
    """Binary tree rooted at ``root``, chunks reduced on their way up. Limits: 2nβ (two
    children per rank), against the ring reduce's 2((p-1)/p)nβ at linear latency."""
    yield from _reduce("tree_pipelined", rank, size, count, root, chunks)


@algorithm("broadcast", "tree_pipelined")
def broadcast(rank, size, count, root, chunks=None):
    """Binary tree rooted at ``root``, chunks forwarded as they arrive. Limits: 2nβ (two
    children per rank), against the pipelined chain's nβ at linear latency."""
    yield from _broadcast("tree_pipelined", rank, size, count, root, chunks)


@algorithm("all_reduce", "double_binary_tree")
def double_all_reduce(rank, size, count, chunks=None):
    """NCCL's double binary tree: half the vector pipelined through each of two complementary
    binary trees. Limits: (2L - 1) chunk-times of fill; for odd p rank 0 is inner in both
    trees (three reductions per step where the others have two)."""
    yield from _all_reduce("double_binary_tree", rank, size, count, chunks)


@algorithm("reduce", "double_binary_tree")
def double_reduce(rank, size, count, root, chunks=None):
    """Two complementary binary trees rooted at ``root``, half the vector reduced up each.
    Limits: L - 1 chunk-times of fill; below a few chunks a binomial tree is cheaper."""
    yield from _reduce("double_binary_tree", rank, size, count, root, chunks)


@algorithm("broadcast", "double_binary_tree")
def double_broadcast(rank, size, count, root, chunks=None):
    """Two complementary binary trees rooted at ``root``, half the vector down each.
    Limits: L - 1 chunk-times of fill; below a few chunks a binomial tree is cheaper."""
    yield from _broadcast("double_binary_tree", rank, size, count, root, chunks)
