"""Two ranks all_reduce ones with a relay (``relay.py``) between them; each prints one JSON
line: its result, or the error it raised.

    relay_job.py torch    under torchrun, torch.distributed on the "collectives" backend
    relay_job.py facade   under collectives.run, ``import collectives as dist``

Rank 1 reads rank 0's address only once the relay has put its own there, so it dials the
relay.
"""
import json
import os
import sys
from datetime import timedelta

import torch

mode, rank = sys.argv[1], int(os.environ["RANK"])
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if mode == "torch":
    import torch.distributed as dist
    import collectives.c10d  # noqa: F401  (registers the backend)
    if rank == 1:
        dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60)).wait(
            ["relay/ready"])
    dist.init_process_group("collectives", timeout=timedelta(seconds=30))
else:
    import collectives as dist
    from collectives.transports.socket import bootstrap
    if rank == 1:
        # our init meets every rank in the store before the transport connects, so rank 1
        # cannot wait before it: it waits only to read rank 0's address
        read = bootstrap.store_get

        def read_after_the_relay(store, key, timeout):
            if key.endswith("/addr/0"):
                read(store, "relay/ready", timeout)
            return read(store, key, timeout)
        bootstrap.store_get = read_after_the_relay
    dist.init_process_group(timeout=30)
t = torch.ones(4)
try:
    dist.all_reduce(t)
    print(json.dumps({"rank": rank, "result": t.tolist()}), flush=True)
except Exception as exc:           # the point: which error, on which rank
    print(json.dumps({"rank": rank, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
os._exit(0)                        # a failed transport has nothing to say goodbye with
