"""The peer-memory protocol stated once (collectives/kernels/peer_protocol.py): the header
generated for the CUDA kernel says what the Python definition says, the kernel's text uses
the header's names and no bare instruction number, column or error kind, and rows are built
and read by column name. On the CPU: the kernel is only read here, never compiled."""
import pathlib
import re

import pytest

from collectives.kernels import cuda_peer, peer_protocol
from collectives.kernels.peer_protocol import (
    COPY, EPOCH, ERROR_KINDS, FLAG_WORDS, GROUPS, INSTRUCTIONS, KERNEL_PARAMETERS, PUSH,
    REDUCE_N, SEND, TAKE, WIDTH)

KERNEL = pathlib.Path(cuda_peer.__file__).with_name("cuda_peer.cu").read_text()
DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "peer-memory.md"
# the names the header gives the kernel: kinds, columns, errors, the special kernels' words,
# flag words (what the kernel must take from the header, never define itself)
HEADER_NAME = re.compile(r"\b(?:OP|COL|ERROR|PIPELINED|COPIES|IN_PLACE_AT)_\w+|\b\w+_WORDS?\b")


def _defines(text):
    """name -> value text of every ``#define NAME value`` line of ``text``."""
    found = {}
    for name, value in re.findall(r"^#define (\w+) (.+)$", text, re.M):
        assert name not in found, f"{name} defined twice"
        found[name] = value.strip()
    return found


