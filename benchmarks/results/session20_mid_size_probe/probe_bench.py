"""benchmarks/bench.py with the pipelined kernel's module constants set from the environment
(a probe): PUSHERS (quarters of the thread blocks that push) and CHUNK (bytes of a chunk)."""
import os
import runpy
import sys

sys.path.insert(0, os.getcwd())
import collectives.executors.peer as peer  # noqa: E402

peer.PIPELINE_PUSHERS = int(os.environ.get("PUSHERS", peer.PIPELINE_PUSHERS))
peer.PIPELINE_CHUNK_BYTES = int(os.environ.get("CHUNK", peer.PIPELINE_CHUNK_BYTES))
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
