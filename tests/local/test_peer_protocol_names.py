"""The peer-memory executor and transport name the protocol (kernels/peer_protocol.py) where
they once wrote numbers: each name here is pinned to the number the code used, so the GPU
side runs with the same values; and an entry's kernel parameters lie where the protocol's
parameter list says, as the compiled lane expects them."""
import pathlib
import re
from types import SimpleNamespace

import numpy as np
import pytest

from collectives.algorithms.schedule import build_plan
from collectives.errors import CollectiveTimeout, TransportError
from collectives.executors import peer as peer_executor
from collectives.kernels import peer_protocol
from collectives.transports import peer as peer_memory


def test_pipelined_kinds_are_the_numbers_the_executor_used():
    assert peer_executor.PIPELINED_KINDS == {"reduce_scatter": 0, "all_reduce": 1,
                                             "all_gather": 3, "all_to_all": 4}
    assert peer_protocol.PIPELINED_ALL_REDUCE_BY_COPIES == 2
    assert peer_protocol.PIPELINED_WORDS == ("COUNT", "CHUNKS", "PUSHERS", "KIND")


def test_copies_around_codes_are_the_words_the_executor_used():
    words = peer_executor.copies_words
    stage = words(BYTES=4096, MODE=peer_protocol.COPIES_STAGE, CHUNKS=3, PIECES=5)
    assert stage == [4096, 0, 3, 5]
    assert len(stage) == peer_protocol.COPIES_WORDS["PIECE"]     # the pieces follow
    assert words(BYTES=0, MODE=peer_protocol.COPIES_END, MESSAGE=7) == [0, 1, 7]
    assert words(BYTES=0, MODE=peer_protocol.COPIES_WAIT, MESSAGE=2, BLOCKS=9) == [0, 2, 2, 9]
    assert 8 * peer_executor.COPIES_WAIT_WORDS == 32        # bytes between two wait codes


def test_error_kinds_and_words_are_the_numbers_the_code_used():
    assert (peer_protocol.ERROR_NONE, peer_protocol.ERROR_TIMED_OUT,
            peer_protocol.ERROR_ABORTED, peer_protocol.ERROR_CLOSED,
            peer_protocol.ERROR_CALLED_OTHERWISE) == (0, 1, 2, 3, 4)
    assert (peer_protocol.ERROR_KIND_WORD, peer_protocol.ERROR_STEP_WORD,
            peer_protocol.ERROR_PEER_WORD) == (0, 1, 2)


# the values[...] positions executors/peer.py used, by parameter
USED = {"code_at": 0, "in": 3, "out": 4, "scratch": 5, "caller_out": 6, "peer_data_at": 7,
        "peer_flags_at": 8, "scratch_at": 9, "timeout_ns": 15, "peer_inbox_at": 16,
        "inbox_half": 17, "peer_lines_at": 18, "lines_half": 19, "place": 20}


def test_kernel_parameters_lie_where_the_executor_and_the_lane_set_them():
    assert {name: peer_protocol.PARAMETER[name] for name in USED} == USED
    assert (peer_executor._IN, peer_executor._OUT, peer_executor._CALLER_OUT,
            peer_executor._TIMEOUT_NS, peer_executor._PLACE) == (3, 4, 6, 15, 20)
    # the compiled lane sets four of them by number (its enum)
    lane = (pathlib.Path(peer_executor.__file__).parent / "_peer_lane.pyx").read_text()
    enum = dict(re.findall(r"^\s+(IN_VALUE|OUT_VALUE|CALLER_OUT_VALUE|PLACE_VALUE) = (\d+)",
                           lane, re.M))
    assert {k: int(v) for k, v in enum.items()} == {
        "IN_VALUE": peer_protocol.PARAMETER["in"], "OUT_VALUE": peer_protocol.PARAMETER["out"],
        "CALLER_OUT_VALUE": peer_protocol.PARAMETER["caller_out"],
        "PLACE_VALUE": peer_protocol.PARAMETER["place"]}


def _entry(monkeypatch, plan):
    """An ``_Entry`` of ``plan`` over stand-ins for CuPy, the kernels and the memory."""
    uploaded = {}

    def asarray(a):
        ptr = 1000 * (len(uploaded) + 1)
        uploaded[ptr] = np.array(a)
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr))
    monkeypatch.setitem(__import__("sys").modules, "cupy", SimpleNamespace(asarray=asarray))
    kernel = SimpleNamespace(kernel=SimpleNamespace(ptr=1))
    for name in ("program_kernel", "pipelined_kernel", "copies_kernel"):
        monkeypatch.setattr(peer_executor.cuda_peer, name, lambda *a: kernel)
    memory = SimpleNamespace(flags_ptr=77, error_ptr=88,
                             peer_heaps_array=SimpleNamespace(data=SimpleNamespace(ptr=44)))
    entry = peer_executor._Entry(plan, np.dtype(np.float32), None, 4, 0, 0, 0, memory, False)
    return entry, uploaded


