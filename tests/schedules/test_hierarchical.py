"""Layer 1: hierarchical schedules (``algorithms/hierarchical.py``), simulated with all ranks in
one process: every collective with a hierarchical form, several intra/inter pairs, even and
uneven hosts (3 and 5, 1 and 7, one host, one rank per host, a rank -> host map), up to 64
hosts x 8 ranks; the topology's text; names and the errors of bad ones."""
import numpy as np
import pytest

from collectives.algorithms import canonical, check_algorithm, hierarchical
from collectives.algorithms.schedule import build_plan
from collectives.algorithms.simulate import reference, run, verify
from collectives.algorithms.topology import Topology
from collectives.ops import ReduceOp

COLLECTIVES = hierarchical.SUPPORTED
PAIRS = [("ring", "ring"), ("ring", "recursive_doubling"), ("direct", "ring"),
         ("ring", "tree"), ("recursive_doubling", "tree")]
# small topologies: every count of the flat schedule tests, dense blocks
SMALL = ["3,5", "1,7", "8", "4x1", "2x4", "2,3,4", "3x2,1", "map:0,1,0,1,2,2", "5,3"]


def name(intra, inter, topology):
    return f"hierarchical:{intra}+{inter}@{topology}"


def case_args(collective, p, c):
    """The flat schedule tests' counts for total count ``c``: uneven per rank."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return c
    if collective == "all_to_all":
        return tuple(tuple((c + 3 * i + j) % 5 + c // (p * p) for j in range(p))
                     for i in range(p))
    return tuple((c + i) % 7 + c // p for i in range(p))


def sparse_args(collective, p):
    """Large p: a few non-empty, uneven blocks (as the flat tests' large world sizes)."""
    if collective in ("all_reduce", "broadcast"):
        return p + 1
    if collective == "all_to_all":
        return tuple(tuple(1 if (i + j) % 97 == 0 else 0 for j in range(p)) for i in range(p))
    return tuple(i % 7 + 1 if i % 97 == 5 else 0 for i in range(p))


def supported(collective, intra, inter):
    try:
        check_algorithm(collective, name(intra, inter, "2x2"))
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("intra,inter", PAIRS)
def test_small_topologies_every_count(collective, intra, inter):
    if not supported(collective, intra, inter):
        pytest.skip(f"{intra}+{inter} has no hierarchical {collective}")
    for spec in SMALL:
        p = Topology.parse(spec).size
        roots = sorted({0, p // 2, p - 1}) if collective == "broadcast" else [0]
        for c in sorted({0, 1, p - 1, p, p + 1, 31, 1000}):
            for root in roots:
                verify(collective, name(intra, inter, spec), p, case_args(collective, p, c),
                       root=root)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("spec", ["64x8", "32x3,32x5", "1,7,62x8"])
def test_64_hosts_of_8(collective, spec):
    """512 ranks (and uneven hosts around that many), ring inside and ring across."""
    p = Topology.parse(spec).size
    verify(collective, name("ring", "ring", spec), p, sparse_args(collective, p), root=5)


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("intra,inter", [("ring", "recursive_doubling"), ("direct", "ring"),
                                         ("ring", "tree")])
def test_64_hosts_of_8_more_pairs(collective, intra, inter):
    if not supported(collective, intra, inter):
        pytest.skip(f"{intra}+{inter} has no hierarchical {collective}")
    for spec in ("64x8", "32x3,32x5"):
        p = Topology.parse(spec).size
        verify(collective, name(intra, inter, spec), p, sparse_args(collective, p), root=p - 1)


@pytest.mark.slow
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_64_hosts_of_8_dense(collective):
    p = 512
    count = 1000 if collective != "all_to_all" else 0
    verify(collective, name("ring", "ring", "64x8"), p, case_args(collective, p, count), root=7)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("dtype,op", [(np.float32, "sum"), (np.float64, "avg"),
                                      (np.int32, "max"), (np.int64, "product"),
                                      (np.uint8, "min")])
def test_dtypes_and_ops(collective, dtype, op):
    """Real dtypes and ops against numpy (floats to rounding: the hierarchical order of
    reduction is not the flat one), bitwise alike on every rank for all_reduce."""
    spec = "3,5"
    rng = np.random.default_rng(0)
    arrays = [(rng.random(37) * 4 + 1).astype(dtype) for _ in range(8)]
    for intra, inter in PAIRS[:3]:
        got = run(collective, name(intra, inter, spec), arrays, op=op)
        want = reference(collective, arrays, op=op)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5)
        if collective == "all_reduce":
            assert all(np.array_equal(got[0], g) for g in got[1:])


@pytest.mark.parametrize("collective", ["all_gather", "broadcast", "all_to_all"])
def test_moving_collectives_with_float_data(collective):
    rng = np.random.default_rng(1)
    arrays = [rng.random(9 if collective != "all_gather" else 2 + r) for r in range(8)]
    got = run(collective, name("ring", "ring", "1,7"), arrays, root=3)
    for g, w in zip(got, reference(collective, arrays, root=3)):
        assert np.array_equal(g, w)


def test_inter_part_crosses_each_host_pair_once_per_lane():
    """all_reduce at 4 hosts of 2, ring across: each lane rank sends 2(H-1) messages to other
    hosts, the others none; every other message stays inside its host."""
    topology = Topology.parse("4x2")
    for rank in range(8):
        plan = build_plan("all_reduce", name("ring", "ring", "4x2"), rank, 8, 64)
        crossing = [s for step in plan.steps for s in step.sends
                    if topology.host_of(s.peer) != topology.host_of(rank)]
        assert len(crossing) == 2 * 3
        assert {topology.local_index(s.peer) for s in crossing} == {topology.local_index(rank)}


# -- the topology ------------------------------------------------------------------------------


@pytest.mark.parametrize("text,sizes,spec", [
    ("3,5", (3, 5), "3,5"), ("64x8", (8,) * 64, "64x8"), ("2x4,1", (4, 4, 1), "2x4,1"),
    ("8", (8,), "8"), ("4,4", (4, 4), "2x4"), (" 1 , 7 ", (1, 7), "1,7"),
    ("map:0,0,1,1", (2, 2), "2x2"), ("map:0,1,0,1", (2, 2), "map:0,1,0,1"),
    ("map:5,5,2", (2, 1), "2,1")])
def test_topology_text(text, sizes, spec):
    topology = Topology.parse(text)
    assert topology.sizes == sizes and topology.spec == spec
    assert Topology.parse(topology.spec) == topology


def test_topology_forms_and_questions():
    t = Topology.of({0: "a", 1: "b", 2: "a", 3: "b"})
    assert t.hosts == ((0, 2), (1, 3)) and t.host_of(3) == 1 and t.local_index(2) == 1
    assert Topology.of([3, 5]) == Topology.parse("3,5") == Topology.of("3,5")
    assert Topology.from_map([0, 0, 1]).host_map == (0, 0, 1) and not t.contiguous


@pytest.mark.parametrize("bad", ["", "3,,5", "0,4", "x4", "0x4", "3,a", "map:", "map:0,-1",
                                 "2x", "4y2"])
def test_topology_text_errors(bad):
    with pytest.raises(ValueError, match="expected host sizes"):
        Topology.parse(bad)


def test_topology_setting(monkeypatch):
    from collectives import settings
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "2x4")
    assert settings.TOPOLOGY() == Topology.parse("4,4")
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "4,zero")
    with pytest.raises(ValueError, match="COLLECTIVES_TOPOLOGY"):
        settings.TOPOLOGY()
    monkeypatch.delenv("COLLECTIVES_TOPOLOGY")
    assert settings.TOPOLOGY() is None


