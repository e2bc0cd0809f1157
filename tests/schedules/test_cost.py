"""The α-β-γ cost model (collectives/algorithms/cost.py) and ``auto``.

Closed forms against hand-computed numbers; the model counted from the schedules against the
closed forms at powers of two; the fit on synthetic noisy timings; auto's choices on cases
whose answer is known; the tuning file; calibration over the local transport."""
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest

from collectives.algorithms import capabilities, choose
from collectives import calibration
from collectives.algorithms import cost
from collectives.algorithms.cost import Params, formula, predict, predict_bytes
from collectives.algorithms.schedule import Plan, Recv, Region, Send, Step
from collectives.errors import CollectiveError

P = Params(alpha=1e-5, beta=1e-9, gamma=2e-9)
NO_GAMMA = Params(alpha=1e-5, beta=1e-9, gamma=0.0)
MIB = 1 << 20


@pytest.fixture(autouse=True)
def no_tuning_file(monkeypatch):
    monkeypatch.delenv(cost.ENV_TUNING, raising=False)
    monkeypatch.delenv("COLLECTIVES_DEBUG", raising=False)


# --- closed forms, by hand ---------------------------------------------------------------------

def test_formulas_against_hand_computed_values():
    n = 8 * MIB                   # 8388608 bytes, p = 8: lg p = 3, (p-1)/p = 0.875
    cases = {
        # 2(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ = 14e-5 + 0.0146800640 + 0.0146800640
        ("all_reduce", "ring"): 14e-5 + 2 * 7340032e-9 + 7340032 * 2e-9,
        # Rabenseifner: 2 lg p α + 2((p-1)/p)nβ + ((p-1)/p)nγ
        ("all_reduce", "recursive_doubling"): 6e-5 + 2 * 7340032e-9 + 7340032 * 2e-9,
        ("all_gather", "ring"): 7e-5 + 7340032e-9,             # (p-1)α + ((p-1)/p)nβ
        ("all_gather", "recursive_doubling"): 3e-5 + 7340032e-9,   # lg p α + ((p-1)/p)nβ
        ("all_to_all", "ring"): 7e-5 + 7340032e-9,             # pairwise exchange
        ("all_to_all", "recursive_doubling"): 3e-5 + 3 * 4194304e-9,   # Bruck: lg p(α + (n/2)β)
        ("broadcast", "tree"): 3 * (1e-5 + 8388608e-9),        # binomial: lg p(α + nβ)
        ("reduce_scatter", "ring"): 7e-5 + 7340032e-9 + 7340032 * 2e-9,
        ("barrier", "recursive_doubling"): 3 * (1e-5 + 1e-9),  # dissemination, 1-byte tokens
    }
    for (collective, algorithm), want in cases.items():
        assert formula(collective, algorithm, 8, n, P) == pytest.approx(want, rel=1e-12), \
            (collective, algorithm)
    # below 16 elements per block recursive doubling all_reduce swaps whole vectors:
    # lg p (α + nβ + nγ) with n = 64 bytes = 16 float32, p = 8
    assert formula("all_reduce", "recursive_doubling", 8, 64, P) == \
        pytest.approx(3 * (1e-5 + 64e-9 + 128e-9), rel=1e-12)
    # Bruck at p = 6: 3 rounds sending the slots j < 6 with bit k set: {1,3,5}, {2,3}, {4,5}
    assert formula("all_to_all", "recursive_doubling", 6, 6000, P) == \
        pytest.approx(3e-5 + 7 * 1000e-9, rel=1e-12)
    assert formula("all_reduce", "no-such-algorithm", 8, n, P) is None


# --- counted from the schedules == closed forms ------------------------------------------------

POWERS = (2, 4, 8, 16, 32, 64)


