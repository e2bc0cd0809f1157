"""One replay of every rank's lowered program in one process: the engine under the simulator
(``simulate.execute_all``, which carries data) and the cost model (``cost.replay``, which
carries clocks).

What both need is here, once: each rank's program (``lowering(plan).code``, see ``lowered``)
walked instruction by instruction; requests numbered per rank in posting order; transfers
matched by rendezvous (a send completes only once its receiver has posted the matching
receive, so a schedule that could deadlock on a real transport deadlocks here too), FIFO per
ordered pair of ranks; a WAIT that blocks a rank until its requests are done; and the two
errors, a size mismatch between a message's two ends and a deadlock (ranks that never
finish).

What a transfer carries is the payload's (``Payload``): its tag for each posted transfer
(the simulator's: the rank's buffers; the cost model's: when and among which messages it
was posted), what a match does (copies the data; takes ports and links and says when the
transfer ends), what a run of local operations does (runs them; adds their cost to the
clock). Requests end at a value (the time the cost model computes; 0.0 in the simulator), a
WAIT at the latest of its requests' ends.

The order ranks take turns in is the payload's too. An untimed payload takes ranks first in,
first out, each running until a WAIT stops it. A timed one keeps an agenda ordered by time
(ties by rank): a WAIT always ends the rank's turn, and the local operations of the WAIT's
step are priced when the WAIT ends, before the rank queues to post again; so ports go to
transfers in the order their ranks reach them.
"""
from __future__ import annotations

import collections
import heapq

from ..errors import CollectiveError
from .lowered import LOCAL, POST


class Payload:
    """What a replay carries (see the module): the engine calls these."""

    # Clocks: an agenda by time, every WAIT ends a turn, a size mismatch names the steps
    # that posted the two messages (else the steps the two ranks are at).
    timed = False

    def posted(self, rank: int, transfers: tuple, now: float):
        """The tag of one side of a POST (its receives, or its sends), posted at ``now``:
        every transfer of that side carries it."""
        raise NotImplementedError

    def moved(self, src: int, dst: int, sent: tuple, into: tuple) -> float:
        """A matched transfer, its two entries ``(Send or Recv, request number, step, tag)``:
        when it ends."""
        raise NotImplementedError

    def local(self, rank: int, ops: tuple, now: float) -> float:
        """Run (or price) one LOCAL instruction's operations; the clock after them."""
        return now

    def stuck_detail(self, plan, step) -> str:
        """Text added after a deadlocked rank's step in the error (what the step waits for)."""
        return ""


