# bench.py with pipelined_reduce_scatter's pusher quarters set (VARIANT=q)
import os, runpy, sys
sys.path.insert(0, os.getcwd())
from collectives.executors import peer
if os.environ.get("VARIANT"):
    peer.pipeline_pushers = lambda world, q=int(os.environ["VARIANT"]): q
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