def _code(text):
    """``text`` without its comments."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def test_the_header_says_what_the_definition_says():
    header = _defines(peer_protocol.header())
    assert header == {name: str(value) for name, value in peer_protocol.definitions().items()}
    for kind in INSTRUCTIONS:
        assert header[f"OP_{kind.name}"] == str(int(kind))
        for column in kind.columns[2:]:
            assert header[f"COL_{kind.name}_{column.name.upper()}"] == \
                str(getattr(kind, column.name))
    assert (header["COL_KIND"], header["COL_STEP"]) == ("0", "1")
    for group, (kinds, names) in GROUPS.items():
        for name in names:
            assert {getattr(kind, name) for kind in kinds} == {int(header[
                f"COL_{group}_{name.upper()}"])}
    for word in FLAG_WORDS:
        assert header[word.name] == str(word.at)
    for kind in ERROR_KINDS:
        assert header[f"ERROR_{kind.name}"] == str(kind.number)
    assert header["WIDTH"] == str(WIDTH) == "13" and header["FOLD"] == "7"
    assert header["LINE_PERIOD"] == f"{peer_protocol.LINE_PERIOD}ULL"


def test_the_definition_keeps_the_layout_the_kernel_was_built_for():
    """Numbers other processes' kernels and the error words of a running group depend on:
    a change here is a change of protocol, made on purpose."""
    assert [(kind.name, int(kind)) for kind in INSTRUCTIONS] == [
        ("BARRIER", 0), ("EPOCH", 1), ("PUSH", 2), ("ARRIVE", 3), ("COPY", 4), ("REDUCE", 5),
        ("SEND", 6), ("TAKE", 7), ("SEND_LL", 8), ("TAKE_LL", 9), ("REDUCE_LL", 10),
        ("TAKE_REDUCE", 11), ("REDUCE_N", 12)]
    assert (PUSH.peer, PUSH.count, PUSH.their_step, PUSH.message) == (2, 7, 8, 9)
    assert (SEND.count, SEND.output_at, TAKE.direct, REDUCE_N.operand) == (6, 8, 8, 6)
    assert [(e.name, e.number) for e in ERROR_KINDS] == [
        ("NONE", 0), ("TIMED_OUT", 1), ("ABORTED", 2), ("CLOSED", 3), ("CALLED_OTHERWISE", 4)]
    assert (peer_protocol.SEEN_WORDS, peer_protocol.DELIVERED_WORDS, peer_protocol.MODE_WORDS,
            peer_protocol.FLAG_BYTES) == (768, 1024, 34304, 276480)


def test_the_kernel_source_starts_with_the_header():
    source = cuda_peer.source("sum", "float32", fences=1)
    assert source.startswith(peer_protocol.header())
    assert source.split(peer_protocol.header(), 1)[1].startswith(
        f"#define THREADS {cuda_peer.THREADS}\n#define FENCES 1\n")


def test_the_kernel_has_no_bare_protocol_numbers():
    code = _code(KERNEL)
    bare = [r"\bcase\s+\d", r"\b(?:r|q|chain|code_at|own|error)\s*\[\s*\d+\s*\]",
            r"WIDTH\s*\+\s*\d", r"WIDTH\s*\]\s*[!=]=\s*\d", r"\bfail\s*\(\s*c\s*,\s*\d",
            r"atomicCAS\s*\([^,]*,\s*\d", r"\b(?:kind|gather|mode)\s*[<>=!]=?\s*\d",
            r"\bbases\s*\[\s*\d"]
    found = [(pattern, m.group(0)) for pattern in bare for m in re.finditer(pattern, code)]
    assert not found, found


def test_every_protocol_name_the_kernel_uses_comes_from_the_header():
    defined = set(peer_protocol.definitions())
    used = set(HEADER_NAME.findall(_code(KERNEL)))
    assert used, "the kernel names nothing from the header"
    assert not used - defined, sorted(used - defined)
    own = set(_defines(KERNEL))              # the kernel's own macros are not the protocol's
    assert not own & defined, sorted(own & defined)


def test_the_interpreter_runs_every_instruction_once():
    body = _code(KERNEL).split("run_program(", 1)[1].split("two_shot_in_place", 1)[0]
    labels = re.findall(r"\bcase\s+(\w+)\s*:", body)
    assert sorted(labels) == sorted(f"OP_{kind.name}" for kind in INSTRUCTIONS)


def test_every_kernel_takes_the_parameters_in_the_protocols_order():
    kernels = re.findall(r'extern "C" __global__ void __launch_bounds__\(THREADS\)\s*'
                         r'(\w+)\((.*?)\)\s*\{', _code(KERNEL), re.S)
    assert [name for name, _ in kernels] == ["run_program", "two_shot_in_place",
                                             "pipelined_reduce_scatter", "copies_around"]
    for name, parameters in kernels:
        names = [p.split()[-1].lstrip("*") for p in parameters.split(",")]
        assert tuple(names) == KERNEL_PARAMETERS, name


def test_rows_are_built_and_read_by_column_name():
    row = PUSH.row(3, peer=1, src_buffer=0, src_offset=8, dst_buffer=2, dst_offset=16, count=5,
                   their_step=4, message=0)
    assert row == (PUSH, 3, 1, 0, 8, 2, 16, 5, 4, 0) and row[PUSH.count] == 5
    read = PUSH.read(row)
    assert (read.kind, read.step, read.peer, read.count, read.their_step) == (2, 3, 1, 5, 4)
    assert EPOCH.row(0, published=0) == (EPOCH, 0, 0, 0, 0)        # defaults: first, direct
    chain = REDUCE_N.row(1, dst_buffer=1, dst_offset=0, count=4, operands=2, operand=[9, 17])
    assert len(chain) == REDUCE_N.operand + 2 and peer_protocol.chain_operands(chain) == [9, 17]
    with pytest.raises(TypeError, match="no count"):
        COPY.row(0, dst_buffer=1, dst_offset=0, src_buffer=0, src_offset=0)
    with pytest.raises(TypeError, match="no column size"):
        COPY.row(0, dst_buffer=1, dst_offset=0, src_buffer=0, src_offset=0, count=1, size=2)
    with pytest.raises(ValueError, match="at most 7"):
        REDUCE_N.row(0, dst_buffer=1, dst_offset=0, count=1, operands=8, operand=[0] * 8)
    assert all(kind.width <= WIDTH for kind in INSTRUCTIONS)


def test_operands_round_trip():
    assert peer_protocol.decode_operand(peer_protocol.buffer_operand(3, 1000)) == (3, 1000)
    value = peer_protocol.line_operand(4096, 7)
    assert value < 0 and peer_protocol.decode_line_operand(value) == (4096, 7)
    assert peer_protocol.epoch(4, 2) == (5 << peer_protocol.STEP_BITS) | 2
    # below every epoch of its call, above every epoch of the call before
    assert peer_protocol.epoch(3, (1 << peer_protocol.STEP_BITS) - 2) < \
        peer_protocol.in_place_epoch(4) == peer_protocol.epoch(4, 0) - 1


@pytest.mark.parametrize("name", sorted(peer_protocol.TABLES))
def test_docs_peer_memory_tables_are_the_definitions(name):
    text = DOC.read_text()
    start, end = f"<!-- peer_protocol: {name} -->", f"<!-- end of {name} -->"
    assert start in text and end in text, f"docs/peer-memory.md needs the {name} table's markers"
    table = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert table == peer_protocol.TABLES[name]().strip(), (
        f"docs/peer-memory.md's {name} table differs from kernels/peer_protocol.py: paste the "
        f"output of peer_protocol.TABLES[{name!r}]() between the markers")
