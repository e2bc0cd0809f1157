"""Benchmark ring / tree / recursive doubling against the transport's native collectives.

    mpiexec -n 8 python benchmarks/bench.py [--sizes 4K:16M] [--json out.json] [--plot out.png]
    python benchmarks/bench.py --backend local --world-size 4

A thin CLI over ``collectives.bench`` (also ``python -m collectives.bench``); ``--help``
lists every flag. Exits non-zero when any result is wrong.
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
