"""The transport contract: nonblocking point-to-point on flat contiguous buffers.

A transport knows its ``rank`` and ``size`` and the array module its buffers come from
(``numpy`` or ``cupy``). ``isend``/``irecv`` return requests; ``wait_all`` completes a list of
them or raises (CollectiveTimeout after ``timeout`` seconds, TransportError when a peer
failed). Messages between one pair with one tag are delivered in the order they were sent.
A transport may expose its library's own collectives as ``native`` (the benchmark baseline):
an object with ``supports(collective, dtype, op) -> bool`` and, on flat arrays,

    all_reduce(sendbuf, recvbuf, op)          reduce_scatter(sendbuf, recvbuf, counts, op)
    all_gather(sendbuf, recvbuf, counts)      all_to_all(sendbuf, recvbuf, send_counts, recv_counts)
    broadcast(buf, root)                      reduce(sendbuf, recvbuf, root, op)
    gather(sendbuf, recvbuf, counts, root)    scatter(sendbuf, recvbuf, counts, root)
    barrier()

``op`` is never AVG there (the group sums and divides). ``recvbuf`` is None on ranks that
receive nothing. ``offers`` says what an executor may use beyond isend/irecv/wait_all
("mpi_comm": an mpi4py ``comm``; "stream": stream-ordered device work), from which the group
picks its executor (``collectives.executors``); transports never import executors, and never
read an executor's state: an executor keeps what it needs itself and uses the transport's
hooks (``before_close`` for what must go before the connections, ``add_error_check`` for
failures its device work reports, ``aborted``). A transport may provide ``subgroup(ranks)
-> Transport`` for new_group (a real sub-communicator where the library has one; otherwise
the facade wraps the parent transport and translates ranks).

Tags are integers from 0 to ``max_tag``; a tag outside that range is an error, never wrapped.
``max_tag`` None means the transport carries no tags: messages between a pair match in the
order they were posted (NCCL).

Timeouts: ``wait_all`` raising CollectiveTimeout leaves every request pending, so a later
wait can still complete it with its data. ``cancel(requests)`` gives requests up: a receive
not yet matched is withdrawn (a late message can no longer land in its buffer) and every
later wait on it raises CollectiveError; executors cancel what a failed collective left.
"""
from __future__ import annotations

from ..errors import CollectiveError

ANY_SOURCE = -1         # irecv's peer for a message from any rank (transports that support it)


class Request:
    """A pending transfer. ``peer`` and ``kind`` ('send'/'recv') make errors readable."""
    peer: int
    kind: str

    def test(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> None:
        raise NotImplementedError


class Transport:
    name = "base"
    rank: int
    size: int
    xp = None           # the array module of buffers: numpy or cupy
    native = None       # an object with the library's own collectives, or None
    max_tag: int | None = (1 << 63) - 1
    offers = frozenset()
    # isend/irecv take ``signature=`` (collectives.signature) and compare the sender's with
    # the receiver's: a mismatch is a CallMismatch, never another call's bytes
    carries_signatures = False

    def isend(self, buf, peer: int, tag: int) -> Request:
        raise NotImplementedError

    def irecv(self, buf, peer: int, tag: int) -> Request:
        raise NotImplementedError

    def wait_all(self, requests, timeout: float | None = None) -> None:
        """Complete every request; the default waits on each in turn within one deadline."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        for req in requests:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            req.wait(left)

    def cancel(self, requests) -> None:
        """Give up ``requests`` (see the module docstring); the default has nothing to
        withdraw: its receives take their message only when waited on."""

    def send(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        finish(self, [self.isend(buf, peer, tag)], timeout)

    def recv(self, buf, peer: int, tag: int = 0, timeout: float | None = None) -> None:
        finish(self, [self.irecv(buf, peer, tag)], timeout)

    def before_close(self, release) -> None:
        """Call ``release()`` before this transport's connections go (an executor's state
        that holds them, such as captured CUDA graphs)."""
        releases = self.__dict__.setdefault("_releases", [])
        if release not in releases:
            releases.append(release)

    def _release(self) -> None:
        for release in self.__dict__.pop("_releases", ()):
            release()

    def add_error_check(self, check) -> None:
        """Call ``check(operation)`` wherever this transport checks for asynchronous errors
        (a transport whose work completes on a device: while it waits and after): an
        executor whose device work reports failures its own way raises them there, as the
        transport raises its library's."""
        checks = self.__dict__.setdefault("_error_checks", [])
        if check not in checks:
            checks.append(check)

    def check_errors(self, operation: str) -> None:
        """Run the checks ``add_error_check`` registered (each raises what it found)."""
        for check in self.__dict__.get("_error_checks", ()):
            check(operation)

    @property
    def aborted(self) -> bool:
        """Whether this transport's connections were aborted rather than closed in order
        (peers may wait for this rank for ever): what a release registered with
        ``before_close`` may need to know. The default never aborts."""
        return False

    def close(self) -> None:
        self._release()

    def call_scope(self, buffers):
        """What a facade call must run inside, captured in the caller's thread when the call
        is made (None: nothing, the call runs on the host). The NCCL transport returns its
        device and the caller's current stream: the call is enqueued there, and an async one
        gets its completion from ``enqueued``."""
        return None

    def enqueued(self, buffers):
        """Called inside ``call_scope`` right after an async call was enqueued: (whether the
        GPU has finished it, a function that makes the waiting thread's current stream wait
        for it). Only transports whose ``call_scope`` is not None have it."""
        raise NotImplementedError(f"{type(self).__name__} runs calls on the host")

    def check_peer(self, peer: int, operation: str) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"{operation} on rank {self.rank}: peer {peer} is out of range "
                             f"for world size {self.size}")


def finish(transport, requests, timeout=None) -> None:
    """Complete ``requests`` or give them up: for a caller that will not wait again (a
    collective's step, a blocking send/recv), so nothing it posted outlives the call."""
    try:
        transport.wait_all(requests, timeout)
    except BaseException:
        transport.cancel(requests)
        raise


__all__ = ["Request", "Transport", "CollectiveError", "finish"]