@pytest.mark.parametrize("p", POWERS)
def test_counted_all_reduce_equals_formulas(p):
    # count divisible by p: every block equal, so the schedules are exactly the textbook ones
    for nbytes in (4 * p, 4 * p * 1024):        # one element per block (doubling), Rabenseifner
        for algorithm in ("ring", "recursive_doubling", "tree"):
            got = predict_bytes("all_reduce", algorithm, p, nbytes, P)
            assert got == pytest.approx(formula("all_reduce", algorithm, p, nbytes, P),
                                        rel=1e-12), (algorithm, nbytes)


@pytest.mark.parametrize("p", POWERS)
def test_counted_all_gather_equals_formulas(p):
    """Exactly the formula without γ; with γ the one extra term is the copy of the rank's own
    block into its output (γ/2 per byte, n/p bytes), which the textbook formula ignores."""
    nbytes = 4 * p * 1000
    for algorithm in ("ring", "recursive_doubling"):
        closed = formula("all_gather", algorithm, p, nbytes, NO_GAMMA)
        assert predict_bytes("all_gather", algorithm, p, nbytes, NO_GAMMA) == \
            pytest.approx(closed, rel=1e-12)
        own_copy = 0.5 * P.gamma * nbytes / p
        assert predict_bytes("all_gather", algorithm, p, nbytes, P) == \
            pytest.approx(closed + own_copy, rel=1e-12)


@pytest.mark.parametrize("p", POWERS)
def test_counted_binomial_broadcast_equals_formula(p):
    for nbytes in (4, 4000, 4 * MIB):
        assert predict_bytes("broadcast", "tree", p, nbytes, P) == \
            pytest.approx(formula("broadcast", "tree", p, nbytes, P), rel=1e-12)


# Where the closed forms are approximations, and by how much (relative).
APPROXIMATE = {
    # n cut into S pipeline segments that differ by one element when S does not divide n
    ("broadcast", "ring"): 1e-3,
    # folded non-powers of two: survivors stand for one or two blocks, the form assumes n/p'
    ("reduce_scatter", "recursive_doubling"): 0.05,
    # at p = 2, 3, 5 some of Bruck's outgoing slots already lie back to back: no packing
    ("all_to_all", "recursive_doubling"): 0.07,
    # blocks filed on the way down the tree: a few n/p copies whose number follows the
    # tree's staging details (still changing); the transfers are exact
    ("scatter", "tree"): 0.02,
    ("scatter", "recursive_doubling"): 0.02,     # the tree's schedule under this name
    ("reduce_scatter", "tree"): 0.02,
    ("all_to_all", "tree"): 0.02,
}


# Pipelined trees' closed forms price each slot at its busiest rank: approximations, held to
# the replay in tests/schedules/test_pipelined_tree.py.
PIPELINED = {"tree_pipelined", "double_binary_tree"}


def test_every_formula_matches_the_counted_model_at_powers_of_two():
    """Every closed form there is, held against the replay (γ = 0: the textbook formulas
    leave out local copies; the pipelined chain broadcast is the one approximation)."""
    for p in (2, 4, 8, 16):
        nbytes = 4 * p * p * 64
        for collective, algorithms in capabilities().items():
            for algorithm in algorithms:
                if algorithm in cost.COUNTED_ONLY:
                    assert formula(collective, algorithm, p, nbytes, NO_GAMMA) is None
                    continue
                if algorithm in PIPELINED:
                    continue
                closed = formula(collective, algorithm, p, nbytes, NO_GAMMA)
                assert closed is not None, (collective, algorithm)
                per_call = nbytes // p if collective == "scatter" else nbytes
                got = predict_bytes(collective, algorithm, p, per_call, NO_GAMMA)
                tol = 1e-3 if (collective, algorithm) == ("broadcast", "ring") else 1e-12
                assert got == pytest.approx(closed, rel=tol), (collective, algorithm, p)


