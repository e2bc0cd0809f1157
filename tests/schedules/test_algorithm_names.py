"""One name per algorithm variant where users look for it: rabenseifner, bruck, van_de_geijn,
dissemination and binomial are other names of the schedules that implement them (the
schedules' docstrings say which), accepted wherever an algorithm is named (the call, the
COLLECTIVES_ALGORITHM override), resolved to one schedule (so the ranks' calls and signatures
agree whichever name each used), listed by ``capabilities(aliases=True)`` and ``info``, and
documented on their rows of the algorithm table (docs/algorithms.md); unknown names stay a ValueError that
lists the valid ones, aliases included."""
import pathlib
import re
import threading

import numpy as np
import pytest

from collectives.algorithms import ALIASES, canonical, capabilities, check_algorithm
from collectives.algorithms.schedule import REGISTRY, build_plan, plan_args
from collectives.group import ProcessGroup
from collectives.transports.local import LocalWorld

import repo

ROOT = pathlib.Path(repo.ROOT)
EXPECTED = {("all_reduce", "rabenseifner"): "recursive_doubling",
            ("reduce", "rabenseifner"): "recursive_doubling",
            ("all_to_all", "bruck"): "recursive_doubling",
            ("broadcast", "van_de_geijn"): "recursive_doubling",
            ("barrier", "dissemination"): "recursive_doubling",
            ("broadcast", "binomial"): "tree", ("reduce", "binomial"): "tree",
            ("gather", "binomial"): "tree", ("scatter", "binomial"): "tree"}
CASES = sorted(EXPECTED)


def test_the_names_and_what_they_stand_for():
    found = {(c, a): n for c, names in ALIASES.items() for a, n in names.items()}
    assert found == EXPECTED
    for (collective, alias), name in found.items():
        assert name in REGISTRY[collective] and alias not in REGISTRY[collective]
        assert canonical(collective, alias) == name
        check_algorithm(collective, alias)
    assert canonical("all_reduce", "ring") == "ring"
    assert canonical("all_gather", "bruck") == "bruck"       # not an alias there


def test_capabilities_lists_them_only_when_asked():
    plain, named = capabilities(), capabilities(aliases=True)
    assert "rabenseifner" not in plain["all_reduce"]        # auto chooses among schedules
    for (collective, alias) in EXPECTED:
        assert alias in named[collective]
        assert set(plain[collective]) <= set(named[collective])


@pytest.mark.parametrize("collective, bad", [("all_gather", "bruck"),
                                             ("all_reduce", "dissemination"),
                                             ("all_reduce", "rabenseifnr")])
def test_unknown_names_list_the_valid_ones_aliases_included(collective, bad):
    with pytest.raises(ValueError) as info:
        check_algorithm(collective, bad)
    text = str(info.value)
    assert f"no algorithm {bad!r}" in text and "ring" in text and "auto" in text
    if collective == "all_reduce":
        assert "rabenseifner (= recursive_doubling)" in text


def _call(collective, size, rank, algorithm, group):
    """One call of ``collective`` on ``group``; returns the output."""
    n = 3 * size + 1
    data = np.arange(n, dtype=np.float64) * (rank + 1)
    if collective == "barrier":
        group.prepare("barrier", algorithm=algorithm)()
        return np.zeros(0)
    if collective == "all_reduce":
        group.prepare(collective, input=data, output=(out := np.empty(n)),
                      algorithm=algorithm)()
    elif collective in ("broadcast",):
        out = data.copy()
        group.prepare(collective, output=out, root=1, algorithm=algorithm)()
    elif collective == "reduce":
        group.prepare(collective, input=data, output=(out := np.zeros(n)), root=1,
                      algorithm=algorithm)()
    elif collective == "gather":
        out = np.zeros(n * size)
        group.prepare(collective, input=data, output=out, root=1, algorithm=algorithm)()
    elif collective == "scatter":
        out = np.zeros(n)
        group.prepare(collective, input=np.arange(n * size, dtype=np.float64) * (rank + 1),
                      output=out, root=1, algorithm=algorithm)()
    else:                                                   # all_to_all
        out = np.zeros(n * size)
        group.prepare(collective, input=np.arange(n * size, dtype=np.float64) * (rank + 1),
                      output=out, algorithm=algorithm)()
    return out


@pytest.mark.parametrize("collective, alias", CASES)
def test_an_alias_runs_its_schedule_even_beside_a_rank_using_the_other_name(collective, alias):
    size, world = 3, LocalWorld(3)
    groups, results = [None] * size, {}
    name = EXPECTED[collective, alias]

    def rank(r):
        groups[r] = ProcessGroup(world.transport(r), backend="local", timeout=20)
        results[r, "alias"] = _call(collective, size, r, alias, groups[r])
        # rank 0 asks by the schedule's own name, the others by the alias: one schedule
        results[r, "mixed"] = _call(collective, size, r, name if r == 0 else alias, groups[r])
        results[r, "name"] = _call(collective, size, r, name, groups[r])
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 3 * size, "a rank failed"
    for r in range(size):
        np.testing.assert_array_equal(results[r, "alias"], results[r, "name"])
        np.testing.assert_array_equal(results[r, "mixed"], results[r, "name"])
    assert groups[0].resolve_algorithm(collective, alias, 64) == name
    args = plan_args(collective, size, 8 if collective in ("all_reduce", "broadcast", "reduce")
                     else None if collective == "barrier" else (8,) * size
                     if collective != "all_to_all" else ((2,) * size,) * size, 0)
    assert build_plan(collective, name, 0, size, *args).algorithm == name


def test_the_override_takes_aliases(monkeypatch):
    from collectives import tuning
    assert tuning.parse_overrides("all_reduce=rabenseifner,barrier=dissemination") == \
        {"all_reduce": "recursive_doubling", "barrier": "recursive_doubling"}
    with pytest.raises(ValueError, match="COLLECTIVES_ALGORITHM='all_gather=bruck'"):
        tuning.parse_overrides("all_gather=bruck")


def test_algorithm_table_names_each_alias_on_its_row():
    text = (ROOT / "docs" / "algorithms.md").read_text()
    for (collective, alias), name in EXPECTED.items():
        row = re.search(rf"^\| {collective} \| `{name}` \|(.*)$", text, re.M)
        assert row and f"`{alias}`" in row.group(1), (collective, alias)
