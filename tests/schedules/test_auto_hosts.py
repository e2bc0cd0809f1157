"""``auto`` past one host: with a topology of several hosts the decision table prices every
candidate with the two-level model (``two_level.estimate``: the transport's parameters inside
a host, the tuning file's ``inter`` or ``params.INTER_HOST_DEFAULTS`` between hosts) and adds
``hierarchical:<intra>+<inter>@<topology>`` candidates (``tuning.HIERARCHICAL_PAIRS``); its
rows are hierarchical exactly where the model says so. Without a topology (or with one host)
no row is ever hierarchical. The topology and the links between hosts are in the table's
digest, so ranks with different topologies refuse to make the group."""
import json
import math

import pytest

from collectives import tuning, tuning_file
from collectives.algorithms import auto_names, two_level
from collectives.algorithms.hierarchical import is_hierarchical
from collectives.algorithms.params import Params, default_params, inter_host_params
from collectives.algorithms.schedule import COLLECTIVES
from collectives.algorithms.topology import Topology
from collectives.group import ProcessGroup
from collectives.transports.local import LocalWorld

CLASSES = range(12, 26)          # 2 KiB .. 32 MiB (a class prices its smallest size)
HOSTS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")


@pytest.fixture(autouse=True)
def clean_settings(monkeypatch):
    for name in ("COLLECTIVES_TUNING", "COLLECTIVES_ALGORITHM", "COLLECTIVES_TOPOLOGY",
                 "COLLECTIVES_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def slow_link(tmp_path):
    """A tuning file whose links between hosts are 1 Gb/s with 2 ms per message."""
    path = str(tmp_path / "tuning.json")
    tuning_file.save_inter_params(path, "socket", Params(alpha=2e-3, beta=1 / 117e6,
                                                         gamma=2e-10))
    return path


def algorithms(table, collective):
    return {table.decision(collective, cls).algorithm for cls in CLASSES}


def test_without_a_topology_no_row_is_hierarchical():
    table = tuning.DecisionTable(8, "socket")
    assert table.inter is None and table.hierarchical == {}
    for collective in COLLECTIVES:
        classes = [0] if collective == "barrier" else CLASSES
        assert not any(is_hierarchical(table.decision(collective, cls).algorithm)
                       for cls in classes)


@pytest.mark.parametrize("spec", ["8", "8x1"])
def test_one_host_or_one_rank_per_host_adds_no_hierarchical_candidates(spec):
    table = tuning.DecisionTable(8, "socket", topology=spec)
    assert table.hierarchical == {}
    assert not any(is_hierarchical(a) for a in algorithms(table, "all_reduce"))


def test_hierarchical_rows_where_the_two_level_model_says_so(slow_link):
    table = tuning.DecisionTable(8, "socket", tuning=slow_link, topology="2x4")
    topology = Topology.parse("2x4")
    intra, inter = default_params("socket"), Params(alpha=2e-3, beta=1 / 117e6, gamma=2e-10)
    assert table.params == intra and table.inter == inter
    chosen = 0
    for collective in HOSTS:
        names = list(auto_names(collective)) + list(table.hierarchical[collective])
        assert all(n.endswith("@2x4") for n in table.hierarchical[collective])
        for cls in CLASSES:
            nbytes = tuning.class_bytes(cls)
            priced = {n: two_level.estimate(collective, n, topology, nbytes, intra=intra,
                                            inter=inter) for n in names}
            priced = {n: math.inf if t is None else t for n, t in priced.items()}
            best = min(priced.values())
            row = table.decision(collective, cls)
            assert row.by == "model"
            assert priced[row.algorithm] == pytest.approx(best, rel=1e-11), (collective, cls, row)
            chosen += is_hierarchical(row.algorithm)
    assert chosen > 0
    # on a link this slow the two-level model has all_reduce hierarchical from 1 MiB on
    for cls in range(tuning.size_class(1 << 20), 26):
        assert is_hierarchical(table.decision("all_reduce", cls).algorithm), cls


def test_the_default_links_between_hosts_and_the_files():
    table = tuning.DecisionTable(8, "socket", topology="2x4")
    assert table.inter == inter_host_params("socket")


def test_topology_and_links_are_in_the_digest(slow_link):
    plain = tuning.DecisionTable(8, "socket")
    hosts = tuning.DecisionTable(8, "socket", topology="2x4")
    assert plain.digest != hosts.digest
    assert hosts.digest == tuning.DecisionTable(8, "socket", topology="4,4").digest
    assert hosts.digest != tuning.DecisionTable(8, "socket", topology="map:0,1,0,1,0,1,0,1").digest
    assert hosts.digest != tuning.DecisionTable(8, "socket", tuning=slow_link,
                                                topology="2x4").digest
    assert "topology 2x4" in hosts.label()


def test_a_topology_of_another_size_is_refused():
    with pytest.raises(ValueError, match="decision table: the topology 2x4 covers 8 ranks, "
                                         "but the group has 6"):
        tuning.DecisionTable(6, "socket", topology="2x4")


def test_the_inter_entry_survives_recalibration_and_is_checked(slow_link, tmp_path):
    tuning_file.save_params(slow_link, "socket", Params(1e-5, 1e-9, 1e-9))
    assert tuning_file.load_inter_params("socket", slow_link).alpha == 2e-3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"socket": {"alpha": 1e-5, "beta": 1e-9, "gamma": 1e-9,
                                          "inter": {"alpha": -1, "beta": 1, "gamma": 1}}}))
    with pytest.raises(ValueError, match="'inter' needs numbers"):
        tuning.DecisionTable(8, "socket", tuning=str(bad), topology="2x4")


def _group(world, rank, results):
    try:
        results[rank] = ProcessGroup(world.transport(rank), backend="local", timeout=20)
    except Exception as exc:            # noqa: BLE001 (the test reads it)
        results[rank] = exc


def test_ranks_with_different_topologies_refuse_the_group(monkeypatch):
    import threading
    world = LocalWorld(4)
    results = [None] * 4
    # the setting is read when each rank makes its group: give ranks 2, 3 another one
    from collectives import settings
    real = settings.TOPOLOGY
    lock = threading.local()

    class PerRank:
        name = real.name

        def __call__(self):
            return Topology.parse("2x2" if getattr(lock, "rank", 0) < 2 else "1,3")

    monkeypatch.setattr(settings, "TOPOLOGY", PerRank())

    def make(rank):
        lock.rank = rank
        _group(world, rank, results)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(r, Exception) for r in results), results
    assert "decision tables differ" in str(results[0]) and "topology 1,3" in str(results[0])
