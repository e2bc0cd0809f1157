"""The README's algorithm table names exactly the algorithms the code registers, and its
Quick start holds the two commands CI runs."""
import pathlib
import re

from collectives.algorithms import capabilities

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_algorithm_table_matches_the_capability_table():
    text = README.read_text()
    documented = set(re.findall(r"^\| (\w+) \| `(\w+)` \|", text, re.M))
    registered = {(c, a) for c, algs in capabilities().items() for a in algs}
    assert documented == registered, (f"in README only: {sorted(documented - registered)}; "
                                       f"in code only: {sorted(registered - documented)}")


def test_quick_start_has_the_two_commands():
    quick = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```\n(.+?)\n```", quick, re.S)
    assert len(commands) == 2
    assert "mpiexec -n 8" in commands[0] and "benchmarks/bench.py" in commands[0]
    assert "pytest" in commands[1]
