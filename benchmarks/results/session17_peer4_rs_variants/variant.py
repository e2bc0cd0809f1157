# bench.py with pipelined_reduce_scatter's chunk bytes and pusher quarters set (VARIANT=c,q)
import os, runpy, sys
sys.path.insert(0, os.getcwd())
from collectives.executors import peer
if os.environ.get("VARIANT"):
    chunk, quarters = os.environ["VARIANT"].split(",")
    peer.PIPELINE_CHUNK_BYTES, peer.PIPELINE_PUSHERS = int(chunk) << 20, int(quarters)
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