def test_closed_forms_with_copies_track_the_counted_model_at_any_size():
    """What ``estimate`` falls back to beyond COUNTED_MAX_SIZE: the formula plus the local
    copies on the critical path, exact except where APPROXIMATE says."""
    for p in (2, 3, 5, 6, 7, 12, 13, 16, 24):
        nbytes = 4 * p * p * 64
        for collective, algorithms in capabilities().items():
            for algorithm in algorithms:
                if algorithm in cost.COUNTED_ONLY or algorithm in PIPELINED:
                    continue
                closed = formula(collective, algorithm, p, nbytes, P, copies=True)
                per_call = nbytes // p if collective == "scatter" else nbytes
                got = predict_bytes(collective, algorithm, p, per_call, P)
                tol = APPROXIMATE.get((collective, algorithm), 1e-9)
                assert got == pytest.approx(closed, rel=tol), (collective, algorithm, p)


def test_uneven_blocks_cost_their_largest_block():
    # 10 elements over 4 ranks: blocks 3,3,2,2; each ring step waits for its largest block
    p, params = 4, Params(alpha=0.0, beta=1.0, gamma=0.0)
    assert predict("all_gather", "ring", p, (3, 3, 2, 2), params=params, itemsize=1) == 3 * 3
    assert predict("all_reduce", "ring", p, 10, params=params, itemsize=1) == 2 * 3 * 3


# --- the replay's model of a rank ---------------------------------------------------------------

def _plan(rank, steps):
    return Plan("all_gather", "handmade", rank, 3, tuple(steps), 0)


def test_one_port_sends_of_a_step_serialize():
    """Rank 0 sends 100 bytes to each of ranks 1 and 2 in one step: one send port, so
    2(α + 100β); a pairwise exchange in both directions costs α + nβ (full duplex)."""
    data = Region("output", 0, 100)
    plans = [_plan(0, [Step(sends=(Send(1, data), Send(2, data)))]),
             _plan(1, [Step(recvs=(Recv(0, data),))]),
             _plan(2, [Step(recvs=(Recv(0, data),))])]
    params = Params(alpha=1.0, beta=0.01, gamma=0.0)
    assert cost.replay(plans, 1, params) == pytest.approx(2 * (1.0 + 1.0))
    swap = [_plan(r, [Step(sends=(Send(1 - r, data),), recvs=(Recv(1 - r, data),))])
            for r in range(2)]
    assert cost.replay(swap, 1, params) == pytest.approx(1.0 + 1.0)


def test_replay_reports_deadlocks_and_size_mismatches():
    data = Region("output", 0, 4)
    waiting = [_plan(r, [Step(recvs=(Recv(1 - r, data),))]) for r in range(2)]
    with pytest.raises(CollectiveError, match="deadlocks"):
        cost.replay(waiting, 4, P)
    mismatched = [_plan(0, [Step(sends=(Send(1, data),))]),
                  _plan(1, [Step(recvs=(Recv(0, Region("output", 0, 5)),))])]
    with pytest.raises(CollectiveError, match="sends 4 elements"):
        cost.replay(mismatched, 4, P)


def test_large_world_sizes_use_the_closed_form():
    # past COUNTED_MAX_SIZE ranks auto does not replay where a closed form exists
    p, nbytes = 256, 64 * MIB
    assert p > cost.COUNTED_MAX_SIZE
    assert cost.estimate("all_reduce", "ring", p, nbytes, P) == \
        formula("all_reduce", "ring", p, nbytes, P)


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="no algorithm 'nope'"):
        predict("all_reduce", "nope", 4, 16)
    with pytest.raises(ValueError, match="unknown collective"):
        predict("allreduce", "ring", 4, 16)
    with pytest.raises(ValueError, match="alpha must be"):
        Params(-1.0, 0.0, 0.0)


# --- fitting ------------------------------------------------------------------------------------

