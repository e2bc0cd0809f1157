"""``simulate.run`` refuses input that does not fit the collective before anything runs:
vectors of different lengths where every rank gives one of the call's length, mixed dtypes,
unknown names (the ValueError lists the valid ones, as the facade's does), counts of the
wrong shape and roots outside the world; it still takes the uneven counts the collectives
that take counts allow (all_gather/gather blocks, reduce_scatter/scatter/all_to_all counts)
and the aliases the facade takes."""
import numpy as np
import pytest

from collectives.algorithms import capabilities
from collectives.algorithms.simulate import reference, run
from collectives.ops import COLLECTIVES


def ones(n, dtype=np.float64):
    return np.ones(n, dtype)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize("lengths", [(4, 5, 6), (6, 5, 4)])
def test_vectors_of_different_lengths_are_a_value_error_naming_the_rank(collective, lengths):
    arrays = [(r + 1) * ones(n) for r, n in enumerate(lengths)]
    with pytest.raises(ValueError, match=rf"simulate {collective}: rank 1 gives 5 elements"):
        run(collective, "tree", arrays)
    with pytest.raises(ValueError, match=rf"simulate {collective}: rank 1 gives 5 elements"):
        reference(collective, arrays)


def test_a_broadcast_from_a_root_of_another_length_is_a_value_error():
    with pytest.raises(ValueError, match=r"rank 0 gives 4 elements, but rank 1 gives 6"):
        run("broadcast", "ring", [ones(4), ones(6), ones(6)], root=1)


def test_counts_that_do_not_fit_the_arrays_are_a_value_error():
    with pytest.raises(ValueError, match=r"rank 0 gives 4 elements, but the counts say 5"):
        run("all_reduce", "ring", [ones(4), ones(4)], counts=5)
    with pytest.raises(ValueError, match=r"all_gather: rank 1 gives 3 elements, but its "
                                         r"counts say 2"):
        run("all_gather", "ring", [ones(2), ones(3)], counts=[2, 2])
    with pytest.raises(ValueError, match=r"one count >= 0 per rank \(2\)"):
        run("all_gather", "ring", [ones(2), ones(3)], counts=[2, 3, 1])
    with pytest.raises(ValueError, match=r"2 x 2 matrix"):
        run("all_to_all", "ring", [ones(2), ones(2)], counts=[[1, 1]])
    with pytest.raises(ValueError, match=r"not element counts"):
        run("reduce_scatter", "ring", [ones(2), ones(2)], counts=[1.5, 0.5])


def test_mixed_dtypes_are_a_type_error_naming_the_ranks():
    with pytest.raises(TypeError, match=r"rank 1 gives float64 but rank 0 gives float32"):
        run("all_reduce", "tree", [ones(4, np.float32), ones(4), ones(4, np.float32)])
    with pytest.raises(TypeError, match=r"rank 2 gives int32 but rank 0 gives float64"):
        run("all_gather", "ring", [ones(1), ones(2), ones(3, np.int32)])


def test_an_unknown_algorithm_is_a_value_error_listing_the_valid_names():
    with pytest.raises(ValueError) as caught:
        run("all_reduce", "rign", [ones(4), ones(4)])
    text = str(caught.value)
    assert "all_reduce has no algorithm 'rign'" in text
    for name in capabilities(aliases=True)["all_reduce"]:
        assert name in text
    with pytest.raises(ValueError, match="valid: "):
        run("all_reduce", "auto", [ones(4), ones(4)])         # the simulator runs a schedule


def test_an_unknown_collective_is_a_value_error_listing_the_collectives():
    with pytest.raises(ValueError, match="unknown collective 'allreduce'; known: " +
                       ", ".join(COLLECTIVES)):
        run("allreduce", "ring", [ones(4), ones(4)])
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        reference("allreduce", [ones(4), ones(4)])


def test_roots_and_missing_arrays_are_checked():
    with pytest.raises(ValueError, match=r"simulate reduce: root must be a rank in 0\.\.1"):
        run("reduce", "ring", [ones(2), ones(2)], root=2)
    with pytest.raises(ValueError, match=r"simulate all_reduce: rank 1 gives None"):
        run("all_reduce", "ring", [ones(2), None])
    with pytest.raises(ValueError, match=r"no ranks"):
        run("all_reduce", "ring", [])
    # non-roots of a broadcast or a scatter bring no data
    assert [o.tolist() for o in run("broadcast", "tree", [None, 2 * ones(3)], root=1)] == \
        [[2.0] * 3] * 2
    assert [o.tolist() for o in run("scatter", "tree", [np.arange(4.0), None])] == \
        [[0.0, 1.0], [2.0, 3.0]]


def test_an_alias_runs_the_schedule_it_names():
    arrays = [np.arange(6.0) + r for r in range(3)]
    for got, want in zip(run("all_reduce", "rabenseifner", arrays),
                         reference("all_reduce", arrays)):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("collective,arrays,counts", [
    ("all_gather", [ones(1), 2 * ones(3), 3 * ones(0)], None),
    ("gather", [ones(2), 2 * ones(1), 3 * ones(4)], None),
    ("reduce_scatter", [np.arange(6.0) * (r + 1) for r in range(3)], (1, 3, 2)),
    ("scatter", [np.arange(7.0), None, None], (4, 0, 3)),
    ("all_to_all", [np.arange(3.0), np.arange(5.0), np.arange(1.0)], None),
    ("all_to_all", [np.arange(3.0), np.arange(2.0)], ((1, 2), (2, 0))),
])
def test_uneven_counts_where_the_collective_takes_counts_still_run(collective, arrays, counts):
    for name in capabilities()[collective]:
        got = run(collective, name, arrays, counts=counts)
        want = reference(collective, arrays, counts=counts)
        for g, w in zip(got, want):
            assert (g is None and w is None) or np.array_equal(g, w), (name, g, w)