# -- names and errors --------------------------------------------------------------------------


def test_names_are_canonical():
    assert canonical("all_to_all", "hierarchical:bruck+ring@4,4") == \
        "hierarchical:recursive_doubling+ring@2x4"
    assert canonical("all_reduce", "hierarchical:ring+rabenseifner@map:0,0,1,1") == \
        "hierarchical:ring+recursive_doubling@2x2"
    assert hierarchical.qualify("hierarchical:ring+ring", "3,5") == \
        "hierarchical:ring+ring@3,5"
    assert hierarchical.qualify("hierarchical:ring+ring@2x4", "3,5") == \
        "hierarchical:ring+ring@2x4"
    assert hierarchical.qualify("ring", "3,5") == "ring"
    arrays = [np.arange(5.0) + r for r in range(8)]
    a = run("all_reduce", "hierarchical:ring+ring@2x4", arrays)
    b = run("all_reduce", "hierarchical:ring+ring@4,4", arrays)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("collective,algorithm,message", [
    ("all_reduce", "hierarchical:ring+ring", "needs a topology"),
    ("reduce", "hierarchical:ring+ring@2x4", "reduce has no hierarchical form"),
    ("gather", "hierarchical:ring+ring@2x4", "gather has no hierarchical form"),
    ("all_reduce", "hierarchical:ring@2x4", "two registered algorithms"),
    ("all_reduce", "hierarchical:nope+ring@2x4", "intra-host algorithm 'nope' has no "
                                                 "reduce_scatter"),
    ("all_reduce", "hierarchical:ring+nope@2x4", "inter-host algorithm 'nope' has no "
                                                 "all_reduce"),
    ("all_reduce", "hierarchical:tree_pipelined+ring@2x4", "intra-host algorithm "
                                                           "'tree_pipelined'"),
    ("all_to_all", "hierarchical:ring+tree_pipelined@2x4", "no all_to_all"),
    ("all_reduce", "hierarchical:ring+ring@4,zero", "expected host sizes"),
])
def test_bad_names_are_value_errors_naming_the_operation(collective, algorithm, message):
    for check in (lambda: check_algorithm(collective, algorithm),
                  lambda: verify(collective, algorithm, 8, case_args(collective, 8, 3))):
        with pytest.raises(ValueError, match=message) as info:
            check()
        assert collective in str(info.value)


def test_topology_that_does_not_cover_the_world():
    with pytest.raises(ValueError, match=r"all_reduce .*covers 8 ranks, but the group has 6"):
        build_plan("all_reduce", "hierarchical:ring+ring@3,5", 0, 6, 10)
    with pytest.raises(ValueError, match="covers 8 ranks"):
        run("all_gather", "hierarchical:ring+ring@3,5", [np.ones(2)] * 6)