def test_fit_recovers_known_parameters_from_noisy_timings():
    rng = np.random.default_rng(1)
    for true in (Params(2e-6, 1 / 5e9, 1 / 4e9), Params(2e-5, 1 / 150e9, 1e-12),
                 Params(4e-5, 1 / 3.5e9, 1 / 5e9)):
        sizes = [8 * 4 ** k for k in range(12)] * 5           # 8 B .. 32 MiB, five of each
        noise = lambda: 1 + 0.05 * rng.uniform(-1, 1)          # noqa: E731  (5%)
        pingpong = [(n, (true.alpha + true.beta * n) * noise()) for n in sizes]
        reductions = [(n, (3e-7 + true.gamma * n) * noise()) for n in sizes if n >= 4096]
        got = calibration.fit(pingpong, reductions)
        for name in ("alpha", "beta", "gamma"):
            assert getattr(got, name) == pytest.approx(getattr(true, name), rel=0.10), name


def test_fit_never_returns_negative_parameters():
    # timings that fall with size would give a negative β; latency-free ones a negative α
    got = calibration.fit([(8, 3e-6), (1 << 20, 1e-6)], [(4096, 1e-6), (1 << 20, 1e-6)])
    assert got.alpha >= 0 and got.beta >= 0 and got.gamma >= 0
    got = calibration.fit([(1000, 1e-7), (2000, 3e-7)], [(1000, 1e-7)])
    assert got.alpha == 0.0 and got.beta > 0
    assert calibration.fit([], [], default=P) == P
    with pytest.raises(ValueError, match="timings must be positive"):
        calibration.fit([(8, -1.0), (16, 1.0)], [(8, 1.0)])
    with pytest.raises(ValueError, match="need ping-pong"):
        calibration.fit([], [(8, 1.0)])


# --- auto ---------------------------------------------------------------------------------------

LOG_P = {"recursive_doubling", "tree", "tree_pipelined", "double_binary_tree"}


def test_auto_takes_a_log_p_algorithm_for_tiny_messages_at_scale():
    # 256 bytes: one float32 per rank's block at p = 64
    for transport in ("mpi", "socket", "local", "nccl"):
        for collective in ("all_reduce", "all_gather", "broadcast", "reduce", "barrier",
                           "all_to_all", "reduce_scatter"):
            name = choose(collective, 64, 256 if collective != "barrier" else 0, transport)
            assert name in LOG_P, (transport, collective, name)


def test_auto_takes_a_bandwidth_optimal_algorithm_for_large_messages():
    for transport in ("mpi", "socket", "local", "nccl"):
        # ring (either direction or both: with two ports, nccl's bidirectional ring), or
        # Rabenseifner (recursive_doubling at this size); never the tree's lg p·nβ
        rings = ("ring", "ring_bidirectional", "recursive_doubling")
        assert choose("all_reduce", 8, 64 * MIB, transport) in rings
        assert choose("all_gather", 8, 64 * MIB, transport) in rings
        # Bruck moves lg p/2 times the data: a pairwise or ring exchange wins
        assert choose("all_to_all", 8, 64 * MIB, transport) in ("ring", "ring_bidirectional")
        assert choose("broadcast", 8, 64 * MIB, transport) != "tree"


def test_auto_is_the_argmin_of_the_predictions():
    for size, nbytes in ((3, 100), (8, 4096), (13, 1 << 18), (16, 8 * MIB)):
        for collective in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            params = cost.load_params("mpi")
            times = {a: cost.estimate(collective, a, size, nbytes, params)
                     for a in capabilities()[collective]}
            name, seconds = cost.cheapest(collective, size, nbytes, "mpi")
            assert seconds == min(times.values()) and times[name] == seconds
            assert choose(collective, size, nbytes, "mpi") == name


def test_ties_break_by_name():
    # two ranks: ring and recursive doubling all_reduce are the same exchanges
    assert cost.cheapest("all_gather", 2, 1024, "mpi", ["ring", "recursive_doubling"])[0] == \
        cost.cheapest("all_gather", 2, 1024, "mpi", ["recursive_doubling", "ring"])[0]


GRID = [(c, p, n) for c in ("all_reduce", "all_gather", "broadcast", "all_to_all")
        for p in (2, 5, 8, 24) for n in (0, 4, 4096, 1 << 20)]
