"""GPU benchmark of the NCCL transport (see ``collectives.bench.nccl``); also reachable as
``benchmarks/bench.py --backend nccl``.

    mpiexec -n 4 python benchmarks/bench_nccl.py [--sizes 1M,16M] [--segments 64M] [--probe 1M:1G]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from collectives.bench.nccl import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