class Replay:
    """One replay of ``plans`` (one per rank, in rank order) as ``lowering`` lowers them,
    carrying ``payload``; ``run()`` returns each rank's final clock."""

    def __init__(self, plans, lowering, payload: Payload):
        size = self.size = len(plans)
        self.plans, self.payload = plans, payload
        self.programs = [lowering(plan).code for plan in plans]
        self.pc = [0] * size                  # each rank's next instruction
        self.ended = [[] for _ in range(size)]    # per rank: request -> its end, or None
        self.waiting = [None] * size          # the request numbers of the WAIT a rank stopped at
        self.left = [0] * size                # how many of them have not ended
        self.wait_end = [0.0] * size          # the latest end among them so far
        self.finished = [None] * size         # each rank's clock at its program's end
        # Posted transfers not matched yet, per ordered pair src * size + dst, oldest first:
        # (Send or Recv, request number, step, tag). A pair is dropped once empty. Lists, not
        # deques: at p = 1024 the direct algorithms keep half a million pairs waiting at
        # once, nearly all holding one message.
        self.sends, self.recvs = {}, {}
        # Ranks to go on: timed, (time, rank) in a heap; else ranks first in, first out.
        self.timed = payload.timed
        self.agenda = [(0.0, rank) for rank in range(size)] if self.timed else \
            collections.deque(range(size))

    def run(self) -> list:
        """Every rank's program to its end; each rank's final clock. Raises CollectiveError
        on a size mismatch or a deadlock."""
        agenda, timed = self.agenda, self.timed
        while agenda:
            if timed:
                now, rank = heapq.heappop(agenda)
            else:
                now, rank = 0.0, agenda.popleft()
            self._turn(rank, now)
        stuck = [r for r in range(self.size) if self.finished[r] is None]
        if stuck:
            first, plan = stuck[0], self.plans[stuck[0]]
            step = self._step_at(first)
            raise CollectiveError(
                f"{plan.collective} ({plan.algorithm}) deadlocks at world size {self.size}: "
                f"{len(stuck)} ranks never finish; rank {first} waits in step {step + 1}"
                f"{self.payload.stuck_detail(plan, plan.steps[step])}")
        return self.finished

    def _step_at(self, rank) -> int:
        """The plan step of the instruction ``rank`` is at (its last one once done)."""
        code = self.programs[rank]
        return code[min(self.pc[rank], len(code) - 1)][1] if code else 0

    def _turn(self, rank, now):
        """Run ``rank`` from its next instruction until a WAIT stops it or its program ends.
        A WAIT whose requests are not all done stops the rank; one whose requests are done
        ends its turn only when the payload is timed (an untimed rank goes on)."""
        code, pc, payload = self.programs[rank], self.pc, self.payload
        while pc[rank] < len(code):
            kind, step, what = code[pc[rank]]
            if kind is LOCAL:
                now = payload.local(rank, what, now)
            elif kind is POST:
                pc[rank] += 1
                self._post(rank, now, step, what)
                continue
            else:
                mine = self.ended[rank]
                if what.__class__ is slice:
                    numbers, ends = range(what.start, what.stop), mine[what]
                else:
                    numbers = set(what)
                    ends = [mine[n] for n in numbers]
                pending = ends.count(None)
                if pending:
                    self.waiting[rank], self.left[rank] = numbers, pending
                    self.wait_end[rank] = max([now] + [e for e in ends if e is not None])
                    return
                if self.timed:
                    latest = max(ends, default=now)
                    self._resume(rank, latest if latest > now else now)
                    return
            pc[rank] += 1
        self.finished[rank] = now

    def _resume(self, rank, end):
        """The WAIT ``rank`` is at is over at ``end``: queue it to go on (timed: after the
        local operations of the WAIT's step, priced now)."""
        code = self.programs[rank]
        i = self.pc[rank]
        step = code[i][1]
        i += 1
        if self.timed:
            while i < len(code) and code[i][0] is LOCAL and code[i][1] == step:
                end = self.payload.local(rank, code[i][2], end)
                i += 1
            self.pc[rank] = i
            heapq.heappush(self.agenda, (end, rank))
        else:
            self.pc[rank] = i
            self.agenda.append(rank)

    def _post(self, rank, now, step, what):
        """Post a POST's receives, then its sends (numbered in that order), then match them."""
        receives, sending = what
        size, mine = self.size, self.ended[rank]
        recvs, sends = self.recvs, self.sends
        number = len(mine)
        for side, table, to in ((receives, recvs, False), (sending, sends, True)):
            if not side:
                continue
            tag = self.payload.posted(rank, side, now)
            for t in side:
                key = rank * size + t.peer if to else t.peer * size + rank
                queue = table.get(key)
                if queue is None:
                    table[key] = [(t, number, step, tag)]
                else:
                    queue.append((t, number, step, tag))
                number += 1
        mine.extend([None] * (number - len(mine)))
        for t in receives:
            if t.peer * size + rank in sends:
                self._match(t.peer, rank)
        for t in sending:
            if rank * size + t.peer in recvs:
                self._match(rank, t.peer)

    def _match(self, src, dst):
        """Match what ``src`` sends ``dst`` with what ``dst`` receives from it, oldest first;
        a rank whose WAIT needed the last of these goes on."""
        key = src * self.size + dst
        s, r = self.sends.get(key), self.recvs.get(key)
        if not (s and r):             # an earlier match of this post may have emptied it
            return
        ended, waiting, left, wait_end = self.ended, self.waiting, self.left, self.wait_end
        moved = self.payload.moved
        while s and r:
            sent, into = s.pop(0), r.pop(0)
            if sent[0].region.count != into[0].region.count:
                self._mismatch(src, dst, sent, into)
            end = moved(src, dst, sent, into)
            for rank, number in ((src, sent[1]), (dst, into[1])):
                ended[rank][number] = end
                wanted = waiting[rank]
                if wanted is not None and number in wanted:
                    if end > wait_end[rank]:
                        wait_end[rank] = end
                    left[rank] -= 1
                    if not left[rank]:
                        waiting[rank] = None
                        self._resume(rank, wait_end[rank])
        if not s:
            del self.sends[key]
        if not r:
            del self.recvs[key]

    def _mismatch(self, src, dst, sent, into):
        plan = self.plans[src]
        if self.timed:
            src_step, dst_step = sent[2], into[2]
        else:
            src_step, dst_step = self._step_at(src), self._step_at(dst)
        raise CollectiveError(
            f"{plan.collective} ({plan.algorithm}): rank {src} step {src_step + 1} sends "
            f"{sent[0].region.count} elements to rank {dst}, whose step {dst_step + 1} "
            f"receives {into[0].region.count}")
