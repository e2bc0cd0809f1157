"""The kernels without a program, run by the pushed-form simulator (``pushed_sim``):
``two_shot_in_place``, ``pipelined_reduce_scatter`` (its gather by thread blocks or by the
copy engines) and ``copies_around`` (the copy engines' all_gather and all_to_all), as
kernels/cuda_peer.cu and executors/peer.py run them, each on every worker of a rank.

``Kernels`` is a part of ``pushed_sim.Group``: its methods use the group's flags and staging
memory and its waits (``_until``, ``_barrier``), and yield as the group's workers do."""
from __future__ import annotations

from ..errors import CollectiveError
from ..kernels.peer_protocol import in_place_epoch
from . import pushed

# what ``pipelined_reduce_scatter`` runs (executors/peer.py: pipelined)
PIPELINED = (("reduce_scatter", "direct"), ("all_reduce", "two_shot"))


def by_copy_engines(plan) -> bool:
    """Whether the copy engines run ``plan`` (executors/peer.py: copied): a direct all_gather
    or all_to_all of alike blocks."""
    if (plan.collective, plan.algorithm) == ("all_gather", "direct"):
        return len(set(plan.args[0])) == 1
    if (plan.collective, plan.algorithm) == ("all_to_all", "direct"):
        return len({n for row in plan.args[0] for n in row}) == 1
    return False


class CalledOtherwise(CollectiveError):
    """A rank running a call in place (``two_shot_in_place``) found a peer that did not (the
    kernel's ``ERROR_CALLED_OTHERWISE``)."""

    def __init__(self, rank, peer):
        super().__init__(f"rank {rank}: rank {peer} did not run this all_reduce in place")
        self.rank, self.peer = rank, peer


