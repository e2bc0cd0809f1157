"""The CPU model of the peer-memory protocol now lives in the package, as the pushed-form
simulator: ``collectives/algorithms/pushed_sim.py``. This module keeps the old import path."""
from collectives.algorithms.pushed_sim import (  # noqa: F401 (re-exported)
    PIPELINED, CalledOtherwise, Group, InPlace, Stuck, verify)
