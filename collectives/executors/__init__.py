"""Executors walk a plan on a transport, one module each; the group picks one by what its
transport offers (``Transport.offers``), once, when the group is made, and owns it:

    "peer_memory" GPUs of one host that map each other's memory       -> peer (one kernel per
                                                                        plan), where every rank
                                                                        of the group can
    "stream"     work ordered on CUDA streams, device buffers (NCCL)  -> nccl.execute
    "mpi_comm"   an mpi4py communicator as ``transport.comm``         -> compiled (Cython), where
                                                                        built for this MPI
    otherwise    nonblocking isend/irecv/wait_all on host buffers     -> host.execute

Every executor has host.execute's signature. Transports never import executors: they move
bytes, say what they offer, and offer hooks (``before_close``, ``add_error_check``). What an
executor keeps is the executor's: the NCCL executor's captured graphs live in its module,
by transport, and are released through ``transport.before_close``; the peer-memory
executor's failures reach ``synchronize`` through ``transport.add_error_check``. Where the
group, the tuning or the benchmark need to know where plans run, they ask the group's
``Executor`` (``group.executor``), never the transport.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Executor:
    """What runs one group's plans, chosen once from what its transport offers."""
    execute: Callable           # runs a plan (host.execute's signature)
    model_name: str             # whose cost-model defaults rank the group's schedules
    peer: Any = None            # the peer-memory executor, where plans run on peer memory
    peer_path: str | None = None    # a transport offering peer memory: why it is used or not

    @property
    def agreed(self) -> dict | None:
        """The settings every rank must share because they shape the plans the executor
        runs (the peer-memory executor's), or None."""
        return None if self.peer is None else self.peer.agreed


def select(transport) -> Executor:
    """The executor that runs plans on ``transport`` (collective where peer memory is
    offered: every rank of the group calls it when the group is made)."""
    offers = transport.offers
    why = None
    if "peer_memory" in offers:
        from . import peer
        fast, why = peer.make_executor(transport)
        if fast is not None:
            return Executor(fast, fast.model_name, peer=fast, peer_path=why)
    if "stream" in offers:
        from . import nccl
        return Executor(nccl.execute, transport.name, peer_path=why)
    if "mpi_comm" in offers:
        from . import compiled
        fast = compiled.make_executor(transport.comm)
        if fast is not None:
            return Executor(fast, transport.name, peer_path=why)
    from . import host
    return Executor(host.execute, transport.name, peer_path=why)
