"""benchmarks/bench.py with the pipelined kernel's pushers set to PUSHERS quarters of its
thread blocks (a probe; the executor's PIPELINE_PUSHERS is a module constant)."""
import os
import runpy
import sys

sys.path.insert(0, os.getcwd())
import collectives.executors.peer as peer  # noqa: E402

peer.PIPELINE_PUSHERS = int(os.environ.get("PUSHERS", "2"))
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
