"""The writer: sends go out from the caller's thread while the socket takes bytes.

``isend`` queues a request on its peer and writes at once, from the caller's thread, what
the socket (and the shared-memory ring) take (``sendmsg`` of header and payload, no
concatenation); the progress engine's token holder writes the rest when the socket drains or
credit comes back, so a send never blocks. Frames of one peer go out whole and in order;
credit and acknowledgement frames go out at any frame boundary, even between the chunks of a
message, so two ranks streaming to each other never wait on each other's credit. Each frame
is closed by its tag (``auth.FrameAuth.seal``) where it is queued to the socket, under the
peer's send lock, so the tags' counter follows the order of the wire.

A mixin of ``SocketTransport``: it uses the transport's ``_cond``, ``_failure``, ``_fail``,
``_notify``, ``_wake`` and ``_register`` (``engine.py``).
"""
from __future__ import annotations

from ...errors import TransportError
from .wire import CMA_ACK, SHM_CREDIT, header


class Outbound:
    def _submit(self, peer, req):
        """Queue a send and write what the socket (and the ring) take now, from the caller's
        thread; the token holder writes the rest, so this never blocks for long."""
        if self._failure is not None:
            raise TransportError(f"send on rank {self.rank} to rank {peer.rank} (tag {req.tag}): "
                                 f"{self._failure}")
        if peer.closed:
            raise TransportError(f"send on rank {self.rank}: rank {peer.rank} has closed its transport")
        with peer.send_lock:
            peer.queue.append(req)
            try:
                finished = self._pump(peer)
            except (KeyboardInterrupt, SystemExit) as exc:
                self._failure = self._failure or (
                    f"interrupted ({type(exc).__name__}) while writing to rank {peer.rank}")
                raise
            wake = peer.blocked and not peer.writing
        if finished > 1 or (finished and not req.done):   # other threads' sends completed
            with self._lock:
                self._notify()
        if wake:
            self._wake()
        return req

    def _pump(self, peer) -> int:
        """Write queued frames, frame by frame, until the socket refuses bytes
        (``peer.blocked``), a channel has no room for the next frame, or the queue is empty.
        Caller holds peer.send_lock; returns how many sends completed."""
        out, sock, finished = peer.out, peer.sock, 0
        if peer.broken:
            return 0
        try:
            while True:
                if out:
                    sent = sock.sendmsg(out) if len(out) > 1 else sock.send(out[0])
                    while out and sent >= out[0].nbytes:
                        sent -= out[0].nbytes
                        out.pop(0)
                    if out:
                        if sent:
                            out[0] = out[0][sent:]
                        continue
                    req, peer.out_req = peer.out_req, None
                    if req is not None:
                        peer.queue.popleft()
                        if req.written(peer):
                            finished += 1
                    continue
                if peer.acks_owed:
                    frame = header(CMA_ACK, 0, peer.acks_owed)
                    out += (frame, peer.auth.seal(frame))
                    peer.acks_owed = 0
                    continue
                if peer.credit_owed:
                    frame = header(SHM_CREDIT, 0, peer.credit_owed)
                    out += (frame, peer.auth.seal(frame))
                    peer.credit_owed = 0
                    continue
                if not peer.queue:
                    break
                req = peer.queue[0]
                step = req.next_frames(peer)
                if step is None:
                    break              # the ring is full: the reader's credit resumes us
                frames, last = step
                out.extend((*frames, peer.auth.seal(*frames)))
                if last:
                    peer.out_req = req
            peer.blocked = False
        except (BlockingIOError, InterruptedError):
            peer.blocked = True
        except (BrokenPipeError, ConnectionResetError) as exc:
            peer.blocked = False
            if peer.closed:
                self._fail(peer.rank, f"sending to rank {peer.rank} failed: {exc}")
            else:
                # the peer has gone: why (its abort) is in what it sent before, which the
                # reader finds ahead of the connection's end; nothing more goes out
                peer.broken = True
                out.clear()
        except OSError as exc:
            peer.blocked = False
            self._fail(peer.rank, f"sending to rank {peer.rank} failed: {exc}")
        except BaseException:
            # interrupted (KeyboardInterrupt) between a write and its bookkeeping, or between
            # a tag and its frame: where the stream stands is unknown, so nothing more goes out
            # on it (the peer sees the connection end, never a frame out of its order)
            peer.broken = True
            out.clear()
            raise
        return finished

    def _flush(self, peer):
        """Write more to ``peer`` from the token holder (the socket took bytes, or credit
        came back); watch for EVENT_WRITE only while the socket is what holds us up."""
        with peer.send_lock:
            finished = self._pump(peer)
            blocked = peer.blocked
        if blocked != peer.writing and not (peer.closed and peer.sock.fileno() < 0):
            self._register(peer, blocked)
        if finished:
            with self._lock:
                self._notify()
