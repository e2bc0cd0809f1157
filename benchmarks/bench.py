"""Benchmark ring / tree / recursive doubling against the transport's native collectives.

    mpiexec -n 8 python benchmarks/bench.py [--sizes 4K:16M] [--json out.json] [--plot out.png]
    python benchmarks/bench.py --backend local --world-size 4

A thin CLI over ``collectives.bench`` (also ``python -m collectives.bench``); ``--help``
lists every flag. Exits non-zero when any result is wrong.

Install the checkout editable (``pip install -e ".[mpi]"``): this script imports an installed
``collectives`` first, but ``python -m collectives.bench`` or a script in the checkout's root
imports the checkout's, and only an editable install builds the compiled MPI executor there.
The header names the executor that runs and, if it is the Python one, why.
"""
import os
import sys

try:
    from collectives.bench import main
except ImportError:      # run from a source checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from collectives.bench import main

if __name__ == "__main__":
    sys.exit(main())