CHOICES_SCRIPT = """
import json
from collectives.algorithms import choose
grid = json.loads(input())
print(json.dumps([choose(c, p, n, "mpi") for c, p, n in grid]))
"""


def test_choice_is_a_pure_function_of_its_arguments():
    """Every rank must choose the same schedule: the same answers in a fresh interpreter
    with a different hash seed, and from threads racing on a cold cache."""
    here = [choose(c, p, n, "mpi") for c, p, n in GRID]
    env = dict(os.environ, PYTHONHASHSEED="12345")
    env.pop(cost.ENV_TUNING, None)
    out = subprocess.run([sys.executable, "-c", CHOICES_SCRIPT], input=json.dumps(GRID),
                         capture_output=True, text=True, env=env, timeout=60, check=True)
    assert json.loads(out.stdout) == here
    cost.clear_caches()
    from collectives import tuning
    tuning._ranked.cache_clear()
    results = [None] * 4

    def rank(r):
        results[r] = [choose(c, p, n, "mpi") for c, p, n in GRID]
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == here for r in results)


def test_debug_logs_each_choice_on_stderr():
    script = ("from collectives.algorithms import choose\n"
              "choose('all_reduce', 64, 8, 'mpi'); choose('all_reduce', 64, 8, 'mpi')\n")
    env = dict(os.environ, COLLECTIVES_DEBUG="INFO")
    env.pop(cost.ENV_TUNING, None)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    lines = [l for l in out.stderr.splitlines() if "auto: all_reduce" in l]
    assert len(lines) == 2, out.stderr                 # every call, cached or not
    assert "predicted" in lines[0] and "runner-up" in lines[0]


def test_debug_log_reaches_configured_handlers(monkeypatch, caplog):
    monkeypatch.setenv("COLLECTIVES_DEBUG", "DETAIL")
    with caplog.at_level(logging.INFO, logger="collectives"):
        name = choose("all_gather", 16, 65536, "nccl")
    message = [r.getMessage() for r in caplog.records if "auto: all_gather" in r.getMessage()]
    assert message and f"-> {name}" in message[0] and "others" in message[0]


# --- parameters: defaults, tuning file ----------------------------------------------------------

def test_defaults_per_transport():
    for transport in ("mpi", "socket", "local", "nccl"):
        assert cost.load_params(transport) == cost.DEFAULTS[transport]
    assert cost.load_params("something-new") == cost.DEFAULTS[cost.FALLBACK_TRANSPORT]
    # NCCL's launch latency dwarfs its per-byte cost; a host transport is the other way round
    assert cost.DEFAULTS["nccl"].alpha > cost.DEFAULTS["mpi"].alpha
    assert cost.DEFAULTS["nccl"].beta < cost.DEFAULTS["mpi"].beta


def test_save_and_load_the_tuning_file(tmp_path, monkeypatch):
    path = str(tmp_path / "tuning.json")
    mpi, nccl = Params(3e-6, 2e-10, 3e-10), Params(1e-5, 1e-11, 1e-12)
    cost.save_params(path, "mpi", mpi)
    cost.save_params(path, "nccl", nccl)
    cost.save_params(path, "mpi", mpi)                       # rewriting keeps the others
    assert set(json.load(open(path))) == {"mpi", "nccl"}
    assert cost.load_params("mpi") == cost.DEFAULTS["mpi"]   # no variable, no file
    monkeypatch.setenv(cost.ENV_TUNING, path)
    assert cost.load_params("mpi") == mpi and cost.load_params("nccl") == nccl
    assert cost.load_params("socket") == cost.DEFAULTS["socket"]   # not in the file
    # the file's parameters drive auto: make messages free and latency dear -> log p always
    cost.save_params(path, "local", Params(1.0, 0.0, 0.0))
    assert choose("all_reduce", 8, 64 * MIB, "local") in LOG_P
    (tmp_path / "bad.json").write_text("{not json")
    monkeypatch.setenv(cost.ENV_TUNING, str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="not valid JSON"):
        cost.load_params("mpi")
    (tmp_path / "neg.json").write_text('{"mpi": {"alpha": -1, "beta": 0, "gamma": 0}}')
    with pytest.raises(ValueError, match="alpha"):
        cost.load_params("mpi", str(tmp_path / "neg.json"))
    with pytest.raises(ValueError, match="cannot read"):
        cost.load_params("mpi", str(tmp_path / "missing.json"))