class Kernels:
    """The kernels without a program on worker ``w`` of ``rank`` (``pushed_sim.Group``'s)."""

    def _in_place(self, rank, w, count, buffer, reduce, piece, deadline):
        """``two_shot_in_place`` (kernels/cuda_peer.cu) on worker ``w`` of ``rank``: its
        MODE word and epoch; then, once every peer's epoch of this call is there and says the
        peer runs in place too, this worker's share of the rank's block read on every rank,
        reduced in rank order and written back on every rank, piece by piece; then its
        delivered word to every peer, and a wait for the same worker of every peer."""
        call, size = self.calls[rank], self.size
        epoch = in_place_epoch(call)

        def wait(ready, peer, what):
            return self._until(ready, deadline, rank, 0, peer, what)

        if w == 0:
            self.landing[rank] = buffer
            self.mode[rank] = call + 1
            self.epoch[rank] = epoch
        buffers = [None] * size
        for q in range(size):
            if q == rank:
                buffers[q] = buffer
                continue
            if self.in_place_waits["epochs"]:
                yield from wait(lambda: self.epoch[q] >= epoch, q, "its epoch")
                if self.mode[q] != call + 1:
                    raise CalledOtherwise(rank, q)
            buffers[q] = self.landing[q]
        # this rank's block in 16-byte units (alike on every rank), this worker's share
        units = -(-count // self.align)
        lo = min(count, units * rank // size * self.align)
        hi = min(count, units * (rank + 1) // size * self.align)
        a0, b0 = pushed.share(hi - lo, w, self.workers, self.align)
        for a in range(lo + a0, lo + b0, piece):
            b = min(lo + b0, a + piece)
            values = []
            for q in range(size):               # every load of the piece, then the stores
                values.append(buffers[q][a:b].copy())
                yield
            acc = values[0]
            for value in values[1:]:
                acc = reduce(acc, value)
            for q in range(size):
                buffers[q][a:b] = acc
                yield
        for q in range(size):
            if q != rank:
                self.delivered[q, rank, w] = self.sent[rank, q] + 1
        if self.in_place_waits["delivered"]:
            for q in range(size):
                if q != rank:
                    target = self.received[rank, q] + 1
                    yield from wait(lambda: self.delivered[rank, q, w] >= target, q,
                                    "its block")

    def _pipelined(self, rank, w, count, input, output, reduce, piece, deadline, chunks,
                   pushers, gather=False, barriers=None, moves=None, symmetric=False):
        """``pipelined_reduce_scatter`` (kernels/cuda_peer.cu) on worker ``w`` of ``rank``:
        worker 0's epoch; a pusher (w < pushers) waits for every peer's epoch of this call,
        then pushes its share of chunk after chunk of every peer's block into that peer's
        scratch slot for this rank (direct.reduce_scatter's: peers in rank order, itself
        skipped), its delivered word to each peer numbering the chunks pushed; a reducer
        waits for chunk k from every pusher of every peer, then reduces its share of it in
        rank order into output.

        ``gather`` (a two_shot all_reduce of ``count`` elements per rank's block): the slots
        lie at the staging memory's start, where programs stage their outputs (here the
        staging output, ``out``), the reduced block after them; a reducer stores its share
        of chunk k there too and numbers it in its own delivered word (``chunks`` + k + 1);
        then every worker, its pushes or reductions done, reads its share of each peer's
        chunk k once every reducer of that peer has said so, into the peer's block of
        output, says it has read everything (2 ``chunks`` + 1) and waits until the same
        worker of every peer has. With ``barriers`` (the rank's, ``_barrier``) the copy
        engines gather instead: ``_copied_gather``.

        ``moves`` ("all_gather" or "all_to_all": kinds 3, 4, of p blocks of ``count``): the
        slots lie at the staging memory's start too, and nothing is reduced. Worker 0 says
        where peers' pushes into this rank's output land (``landing``: the output where it
        is ``symmetric``, else its staging output's slots) before its epoch; a pusher, after
        each peer's epoch, reads where that peer takes them, and pushes this rank's block for
        it (an all_gather's whole input, an all_to_all's block q) chunk by chunk there: into
        its output at this rank's block, or into its slot for this rank; the other workers
        copy instead of reducing (``_copy_chunks``)."""
        call, size = self.calls[rank], self.size
        area = self.out if gather or moves else self.scratch
        reduced_at = (size - 1) * count
        epoch = in_place_epoch(call)

        def wait(ready, step, peer, what):
            return self._until(ready, deadline, rank, step, peer, what)

        def chunk_share(k, me, of):            # 16-byte units alike on every rank
            units = -(-count // self.align)
            c0, c1 = units * k // chunks, units * (k + 1) // chunks
            lo = min(count, (c0 + (c1 - c0) * me // of) * self.align)
            hi = min(count, (c0 + (c1 - c0) * (me + 1) // of) * self.align)
            return lo, hi

        if w == 0:
            if moves:                          # its PLACE word, before the epoch
                self.landing[rank] = output if symmetric else self.out[rank]
            self.epoch[rank] = epoch
        if w < pushers:
            yield from self._push_chunks(rank, w, count, input, piece, wait, chunks, pushers,
                                         chunk_share, area, epoch, moves)
        elif moves:
            yield from self._copy_chunks(rank, w, count, input, output, piece, wait, chunks,
                                         pushers, chunk_share, moves,
                                         None if symmetric else area[rank])
        else:
            yield from self._reduce_chunks(rank, w, count, input, output, reduce, piece, wait,
                                           chunks, pushers, chunk_share, area[rank], gather,
                                           reduced_at)
        if gather and barriers is not None:
            yield from self._copied_gather(rank, w, count, output, piece, wait, chunks,
                                           pushers, reduced_at, barriers, deadline)
        elif gather:
            yield from self._gather(rank, w, count, output, piece, wait, chunks, pushers,
                                    chunk_share, reduced_at)

    def _push_chunks(self, rank, w, count, input, piece, wait, chunks, pushers, chunk_share,
                     area, epoch, moves):
        """A pusher's part of ``_pipelined``: after each peer's ``epoch``, where this rank's
        block for it goes (its slot for this rank in the peer's ``area``, or the peer's
        symmetric output where ``moves`` lands there); then its share of chunk after chunk of
        every peer's block pushed there, peers in rank order from the next, each chunk said
        to every peer (its delivered word)."""
        size = self.size
        into = {}                              # per peer: where this rank's block goes
        for q in range(size):
            if q == rank:
                continue
            if self.pipelined_waits["epochs"]:
                yield from wait(lambda: self.epoch[q] >= epoch, 0, q, "its epoch")
            slot = (rank if rank < q else rank - 1) * count
            into[q] = (area[q], slot)
            if moves and self.landing[q] is not self.out[q]:    # its symmetric output
                into[q] = (self.landing[q], rank * count)
        for k in range(chunks):
            lo, hi = chunk_share(k, w, pushers)
            for s in range(1, size):
                q = (rank + s) % size
                theirs, at = into[q]
                frm = 0 if moves == "all_gather" else q * count
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    theirs[at + a:at + b] = input[frm + a:frm + b]
                    yield
            for q in range(size):
                if q != rank:
                    self.delivered[q, rank, w] = self.sent[rank, q] + k + 1

    def _pushed(self, rank, k, pushers, wait):
        """Until every pusher of every peer has said chunk ``k`` (``_pipelined``'s reducers'
        and copiers' wait before each chunk)."""
        if not self.pipelined_waits["chunks"]:
            return
        for q in range(self.size):
            for j in range(pushers if q != rank else 0):
                target = self.received[rank, q] + k + 1
                yield from wait(lambda: self.delivered[rank, q, j] >= target, 1, q,
                                "its chunk")

    def _reduce_chunks(self, rank, w, count, input, output, reduce, piece, wait, chunks,
                       pushers, chunk_share, scratch, gather, reduced_at):
        """A reducer's part of ``_pipelined``."""
        size = self.size
        blocks = [input[rank * count:(rank + 1) * count] if q == rank else
                  scratch[(q if q < rank else q - 1) * count:][:count] for q in range(size)]
        for k in range(chunks):
            yield from self._pushed(rank, k, pushers, wait)
            lo, hi = chunk_share(k, w - pushers, self.workers - pushers)
            for a in range(lo, hi, piece):
                b = min(hi, a + piece)
                values = []
                for q in range(size):
                    values.append(blocks[q][a:b].copy())
                    yield
                acc = values[0]
                for value in values[1:]:
                    acc = reduce(acc, value)
                if gather:
                    output[rank * count + a:rank * count + b] = acc
                    scratch[reduced_at + a:reduced_at + b] = acc
                else:
                    output[a:b] = acc
                yield
            if gather:
                for q in range(size):
                    if q != rank:
                        self.delivered[q, rank, w] = self.sent[rank, q] + chunks + k + 1

    def _copy_chunks(self, rank, w, count, input, output, piece, wait, chunks, pushers,
                     chunk_share, moves, staged):
        """A copier's part of ``_pipelined`` in an all_gather or all_to_all (where reducers
        reduce): for chunk after chunk, once every pusher of every peer has said it, its
        share of the chunk of every block of output in rank order: each peer's out of its
        slot in ``staged`` (this rank's staging output; None where the output is symmetric
        and the peers pushed into it), this rank's own from its input."""
        size = self.size
        own = 0 if moves == "all_gather" else rank * count
        for k in range(chunks):
            yield from self._pushed(rank, k, pushers, wait)
            lo, hi = chunk_share(k, w - pushers, self.workers - pushers)
            for q in range(size):
                if q != rank and staged is None:
                    continue
                src, at = (input, own) if q == rank else (staged, (q - (q > rank)) * count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    output[q * count + a:q * count + b] = src[at + a:at + b]
                    yield

    def _gather(self, rank, w, count, output, piece, wait, chunks, pushers, chunk_share,
                reduced_at):
        """Every worker's second part in a pipelined all_reduce (``_pipelined``)."""
        size = self.size
        for k in range(chunks):
            for q in range(size):
                if q == rank or not self.pipelined_waits["reduced"]:
                    continue
                for j in range(pushers, self.workers):
                    target = self.received[rank, q] + chunks + k + 1
                    yield from wait(lambda: self.delivered[rank, q, j] >= target, 2, q,
                                    "its reduced chunk")
            lo, hi = chunk_share(k, w, self.workers)
            for s in range(1, size):
                q = (rank + s) % size
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    output[q * count + a:q * count + b] = \
                        self.out[q][reduced_at + a:reduced_at + b]
                    yield
        for q in range(size):
            if q != rank:
                self.delivered[q, rank, w] = self.sent[rank, q] + 2 * chunks + 1
        for q in range(size):
            if q != rank and self.pipelined_waits["read"]:
                target = self.received[rank, q] + 2 * chunks + 1
                yield from wait(lambda: self.delivered[rank, q, w] >= target, 2, q,
                                "its reads")

    def _copied_gather(self, rank, w, count, output, piece, wait, chunks, pushers,
                       reduced_at, barriers, deadline):
        """The copy engines' gather of a pipelined all_reduce (``gather`` 2, then
        ``copies_around``'s end): worker 0 waits until every reducer of every peer has said
        its last chunk, and the first launch ends (a barrier of the rank's workers); then
        the copies, one piece at a time like any worker's, each peer's reduced block into
        its place in output; then the second launch (after the copies, on the stream: a
        barrier again), whose one worker says it has read everything and waits until every
        peer has."""
        size = self.size
        if w == 0:
            for q in range(size):
                if q == rank or not self.pipelined_waits["reduced"]:
                    continue
                for j in range(pushers, self.workers):
                    target = self.received[rank, q] + 2 * chunks
                    yield from wait(lambda: self.delivered[rank, q, j] >= target, 2, q,
                                    "its reduced block")
        yield from self._barrier(rank, w, barriers, 2, deadline)
        if w == 0:
            for s in range(1, size):
                q = (rank + s) % size
                for a in range(0, count, piece):
                    b = min(count, a + piece)
                    output[q * count + a:q * count + b] = \
                        self.out[q][reduced_at + a:reduced_at + b]
                    yield
        yield from self._barrier(rank, w, barriers, 2, deadline)
        if w != 0:
            return
        yield from self._copies_end(rank, 2 * chunks + 1, 2, deadline)

    def _copied(self, rank, w, plan, input, output, piece, deadline, barriers, chunks):
        """A direct all_gather or all_to_all as the copy engines run it (``copies_around``
        beside the caller's stream, the executor's waits and copies on it, then its end):
        workers 1.. are the first launch's blocks, worker 0 the caller's stream. The rank's
        epoch; the blocks copy their share of chunk after chunk of every piece of the input
        (an all_gather's whole input; an all_to_all's block for each peer, into the slot of
        the peer's rank order with this rank skipped) into the rank's staging memory
        (``out``), saying each chunk to every peer (message k + 1), then their share of the
        rank's own block from its input into the output; the stream, for each chunk, waits
        until every block of every peer has said it and copies the chunk of each peer's
        block for this rank out of that peer's staging memory, a piece at a time; then (the
        side stream joined: a barrier) it says it has read everything (message chunks + 1)
        and waits until every peer has."""
        size, workers = self.size, self.workers
        all_to_all = plan.collective == "all_to_all"
        count = plan.args[0][0][0] if all_to_all else plan.args[0][rank]
        bounds = [(count * k // chunks, count * (k + 1) // chunks) for k in range(chunks)]
        if all_to_all:      # (from the input, into staging) per peer; this rank's slot there
            pieces = [(q * count, (q - (q > rank)) * count) for q in range(size) if q != rank]
            def slot(q): return (rank - (rank > q)) * count
        else:
            pieces = [(0, 0)]
            def slot(q): return 0
        own = rank * count if all_to_all else 0
        if w == 0:
            self.epoch[rank] = in_place_epoch(self.calls[rank])
            for k, (lo, hi) in enumerate(bounds):
                for q in range(size):
                    if q == rank or not self.pipelined_waits["staged"]:
                        continue
                    for j in range(1, workers):
                        target = self.received[rank, q] + k + 1
                        yield from self._until(lambda: self.delivered[rank, q, j] >= target,
                                               deadline, rank, 0, q, "its staged input")
                for s in range(1, size):
                    q = (rank + s) % size
                    for a in range(lo, hi, piece):
                        b = min(hi, a + piece)
                        output[q * count + a:q * count + b] = self.out[q][slot(q) + a:
                                                                         slot(q) + b]
                        yield
        else:
            for k, (lo, hi) in enumerate(bounds):
                mine = lo + (hi - lo) * (w - 1) // (workers - 1)
                end = lo + (hi - lo) * w // (workers - 1)
                for src, dst in pieces:
                    for a in range(mine, end, piece):
                        b = min(end, a + piece)
                        self.out[rank][dst + a:dst + b] = input[src + a:src + b]
                        yield
                for q in range(size):
                    if q != rank:
                        self.delivered[q, rank, w] = self.sent[rank, q] + k + 1
            mine = count * (w - 1) // (workers - 1)
            end = count * w // (workers - 1)
            for a in range(mine, end, piece):
                b = min(end, a + piece)
                output[rank * count + a:rank * count + b] = input[own + a:own + b]
                yield
        yield from self._barrier(rank, w, barriers, 1, deadline)
        if w != 0:
            return
        yield from self._copies_end(rank, chunks + 1, 1, deadline)

    def _copies_end(self, rank, message, step, deadline):
        """``copies_around``'s end (mode 1, one worker): says ``message`` to every peer (in
        its word 0), then waits until every peer has said it, so no peer reads this rank's
        staging memory any more."""
        for q in range(self.size):
            if q != rank:
                self.delivered[q, rank, 0] = self.sent[rank, q] + message
        for q in range(self.size):
            if q != rank and self.pipelined_waits["read"]:
                target = self.received[rank, q] + message
                yield from self._until(lambda: self.delivered[rank, q, 0] >= target,
                                       deadline, rank, step, q, "its reads")
