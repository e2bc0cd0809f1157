"""What every reliability job imports: ``report(**fields)`` prints one ``RESULT <json>``
line (the tests' ``reliability_jobs.parse`` reads them back), ``failure(exc)`` the fields
that describe an error, ``rss_mib()`` this process's resident memory."""
import json
import os
import sys
import time


def report(**fields):
    # one write(2) per line, so lines of ranks sharing mpiexec's stdout never interleave
    sys.stdout.flush()
    os.write(1, ("RESULT " + json.dumps(fields) + "\n").encode())


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def failure(exc):
    return {"type": type(exc).__name__, "message": str(exc), "at": time.time()}
