"""``bench.py --simulate P``'s table: one row per call (requested sizes that round to one
element count, as small sizes do at large P where every rank needs a whole element, are one
row, and a note says which sizes it stands for), and its durations in a unit that shows them
(never "0.00 s"). In process, with verification skipped: the table is the point."""
import re

from collectives.bench import cli

ARGS = ["--simulate", "4096", "--sizes", "4K,16K,64K", "--algorithms", "tree,recursive_doubling",
        "--verify-seconds", "0"]
ROW = re.compile(r"^\s+(\d+[KMG]?)\s+(\d+)\s+(\w+)\s+[\d.]+\s+[\d.]+")


def table_rows(text):
    """{collective: [(size, count, algorithm)]} from the printed tables."""
    rows, collective = {}, None
    for line in text.splitlines():
        if line.startswith("# ") and " ranks (predicted" in line:
            collective = line[2:].split(",")[0]
        elif (match := ROW.match(line)) and collective:
            rows.setdefault(collective, []).append(match.groups())
    return rows


def test_sizes_that_round_to_one_call_are_one_row(capsys):
    assert cli.main([*ARGS, "--collectives", "reduce_scatter,all_reduce"]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    for collective, listed in rows.items():
        assert len(listed) == len(set(listed)), (collective, listed)
    # 4K of float32 is 1024 elements: under one per rank of 4096, so it is the 16K call
    assert [r[:2] for r in rows["reduce_scatter"]] == \
        [("16K", "4096")] * 2 + [("64K", "16384")] * 2
    assert "# 4K -> 16K: whole elements, at least one per rank" in out
    # all_reduce is not split into blocks: every size is its own call
    assert [r[0] for r in rows["all_reduce"]] == ["4K", "4K", "16K", "16K", "64K", "64K"]


def test_durations_are_printed_in_a_unit_that_shows_them(capsys):
    assert cli.main([*ARGS, "--collectives", "all_reduce"]) == 0
    out = capsys.readouterr().out
    assert "0.00 s" not in out and "~0 s" not in out
    assert re.search(r"# predicted in \d+(\.\d+)? (us|ms|s)$", out, re.M), out
    assert re.search(r"# verification took \d+(\.\d+)? (us|ms|s):", out), out


def test_effective_sizes_and_format_duration():
    from collectives.bench.model import effective_sizes, format_duration
    assert effective_sizes("all_gather", [4096, 16384, 16385, 65536], 4, 4096) == \
        [(4096, [4096, 16384, 16385]), (16384, [65536])]
    assert effective_sizes("all_reduce", [4096, 4098], 4, 4096) == [(1024, [4096, 4098])]
    assert [format_duration(t) for t in (0.0, 4e-5, 0.0123, 4.567)] == \
        ["0 us", "40 us", "12.3 ms", "4.57 s"]