def test_an_entry_s_values_follow_the_protocol_s_parameter_order(monkeypatch):
    plan = build_plan("all_reduce", "ring", 1, 3, 12)
    entry, uploaded = _entry(monkeypatch, plan)
    at = peer_protocol.PARAMETER
    values = [v.value for v in entry.values]
    assert len(values) == len(peer_protocol.KERNEL_PARAMETERS)
    assert uploaded[values[at["code_at"]]].shape == entry.program.code.shape
    assert values[at["n"]] == len(entry.program.code)
    assert (values[at["rank"]], values[at["size"]], values[at["itemsize"]]) == (1, 3, 4)
    assert (values[at["flags"]], values[at["error"]], values[at["peer_heaps"]]) == (77, 88, 44)
    assert values[at["timeout_ns"]] == int(peer_executor.DEFAULT_TIMEOUT * 1e9)


def test_the_special_kernels_codes_are_the_words_they_were(monkeypatch):
    """pipelined: (count, chunks, pushers, kind); copies_around: its stage code, its end
    [0, 1, message] and its waits [0, 2, k + 1, blocks], 32 bytes apart."""
    plan = build_plan("reduce_scatter", "direct", 0, 2, (64, 64))
    entry, uploaded = _entry(monkeypatch, plan)
    entry.pipelined(plan, np.dtype(np.float32), None, 0)
    code = uploaded[entry.values[peer_protocol.PARAMETER["code_at"]].value]
    pushers = max(1, entry.blocks * peer_executor.PIPELINE_PUSHERS // 4)
    assert code.tolist() == [64, 1, pushers, 0]
    plan = build_plan("all_reduce", "two_shot", 0, 2, 128)
    entry, uploaded = _entry(monkeypatch, plan)
    entry.pipelined(plan, np.dtype(np.float32), None, 0, copy_engine=1)
    assert uploaded[entry.code.data.ptr].tolist()[3] == 2          # gathered by copies
    assert uploaded[entry.finish.data.ptr].tolist() == [0, 1, 2 * 1 + 1]
    plan = build_plan("all_to_all", "direct", 1, 3, ((4,) * 3,) * 3)
    entry, uploaded = _entry(monkeypatch, plan)
    entry.copied(plan, np.dtype(np.float32), None, 0, 8)
    block = 16
    assert uploaded[entry.code.data.ptr].tolist() == [block, 0, 2, 2, 0, 0, 2 * block, block,
                                                      block, block]
    assert uploaded[entry.finish.data.ptr].tolist() == [0, 1, 3]
    waits = entry.waits.data.ptr
    assert uploaded[waits].tolist() == [[0, 2, 1, entry.blocks], [0, 2, 2, entry.blocks]]
    assert [wait for wait, _ in entry.rounds] == [waits, waits + 32]


@pytest.mark.parametrize("kind, error, says", [
    (1, CollectiveTimeout, "timed out on the GPU waiting for rank 2 \\(plan step 4\\)"),
    (4, TransportError, "rank 2 did not run this all_reduce as this rank did"),
    (3, TransportError, "peer memory is closed"),
    (2, TransportError, "rank 2 gave up a collective on the GPU")])
def test_check_raises_by_error_kind(kind, error, says):
    executor = peer_executor.PeerExecutor.__new__(peer_executor.PeerExecutor)
    executor.failed = None
    executor.transport = SimpleNamespace(rank=1)
    executor.memory = SimpleNamespace(error=lambda: (kind, 3, 2))
    with pytest.raises(error, match=says):
        executor.check("all_reduce")
    assert isinstance(executor.failed, error)


def test_the_transport_reads_the_error_words_by_name():
    memory = peer_memory.PeerMemory.__new__(peer_memory.PeerMemory)
    memory.rank = 5
    memory.words = None                                 # closed
    assert memory.error() == (3, -1, 5)
    memory.words = [0, 7, 7, 0]                         # ERROR_NONE: nothing reported
    assert memory.error() is None
    memory.words = [1, 4, 2, 0]
    assert memory.error() == (1, 4, 2)
