"""Calibration: measuring and fitting a transport's α, β, γ on this machine (a tool, never on
the run-time path: ``bench.py --calibrate FILE`` runs it and stores the result with
``tuning_file.save_params``; groups read the file). The shape terms keep the transport's
defaults or what the tuning file says: they were fitted offline from bench runs
(``benchmarks/fit_model.py``; ``benchmarks/model_check.py`` replays a bench JSON through the
model and shows what ``auto`` would pick). The ping-pong measures the ping-pong's α, not the
per-step cost inside a collective (for sockets that is larger: two thread hand-offs per
message through the progress thread, ``params.DEFAULTS``)."""
from __future__ import annotations

import time
from dataclasses import replace
from statistics import median

from .algorithms.params import Params
from .tuning_file import load_params

def _weighted_line(points, relative=True):
    """Least squares of t = c + k·n; c, k >= 0. ``relative`` minimizes relative residuals
    (each row divided by its t), so microsecond latencies are not drowned by millisecond
    transfers; otherwise plain residuals, so the largest sizes set the slope."""
    import numpy as np
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    if np.any(t <= 0) or np.any(n < 0) or not np.all(np.isfinite(t)):
        raise ValueError("cost model fit: timings must be positive and finite, sizes >= 0")
    w = 1.0 / t if relative else np.full_like(t, 1.0 / np.mean(t))
    if len(set(n.tolist())) >= 2:
        design = np.stack([w, n * w], axis=1)
        (c, k), *_ = np.linalg.lstsq(design, t * w, rcond=None)
        if c >= 0 and k >= 0:
            return float(c), float(k)
    # one size only, or a negative coefficient: clip it to zero and refit the other alone
    k_only = float(np.sum(n * t * w * w) / np.sum((n * w) ** 2)) if np.any(n > 0) else 0.0
    c_only = float(np.sum(t * w * w) / np.sum(w * w))
    def misfit(c, k):
        return float(np.sum(((c + k * n - t) * w) ** 2))
    return (0.0, k_only) if misfit(0.0, k_only) <= misfit(c_only, 0.0) else (c_only, 0.0)


def fit(pingpong, reductions, default: Params | None = None) -> Params:
    """Parameters from timings. ``pingpong``: [(nbytes, one-way seconds)] (half round trips),
    fitted as α + β·n on relative residuals; ``reductions``: [(nbytes of one operand,
    seconds)] of dst = a op b, fitted as c + γ·n on plain residuals, so that the large
    reductions out of cache, where γ matters, set it (c, the call overhead, is dropped).
    A list that is empty takes its parameters from ``default`` (ValueError without one)."""
    pingpong, reductions = list(pingpong), list(reductions)
    if (not pingpong or not reductions) and default is None:
        raise ValueError("cost model fit: need ping-pong and reduction timings, or defaults")
    alpha, beta = _weighted_line(pingpong) if pingpong else (default.alpha, default.beta)
    gamma = _weighted_line(reductions, relative=False)[1] if reductions else default.gamma
    # the shape terms (ports, β's knee, shared memory bandwidth, local launches) are not
    # measured here: they stay the default's
    return replace(default, alpha=alpha, beta=beta, gamma=gamma) if default is not None \
        else Params(alpha, beta, gamma)


PINGPONG_BYTES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20)
# Reductions from 256 KiB up: smaller ones run from cache and would make γ look faster than
# the large blocks where γ matters.
REDUCE_BYTES = (256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def _synchronize(xp):
    cuda = getattr(xp, "cuda", None)
    if cuda is not None:          # cupy: time the kernels, not their launches
        cuda.Device().synchronize()


def calibrate(group, *, repeats: int = 15, pingpong_bytes=PINGPONG_BYTES,
              reduce_bytes=REDUCE_BYTES, timeout: float = 60.0) -> Params:
    """Measure and fit this transport's parameters; a collective call (every rank of
    ``group`` must call it). Ranks 0 and 1 ping-pong over the group's transport (median of
    ``repeats`` round trips per size, halved), rank 0 times float32 SUM reductions with the
    executors' kernel, fits, and sends the result to every rank, so all ranks return the
    same Params. A group of one rank measures γ only; α and β stay the transport's defaults."""
    import numpy as np

    from .kernels.reduce import reducer
    from .ops import ReduceOp

    transport, rank, size = group.transport, group.rank, group.size
    model = group.executor.model_name
    if model != transport.name:         # alike on every rank: decided when the group was made
        raise ValueError(
            f"calibrate on rank {rank}: this {transport.name} group runs its plans on another "
            f"medium than {transport.name} send/recv (the cost model {model!r}), which a "
            f"ping-pong over send/recv does not measure, and its fit would replace that "
            f"model's defaults in the tuning file; leave out --calibrate (--tune alone records "
            f"the measured winners), or set COLLECTIVES_GPU_PATH=nccl to run and calibrate on "
            f"send/recv")
    xp = transport.xp
    tag = group.next_tag()
    default = load_params(transport.name)
    pingpong, reductions = [], []

    def exchange(requests):
        transport.wait_all(requests, timeout)

    if size > 1 and rank in (0, 1):
        peer = 1 - rank
        for nbytes in pingpong_bytes:
            buf = xp.zeros(nbytes, dtype=xp.uint8)
            trips = []
            for trip in range(repeats + 2):           # two warm-up trips
                _synchronize(xp)
                start = time.perf_counter()
                if rank == 0:
                    exchange([transport.isend(buf, peer, tag)])
                    exchange([transport.irecv(buf, peer, tag)])
                else:
                    exchange([transport.irecv(buf, peer, tag)])
                    exchange([transport.isend(buf, peer, tag)])
                _synchronize(xp)
                if trip >= 2:
                    trips.append(time.perf_counter() - start)
            pingpong.append((nbytes, median(trips) / 2))
    if rank == 0:
        add = reducer(ReduceOp.SUM, np.float32)
        for nbytes in reduce_bytes:
            a = xp.ones(nbytes // 4, dtype=xp.float32)
            b = xp.ones(nbytes // 4, dtype=xp.float32)
            times = []
            for trial in range(repeats + 1):
                _synchronize(xp)
                start = time.perf_counter()
                add(a, a, b)
                _synchronize(xp)
                if trial:
                    times.append(time.perf_counter() - start)
            reductions.append((nbytes, median(times)))
        fitted = fit(pingpong, reductions, default)
        values = xp.asarray(np.array([fitted.alpha, fitted.beta, fitted.gamma]))
        exchange([transport.isend(values, peer, tag) for peer in range(1, size)])
        return fitted
    values = xp.zeros(3, dtype=xp.float64)
    exchange([transport.irecv(values, 0, tag)])
    host = values.get() if hasattr(values, "get") else values
    alpha, beta, gamma = (float(v) for v in host)
    return replace(default, alpha=alpha, beta=beta, gamma=gamma)
