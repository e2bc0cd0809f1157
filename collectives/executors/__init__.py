"""Executors walk a plan on a transport, one module each; the group picks one by what its
transport offers (``Transport.offers``), once, when the group is made:

    "peer_memory" GPUs of one host that map each other's memory       -> peer (one kernel per
                                                                        plan), where every rank
                                                                        of the group can
    "stream"     work ordered on CUDA streams, device buffers (NCCL)  -> nccl.execute
    "mpi_comm"   an mpi4py communicator as ``transport.comm``         -> compiled (Cython), where
                                                                        built for this MPI
    otherwise    nonblocking isend/irecv/wait_all on host buffers     -> host.execute

Every executor has host.execute's signature. Transports never import executors: they move
bytes and say what they offer; an executor needing per-transport state (the NCCL executor's
captured graphs) keeps it on the transport and registers its release with
``transport.before_close``.
"""
from __future__ import annotations


def select(transport):
    """The ``execute`` function that runs plans on ``transport``."""
    offers = transport.offers
    if "peer_memory" in offers:
        from . import peer
        fast = peer.make_executor(transport)
        if fast is not None:
            return fast
    if "stream" in offers:
        from . import nccl
        return nccl.execute
    if "mpi_comm" in offers:
        from . import compiled
        fast = compiled.make_executor(transport.comm)
        if fast is not None:
            return fast
    from . import host
    return host.execute