# --- calibration over a real transport ----------------------------------------------------------

@pytest.mark.parametrize("size", [1, 3])
def test_calibrate_gives_every_rank_the_same_fit(size):
    from collectives.group import ProcessGroup
    from collectives.transports.local import LocalWorld
    world = LocalWorld(size)
    results, errors = [None] * size, []

    def rank(r):
        try:
            group = ProcessGroup(world.transport(r), backend="local", timeout=30)
            results[r] = calibration.calibrate(group, repeats=3,
                                               pingpong_bytes=(8, 4096, 1 << 18),
                                               reduce_bytes=(1 << 16, 1 << 20))
        except BaseException as exc:        # surfaced below
            errors.append(exc)
            world.abort(repr(exc))
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(r == results[0] for r in results)
    fitted = results[0]
    assert fitted.gamma > 0 and fitted.alpha >= 0 and fitted.beta >= 0
    if size == 1:   # nobody to ping-pong with: α and β stay the defaults
        assert (fitted.alpha, fitted.beta) == (cost.DEFAULTS["local"].alpha,
                                               cost.DEFAULTS["local"].beta)


# --- terms beyond α-β-γ: ports, size-dependent β, shared memory bandwidth, local launches --------

def test_two_ports_run_two_peers_at_once_sharing_the_link():
    """Rank 0 sends 100 bytes to each of ranks 1 and 2 in one step: with two ports both run
    at once, each at no better than twice the link's per-byte cost."""
    data = Region("output", 0, 100)
    plans = [_plan(0, [Step(sends=(Send(1, data), Send(2, data)))]),
             _plan(1, [Step(recvs=(Recv(0, data),))]),
             _plan(2, [Step(recvs=(Recv(0, data),))])]
    one = Params(alpha=1.0, beta=0.01, gamma=0.0)
    two = Params(alpha=1.0, beta=0.01, gamma=0.0, ports=2)
    assert cost.replay(plans, 1, one) == pytest.approx(2 * (1.0 + 1.0))
    assert cost.replay(plans, 1, two) == pytest.approx(1.0 + 2 * 0.01 * 100)
    # a slow per-message rate (small messages) is the bound when it is above 2x the link's
    slow = Params(alpha=1.0, beta=0.01, gamma=0.0, ports=2, beta_small=0.05, beta_knee=1e9)
    assert cost.replay(plans, 1, slow) == pytest.approx(1.0 + slow.beta_at(100) * 100)
    # two messages to the same peer share that pair's link whatever the ports
    same = [_plan(0, [Step(sends=(Send(1, data), Send(1, data)))]),
            _plan(1, [Step(recvs=(Recv(0, data), Recv(0, data)))]), _plan(2, [])]
    assert cost.replay(same, 1, two) == pytest.approx(1.0 + 2 * 0.01 * 100)


def test_beta_moves_from_small_to_large_messages_halfway_at_the_knee():
    params = Params(alpha=0.0, beta=1.0, gamma=0.0, beta_small=3.0, beta_knee=1000)
    assert params.beta_at(0) == pytest.approx(3.0)
    assert params.beta_at(1000) == pytest.approx(2.0)
    assert params.beta_at(1e12) == pytest.approx(1.0, rel=1e-6)
    assert Params(1.0, 1.0, 0.0).beta_at(5) == 1.0            # no knee: flat


