"""The two-level cost model (``cost.replay`` with hosts, ``algorithms/two_level.py``) and the
hierarchical comparison tool (``bench/hierarchy.py``): messages inside a host priced with the
intra parameters, between hosts with the inter ones, a host's link shared by its ranks; the
forms used at 1024 x 8 held to the full replay where both can run."""
import pytest

from collectives.algorithms import cost, two_level
from collectives.algorithms.params import (DEFAULTS, INTER_HOST_DEFAULTS, Params,
                                           inter_host_params)
from collectives.algorithms.schedule import build_plan
from collectives.algorithms.topology import Topology

INTRA = Params(alpha=1e-6, beta=1e-10, gamma=1e-11)
INTER = Params(alpha=1e-4, beta=1e-8, gamma=1e-11)


def crossing_messages(collective, algorithm, topology, counts):
    """Messages between hosts, summed over every rank's plan, and the bytes (elements)."""
    topology = Topology.parse(topology)
    p = topology.size
    messages = elements = 0
    for rank in range(p):
        plan = build_plan(collective, algorithm, rank, p, counts)
        for step in plan.steps:
            for send in step.sends:
                if topology.host_of(send.peer) != topology.host_of(rank):
                    messages += 1
                    elements += send.region.count
    return messages, elements


def test_hierarchical_all_reduce_crosses_each_host_pair_once_per_lane_step():
    """8 hosts x 4, ring across: the middle step's ring among each lane's 8 ranks sends
    2(H-1) messages per lane rank of n/(L·H) elements each; a flat ring sends 2(p-1) messages
    across from each host boundary, and flat recursive doubling sends n/2 + n/4 + n/8 from
    every rank across."""
    n, H, L = 3200, 8, 4
    messages, elements = crossing_messages("all_reduce", "hierarchical:ring+ring@8x4",
                                           "8x4", n)
    assert messages == H * L * 2 * (H - 1)
    assert elements == H * L * 2 * (H - 1) * n // (L * H)          # 2(H-1)/H · n per host
    flat_messages, flat_elements = crossing_messages("all_reduce", "ring", "8x4", n)
    assert flat_messages == H * 2 * (H * L - 1)
    assert flat_elements == H * 2 * (H * L - 1) * n // (H * L)
    assert elements < flat_elements                         # fewer bytes per link crossing too
    _, rd_elements = crossing_messages("all_reduce", "recursive_doubling", "8x4", n)
    assert rd_elements == H * L * 2 * (n // 2 + n // 4 + n // 8)   # L times the hierarchical


def test_two_link_classes_price_each_message_by_where_it_goes():
    """Two ranks on one host cost intra α + β·n; on two hosts inter α + β·n."""
    n = 1000
    plans = [build_plan("broadcast", "ring", r, 2, n, 0) for r in range(2)]
    one_host = cost.replay(plans, 4, INTRA, hosts=(0, 0), inter=INTER)
    two_hosts = cost.replay(plans, 4, INTRA, hosts=(0, 1), inter=INTER)
    assert one_host == pytest.approx(INTRA.alpha + 4 * n * INTRA.beta)
    assert two_hosts == pytest.approx(INTER.alpha + 4 * n * INTER.beta)
    assert cost.replay(plans, 4, INTRA) == one_host      # no hosts: the one-level model


def test_a_hosts_link_is_shared_by_its_ranks_that_cross_at_once():
    """Ranks 0 and 1 (host 0) each send n to ranks 2 and 3 (host 1) at once: one rail carries
    both messages' bytes (2·β·n), two rails carry them side by side (β·n), α overlapping."""
    n = 10_000
    counts = ((0, 0, n, 0), (0, 0, 0, n), (0, 0, 0, 0), (0, 0, 0, 0))
    plans = [build_plan("all_to_all", "direct", r, 4, counts) for r in range(4)]
    cheap_local = Params(alpha=0, beta=0, gamma=0)
    one_rail = cost.replay(plans, 4, cheap_local, hosts=(0, 0, 1, 1), inter=INTER)
    two_rails = cost.replay(plans, 4, cheap_local, hosts=(0, 0, 1, 1),
                            inter=Params(INTER.alpha, INTER.beta, INTER.gamma, ports=2))
    assert one_rail == pytest.approx(INTER.alpha + 2 * 4 * n * INTER.beta)
    assert two_rails == pytest.approx(INTER.alpha + 4 * n * INTER.beta)


@pytest.mark.parametrize("transport", ["socket", "mpi"])
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "tree",
                                       "hierarchical:ring+ring",
                                       "hierarchical:ring+recursive_doubling"])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 64 << 20])
def test_forms_used_at_scale_follow_the_replay(transport, algorithm, nbytes):
    """At 8 hosts of 8 (where both run) the flat forms are within 15% of every plan
    replayed, and the hierarchical parts added up are within 35% above it (the parts of
    different lanes overlap a little in the replay, the sum does not let them)."""
    intra, inter = DEFAULTS[transport], INTER_HOST_DEFAULTS[transport]
    replayed = two_level.predict("all_reduce", algorithm, "8x8", nbytes, intra=intra,
                                 inter=inter)
    if algorithm.startswith("hierarchical"):
        formed = two_level._hierarchical("all_reduce", algorithm + "@8x8", 8, 8, nbytes,
                                         intra, inter, 4)
        assert replayed * 0.97 <= formed <= replayed * 1.35
    else:
        formed = two_level._flat("all_reduce", algorithm, 8, 8, nbytes, intra, inter, 4)
        assert formed == pytest.approx(replayed, rel=0.15)


def test_estimate_at_1024_hosts_of_8_is_model_only_and_quick():
    intra, inter = DEFAULTS["socket"], INTER_HOST_DEFAULTS["socket"]
    flat = two_level.estimate("all_reduce", "ring", "1024x8", 1 << 20, intra=intra,
                              inter=inter)
    hier = two_level.estimate("all_reduce", "hierarchical:ring+recursive_doubling", "1024x8",
                              1 << 20, intra=intra, inter=inter)
    assert hier < flat / 10           # 2·8191 inter latencies against 2·10 + 2·7 intra


def test_inter_host_defaults_are_named_per_transport():
    assert set(INTER_HOST_DEFAULTS) >= {"socket", "mpi"}
    assert inter_host_params("socket") is INTER_HOST_DEFAULTS["socket"]
    assert inter_host_params("something else") is INTER_HOST_DEFAULTS["mpi"]
    # between hosts is slower per message than inside one, for both
    for name in ("socket", "mpi"):
        assert INTER_HOST_DEFAULTS[name].alpha > DEFAULTS[name].alpha


def test_hosts_that_do_not_cover_the_world_are_refused():
    with pytest.raises(ValueError, match="hosts name 3 ranks"):
        cost.predict("all_reduce", "ring", 4, 100, hosts=(0, 0, 1), inter=INTER)


def test_the_tool_prints_a_table_and_its_crossovers(capsys):
    from collectives.bench import hierarchy
    rows = hierarchy.compare("all_reduce", "4x4", (4096, 1 << 20), intra=INTRA, inter=INTER)
    assert [r["bytes"] for r in rows] == [4096, 1 << 20]
    assert all(r["best_hierarchical"][0].startswith("hierarchical:") for r in rows)
    assert hierarchy.main(["--topology", "2x4", "--sizes", "4K,1M"]) == 0
    out = capsys.readouterr().out
    assert "| 4K |" in out and "Crossovers:" in out and "hierarchical:ring+ring" in out
