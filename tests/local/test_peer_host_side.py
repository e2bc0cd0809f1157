"""The peer-memory path's host side on the CPU, over a stand-in for CuPy's runtime: how the
group's memory grows (``transports/peer.py``) and which calls the executor hands to NCCL
send/recv, with what buffers (``executors/peer.py``). The kernel itself runs only on GPUs
(tests/gpu/test_peer.py); its protocol runs in tests/schedules/peer_model.py."""
import contextlib
from types import SimpleNamespace

import numpy as np

from collectives.algorithms.schedule import build_plan
from collectives.algorithms.transforms import read_input_first
from collectives.executors import peer as peer_executor
from collectives.transports import peer as peer_memory


class Runtime:
    """malloc/memset/free and IPC handles of one rank, recorded."""

    def __init__(self):
        self.next, self.zeroed, self.freed = 1 << 20, [], []

    def malloc(self, nbytes):
        self.next += nbytes + 4096
        return self.next

    def memset(self, ptr, value, nbytes):
        self.zeroed.append((ptr, value, nbytes))

    def free(self, ptr):
        self.freed.append(ptr)

    def deviceSynchronize(self):
        pass

    def ipcGetMemHandle(self, ptr):
        return ptr.to_bytes(8, "little")


def memory(monkeypatch):
    runtime = Runtime()
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime,
                                                Device=lambda d: contextlib.nullcontext()),
                           asarray=np.asarray)
    monkeypatch.setattr(peer_memory, "_all_gather", lambda transport, blob: [blob])
    mem = peer_memory.PeerMemory.__new__(peer_memory.PeerMemory)
    mem.cupy, mem.transport, mem.rank, mem.size = cupy, SimpleNamespace(device=0), 0, 1
    mem.data_ptr, mem.capacity, mem.peer_data, mem.peer_data_array = 0, 0, [], None
    mem.inbox_ptr, mem.inbox_half, mem.peer_inbox, mem.peer_inbox_array = 0, 0, [], None
    mem.lines_ptr, mem.lines_half, mem.peer_lines, mem.peer_lines_array = 0, 0, [], None
    return mem, runtime


def test_the_first_call_allocates_every_area_and_each_grows_alone(monkeypatch):
    mem, runtime = memory(monkeypatch)
    mem.ensure(256, 256, 256)          # a call that stages nothing still gets all three
    assert mem.data_ptr and mem.inbox_ptr and mem.lines_ptr
    assert list(mem.peer_lines_array) == [mem.lines_ptr]
    zeroed = {ptr: nbytes for ptr, _, nbytes in runtime.zeroed}
    assert zeroed == {mem.inbox_ptr: 2 * mem.inbox_half, mem.lines_ptr: 2 * mem.lines_half}
    data, inbox, lines = mem.data_ptr, mem.inbox_ptr, mem.lines_ptr
    mem.ensure(256, 256, 1 << 20)      # only the inbox of lines grows, zeroed again
    assert (mem.data_ptr, mem.inbox_ptr) == (data, inbox) and mem.lines_ptr != lines
    assert runtime.freed == [lines] and mem.lines_half >= 1 << 20
    assert runtime.zeroed[-1] == (mem.lines_ptr, 0, 2 * mem.lines_half)


def test_a_call_handed_to_send_recv_gets_the_buffers_its_plan_reads(monkeypatch):
    """complex64 has no peer kernel, so the call goes to the NCCL send/recv executor. The
    group passed input beside output for the peer program to read: a plan that reads only
    output then needs output seeded with input first; a plan that reads input itself (the
    read-input-first rewrite) must get input and an untouched output. Dropping input for it
    crashed the GPU bench at 64 MiB."""
    calls = []
    monkeypatch.setattr(peer_executor.nccl, "execute",
                        lambda plan, transport, buffers, *a, **k: calls.append(dict(buffers)))
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.failed, executor._entries = None, {}
    executor.memory = SimpleNamespace(error=lambda: None, words=[0, 0, 0, 0])
    executor.transport = SimpleNamespace(rank=0)
    plan = build_plan("all_reduce", "ring", 0, 2, 8)
    data = np.arange(8, dtype=np.complex64)
    for chosen, reads_input in ((plan, False), (read_input_first(plan, 8), True)):
        output = np.zeros(8, np.complex64)
        executor(chosen, None, {"input": data, "output": output}, dtype=np.complex64)
        if reads_input:
            assert calls[-1]["input"] is data and not output.any()
        else:
            assert set(calls[-1]) == {"output"} and (output == data).all()