def test_reductions_past_the_cache_share_memory_bandwidth():
    """8 ranks at 64 MiB: Rabenseifner reduces a 32 MiB block first (past the 16 MiB knee:
    γ·8), the ring only 8 MiB blocks, so the ring wins reduce_scatter where they tie in the
    classic model (BENCHMARKS.md §1)."""
    base = Params(alpha=6e-6, beta=1e-10, gamma=8.5e-11)
    shared = Params(alpha=6e-6, beta=1e-10, gamma=8.5e-11, gamma_shared_bytes=16 * MIB)
    assert cost.cheapest("reduce_scatter", 8, 64 * MIB, candidates=["ring", "recursive_doubling"],
                       params=base)[0] == "recursive_doubling"
    assert cost.cheapest("reduce_scatter", 8, 64 * MIB, candidates=["ring", "recursive_doubling"],
                       params=shared)[0] == "ring"
    assert shared.gamma_at(8 * MIB, 8) == shared.gamma
    assert shared.gamma_at(32 * MIB, 8) == 8 * shared.gamma


def test_local_alpha_is_paid_per_local_operation():
    params = Params(alpha=0.0, beta=0.0, gamma=0.0, local_alpha=1.0)
    # ring all_reduce on 4 ranks: 3 reductions on each rank's critical path, no copies
    assert predict_bytes("all_reduce", "ring", 4, 4096, params) == pytest.approx(3.0)


def test_old_tuning_files_take_the_new_terms_from_the_defaults(tmp_path):
    path = tmp_path / "old.json"
    path.write_text('{"nccl": {"alpha": 1e-5, "beta": 1e-11, "gamma": 1e-12}}')
    got = cost.load_params("nccl", str(path))
    assert (got.alpha, got.beta, got.gamma) == (1e-5, 1e-11, 1e-12)
    assert got.ports == cost.DEFAULTS["nccl"].ports == 3
    assert got.link_beta == cost.DEFAULTS["nccl"].link_beta > 0
    assert got.local_alpha == cost.DEFAULTS["nccl"].local_alpha
    cost.save_params(str(path), "nccl", Params(1e-5, 1e-11, 1e-12, ports=2))
    assert cost.load_params("nccl", str(path)).ports == 2
    with pytest.raises(ValueError, match="ports"):
        Params(1.0, 1.0, 1.0, ports=0)


def test_bytes_past_the_spill_point_cost_the_factor():
    params = Params(alpha=0.0, beta=1.0, gamma=0.0, spill_bytes=100, spill_factor=3.0)
    assert params.beta_at(100) == 1.0                         # fits: flat β
    assert params.beta_at(400) * 400 == pytest.approx(100 + 3 * 300)
    # on top of β's knee: relative to β(m)
    knee = Params(alpha=0.0, beta=1.0, gamma=0.0, beta_small=3.0, beta_knee=1000,
                  spill_bytes=100, spill_factor=2.0)
    assert knee.beta_at(400) * 400 == pytest.approx((1 + 2 * 1000 / 1400) * (100 + 2 * 300))
    # p = 4: the ring's three 100-byte messages fit; recursive doubling's second (200) spills
    assert predict_bytes("all_gather", "ring", 4, 400, params, itemsize=1) == \
        pytest.approx(3 * 100)
    assert predict_bytes("all_gather", "recursive_doubling", 4, 400, params, itemsize=1) == \
        pytest.approx(100 + (100 + 3 * 100))


def test_socket_defaults_pick_the_measured_winners_on_four_ranks():
    """Two 4-rank socket runs (benchmarks/results/cost_model_fit/socket_4ranks_{32,64}core.json)
    agree: the ring beats recursive doubling at 16-64 MiB for reduce_scatter and all_gather (by
    1.25-1.64x; its messages stay below the 4 MiB TCP send buffer, recursive doubling's n/2
    ones spill) and loses to it at 4 KiB (fewer steps)."""
    socket = cost.DEFAULTS["socket"]
    pair = ["recursive_doubling", "ring"]
    for collective in ("reduce_scatter", "all_gather"):
        for nbytes in (16 * MIB, 64 * MIB):
            assert cost.cheapest(collective, 4, nbytes, "socket", pair)[0] == "ring", \
                (collective, nbytes)
            # among every registered schedule: a ring or direct (the third run, with direct:
            # cost_model_fit/socket_4ranks_64core_tcp.json, had direct best at 16 MiB)
            assert choose(collective, 4, nbytes, "socket") in ("ring", "ring_bidirectional",
                                                               "direct")
        assert cost.cheapest(collective, 4, 4096, "socket", pair)[0] == "recursive_doubling"
    # the spill term is what decides: with a flat β recursive doubling wins at 16 MiB
    flat = Params(socket.alpha, socket.beta, socket.gamma,
                  gamma_shared_bytes=socket.gamma_shared_bytes)
    assert cost.cheapest("reduce_scatter", 4, 16 * MIB, candidates=pair,
                       params=flat)[0] == "recursive_doubling"


