"""torch's SymmetricMemory all_reduce as GPU rows: the anchor our peer-memory path must beat.

``symm_mem:one_shot`` (every rank loads every peer's block and reduces: one pass, best for
small messages) and ``symm_mem:two_shot`` (reduce-scatter then all-gather over peer memory)
run ``torch.ops.symm_mem.one_shot_all_reduce`` and ``two_shot_all_reduce_`` on a buffer from
``symm_mem.empty`` made symmetric by ``symm_mem.rendezvous``, over a torch process group of
the bench's own ranks (its store on a port rank 0 picks and the bench's host coordination
passes on; NCCL for torch's own needs). They are timed like every other row: on the bench's
stream (``torch.cuda.ExternalStream``), between CUDA events. NVLink multicast stays off
(``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, set by ``bench.nccl`` before torch starts).

Where torch cannot run them (no torch, no CUDA in this torch, no ``_symmetric_memory``, an op
missing in this version, a dtype or op they do not offer, a failure setting up) ``open`` and
``entries`` give no rows and one line saying why; every rank decides alike (the decision is
summed over the ranks before anything collective follows), so the run goes on.

Limits: the ranks' GPUs on one host (the store's address is MASTER_ADDR, else 127.0.0.1);
sum only; float32, float16 and bfloat16.
"""
from __future__ import annotations

import os
from datetime import timedelta

from ..ops import ReduceOp
from .sweep import Entry

OPS = {"symm_mem:one_shot": "one_shot_all_reduce", "symm_mem:two_shot": "two_shot_all_reduce_"}
DTYPES = ("float32", "float16", "bfloat16")


def _agreed(host, ok: bool, size: int) -> bool:
    """Whether every rank says ``ok`` (a collective call on the host)."""
    return host.sum(1 if ok else 0) == size


class SymmetricMemory:
    """A torch process group over the bench's ranks and its SymmetricMemory ops."""

    def __init__(self, torch, tdist, symm_mem, group_name, device, store, rank, size):
        self.torch, self.dist, self.symm_mem = torch, tdist, symm_mem
        self.rank, self.size = rank, size
        self.group_name, self.device, self.store = group_name, device, store
        self.ops = {label: getattr(torch.ops.symm_mem, name) for label, name in OPS.items()}
        self._said = set()
        self._buffers = []

    @classmethod
    def open(cls, group, host, timeout: float = 300.0):
        """(SymmetricMemory, None) on every rank, or (None, why) on every rank."""
        size, rank = group.size, group.rank
        try:
            import torch
            import torch.distributed as tdist
            if not torch.cuda.is_available():
                raise RuntimeError(f"this torch ({torch.__version__}) has no CUDA")
            import torch.distributed._symmetric_memory as symm_mem
            for name in OPS.values():
                if not hasattr(torch.ops.symm_mem, name):
                    raise RuntimeError(f"torch {torch.__version__} has no "
                                       f"torch.ops.symm_mem.{name}")
            why = None
        except Exception as exc:        # ImportError, or any of the above: say it, go on
            why = f"{type(exc).__name__}: {exc}"
        if not _agreed(host, why is None, size):
            return None, why or "torch's SymmetricMemory is not usable on every rank"
        device = group.transport.device
        store, why = None, None
        try:
            torch.cuda.set_device(device)
            address = os.environ.get("MASTER_ADDR", "127.0.0.1")
            if rank == 0:
                store = tdist.TCPStore(address, 0, size, is_master=True,
                                       timeout=timedelta(seconds=timeout),
                                       wait_for_workers=False)
        except Exception as exc:
            why = f"torch's store: {type(exc).__name__}: {exc}"
        port = int(host.max(float(store.port) if store is not None else 0.0))
        if not _agreed(host, why is None and port > 0, size):
            return None, why or "torch's store could not be opened on rank 0"
        try:
            if store is None:
                store = tdist.TCPStore(address, port, size, is_master=False,
                                       timeout=timedelta(seconds=timeout))
            if not tdist.is_initialized():
                tdist.init_process_group("nccl", store=store, rank=rank, world_size=size,
                                         timeout=timedelta(seconds=timeout))
            group_name = tdist.group.WORLD.group_name
            enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
            if enable is not None:        # needed before torch 2.8; a no-op after
                enable(group_name)
        except Exception as exc:
            why = f"torch's process group: {type(exc).__name__}: {exc}"
        if not _agreed(host, why is None, size):
            return None, why or "torch's process group failed on another rank"
        return cls(torch, tdist, symm_mem, group_name, device, store, rank, size), None

    def _say(self, why):
        if self.rank == 0 and why not in self._said:
            self._said.add(why)
            print(f"# no symm_mem rows: {why}", flush=True)

    def entries(self, case, d_in, expect, count, dtype, op, host) -> list[Entry]:
        """The two rows at one all_reduce size, or none (and why, once) where they cannot."""
        torch = self.torch
        if op != ReduceOp.SUM or dtype.name not in DTYPES:
            self._say(f"they reduce with sum in {', '.join(DTYPES)} only "
                      f"(this run: {op.name.lower()}, {dtype.name})")
            return []
        why = None
        try:
            import cupy
            stream = torch.cuda.ExternalStream(cupy.cuda.get_current_stream().ptr)
            source, want = torch.from_dlpack(d_in), torch.from_dlpack(expect)
            buf = self.symm_mem.empty(count, dtype=getattr(torch, dtype.name),
                                      device=torch.device("cuda", self.device))
            self.symm_mem.rendezvous(buf, self.group_name)
        except Exception as exc:
            why = f"{count} elements: {type(exc).__name__}: {exc}"
        if not _agreed(host, why is None, self.size):
            self._say(why or "symmetric memory failed on another rank")
            return []
        self._buffers = [buf]
        result = [None]

        def refill():
            buf.copy_(source)

        # torch's current stream is the bench's for the rest of the run: a stream context per
        # call would add its host time to rows that are themselves only microseconds
        torch.cuda.set_stream(stream)
        one, two = self.ops["symm_mem:one_shot"], self.ops["symm_mem:two_shot"]

        def one_shot():
            result[0] = one(buf, "sum", self.group_name)

        def two_shot():
            two(buf, "sum", self.group_name)
            result[0] = buf

        def wrong():
            stream.synchronize()
            return int((result[0] != want).sum().item())

        rows = [Entry("symm_mem:one_shot", one_shot, poison=refill, wrong=wrong, priced=False),
                # two-shot reduces in place: each call feeds on the last one's output, so
                # only the first call (after a refill) is checked
                Entry("symm_mem:two_shot", two_shot, poison=refill, wrong=wrong,
                      check_last=False, priced=False)]
        kept = []
        for row in rows:        # an op may refuse a size (alignment, its buffer's limit)
            why = None
            try:
                refill()
                row.call()
                stream.synchronize()
            except Exception as exc:
                why = f"{row.algorithm} at {count} elements: {type(exc).__name__}: {exc}"
            if _agreed(host, why is None, self.size):
                kept.append(row)
            else:
                self._say(why or f"{row.algorithm} at {count} elements failed on another rank")
        return kept

    def release(self):
        self._buffers = []

    def close(self):
        self._buffers = []
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
