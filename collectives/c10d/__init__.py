"""The torch backend "collectives": torch.distributed, DDP and the rest of torch's stack on
our algorithms.

``import collectives.c10d`` registers the backend with torch (devices cpu and cuda); then,
unchanged,

    torch.distributed.init_process_group("collectives")

makes every torch process group of the job a :class:`ProcessGroupCollectives`: a Python
``torch.distributed.ProcessGroup`` over our groups (``collectives.group``), whose ranks meet
through the store torch hands the backend. CPU tensors run on the socket transport; CUDA
tensors on the NCCL transport (our schedules as NCCL send/recv, ``executors.nccl``), whose
communicator is made at the group's first call on CUDA tensors, on their GPU, its unique id
passed through the same store. Each method is torch's, shaped as ``distributed_c10d.py``
is: route by device -> validate -> one ``prepare`` of our group -> a Work. The algorithm is
chosen as the facade chooses it: ``auto`` (the group's decision table) unless
``COLLECTIVES_ALGORITHM=all_reduce=ring,...`` names one.

torch makes a Python process group the whole group (``_new_process_group_helper`` stops at
the first backend that is a ProcessGroup), so ``"cpu:gloo,cuda:collectives"`` runs CPU
tensors on ours too; ``"collectives"`` and ``"cpu:collectives,cuda:collectives"`` are the
same group.

How torch reaches the methods: ``torch.distributed``'s Python functions call them by name
(``allreduce``, ``all_gather_single``, ``reduce_scatter_single``, ``all_to_all_single``,
``reduce``, ``gather``, ``scatter``, ``recv_anysource`` ...; FSDP2 on CPU goes this way);
C++ callers (DDP's reducer, ``_broadcast_coalesced``, the parameter check, the functional
collectives under DTensor) reach only what torch 2.13's trampoline (``PyProcessGroup``)
forwards to Python: allreduce, allreduce_coalesced, allgather, all_gather_single_coalesced,
all_to_all_single, broadcast, reduce_scatter, reduce_scatter_single_coalesced, barrier, send,
recv, and the group's name, which a Python group must keep itself. The older names
(``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``) are aliases.

Work (CUDA): as NCCL's backend, a collective is enqueued at the call, in the caller's thread,
on torch's current stream (made CuPy's current stream for the call, so that the copies a
call makes are ordered there too), and the host does not wait. Its Work holds a CUDA event
recorded after the collective: ``wait()`` orders the waiting thread's current stream after it
(``is_completed`` asks the GPU), and ``get_future()`` makes torch's CUDA-aware Future on first
use, whose ``wait()`` and callbacks are ordered the same way (made at every call it cost more
than the launch). Send and receive are issued together at the first wait (one NCCL group), on the stream
current at the call, and the host waits for them.

Work (CPU): a synchronous call (torch's ``async_op=False``) runs in the caller's thread and
raises there; an asynchronous one runs on the group's worker thread in call order
(``collectives.work``). Its torch Future (``Future``) is completed by one thread per group,
in that order, not by the worker: DDP comm hooks such as PowerSGD wait for a second
collective inside a Future callback, which on the worker thread would wait for itself.
Collectives called inside such callbacks run at once, on a lane of the group with tags of its
own: callbacks run in the same order on every rank, but not at the same place among the
rank's other calls (see ``ProcessGroupCollectives.group``).

Rendezvous under our launcher (``python -m collectives.run``): its store server holds
MASTER_PORT and speaks our authenticated protocol, which torch's TCPStore cannot, so torch's
``env://`` would fail there; this module wraps torch's ``env://`` handler to hand torch that
store (as a ``torch.distributed.Store``) when ``COLLECTIVES_USE_AGENT_STORE`` is set, and
leaves every other case (torchrun, a plain MASTER_ADDR/MASTER_PORT) to torch.

Limits: one GPU per rank (the first CUDA call's; tensors of one call on one device); CUDA
tensors need CuPy with NCCL (the ``cuda12``/``cuda13`` extra: without it such a call is a
RuntimeError naming it); one tensor per call where torch's signature takes a list of one per
device; no PREMUL_SUM; dense (strided) tensors, and sparse COO for all_reduce (SUM, as
gloo: ``collectives.sparse``); no receive from any source on CUDA tensors (NCCL matches by
sender); ``monitored_barrier`` is gloo's alone in torch.

Modules: ``backend`` (the process group), ``calls`` (routing by device, argument checks),
``work`` (Work, Future), ``stores`` (store adapters, ``env://`` under our launcher).
"""
import torch.distributed as dist

# Re-exported for tests and tools that reach the backend's pieces through the package: the
# transports module its calls resolve (patched to fake one), the store adapters, the
# rendezvous handler and the lane and transport constants.
from .. import transports  # noqa: F401
from .backend import ProcessGroupCollectives, create_backend
from .calls import BACKEND, GPU_TRANSPORT, LANE_ID, TRANSPORT  # noqa: F401
from .stores import (_LauncherStore, _TorchStore, _env_rendezvous,  # noqa: F401
                     _launcher_stores, _torch_rendezvous)
from .work import Future, Work, in_callback  # noqa: F401

__all__ = ["BACKEND", "ProcessGroupCollectives", "Work", "create_backend"]


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                      devices=["cpu", "cuda"])
    _torch_rendezvous._rendezvous_handlers["env"] = _env_rendezvous


_register()