def test_a_calibrated_socket_file_keeps_the_spill_term(tmp_path):
    """What ``calibrate`` + ``save_params`` write (α, β, γ replaced, shape terms kept), and a
    file written before the term existed (α, β, γ only), both load with the spill term."""
    path = str(tmp_path / "tuning.json")
    cost.save_params(path, "socket", replace(cost.DEFAULTS["socket"], alpha=4.2e-5,
                                             beta=5e-10, gamma=4.2e-10))
    assert "spill_bytes" not in json.load(open(path))["socket"]     # the default: not written
    (tmp_path / "old.json").write_text('{"socket": {"alpha": 4.2e-5, "beta": 5e-10, '
                                       '"gamma": 4.2e-10}}')
    assert cost.load_params("socket", str(tmp_path / "old.json")) == \
        cost.load_params("socket", path)
    got = cost.load_params("socket", path)
    assert (got.spill_bytes, got.spill_factor) == (4 * MIB, 2.0)
    assert cost.cheapest("all_gather", 4, 64 * MIB, candidates=["recursive_doubling", "ring"],
                       params=got)[0] == "ring"


def test_calibrate_refuses_a_group_whose_plans_run_on_another_medium():
    """An nccl group on peer memory ranks its schedules with the ``nccl_peer`` model; a
    ping-pong over NCCL send/recv measures the other medium, and its fit would replace those
    defaults in the tuning file with constants of the wrong medium: ``calibrate`` refuses,
    naming the operation, the rank and what to do, before anything moves."""
    from types import SimpleNamespace

    moved = []
    transport = SimpleNamespace(name="nccl", xp=None, isend=lambda *a: moved.append(a),
                                irecv=lambda *a: moved.append(a))
    group = SimpleNamespace(transport=transport, rank=1, size=2, next_tag=lambda: 0,
                            executor=SimpleNamespace(model_name="nccl_peer"))
    with pytest.raises(ValueError, match=r"calibrate on rank 1: this nccl group runs its "
                                         r"plans on another medium .*'nccl_peer'.*--tune"):
        calibration.calibrate(group)
    assert moved == []


def test_tune_saves_the_parameters_of_the_group_s_model(tmp_path, monkeypatch):
    """``--tune`` on an nccl group on peer memory saves the ``nccl_peer`` defaults beside its
    decisions (it saved NCCL send/recv's, α 20 µs a step, which the group then ranked its
    undecided sizes with); a group whose model is its transport's saves that one's."""
    from collectives.bench import cli

    monkeypatch.delenv("COLLECTIVES_TUNING", raising=False)
    saved = {}
    monkeypatch.setattr(cli.fit, "decisions_from_records", lambda rows, params, size: {})
    monkeypatch.setattr(cli.tuning, "save", lambda path, transport, params, decisions:
                        saved.update({transport: params}))
    cli.tune(str(tmp_path / "t.json"), [], "nccl", 4, "nccl_peer")
    assert saved["nccl"] == cost.DEFAULTS["nccl_peer"] != cost.DEFAULTS["nccl"]
    cli.tune(str(tmp_path / "t.json"), [], "nccl", 4)
    assert saved["nccl"] == cost.DEFAULTS["nccl"]
