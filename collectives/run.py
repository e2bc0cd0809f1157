"""The launcher: ``python -m collectives.run --nproc-per-node N script.py args...``.

torchrun's flags and environment: ``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``, ``--standalone`` (one node, loopback, a free port), and
``-m module`` in place of a script; and, as mpiexec's, ``--bind-to core`` (each worker on one
core of those the launcher may use). Each worker gets RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and COLLECTIVES_SECRET: yours if set,
else a fresh random secret per job on one node. With several nodes and no COLLECTIVES_SECRET
the launcher says so and every process uses this user's secret file (``collectives.auth``),
which works where the nodes share the home directory; otherwise set COLLECTIVES_SECRET,
identically, on every node.

Node 0's launcher runs the TCPStore server itself (it outlives any worker, and holds its port
from the start, so ``--standalone`` has no port race); workers connect to it as clients
(COLLECTIVES_USE_AGENT_STORE=1). Every output line is prefixed ``[rank N]:``. When a worker
fails, the launcher stops the others (SIGTERM, then SIGKILL after a grace period) and exits
with the code of the first worker that failed, naming it and, as consequences, the workers
that failed after it: a worker of the job that leaves with an error tells the launcher (through
the store it serves) before its peers can fail because of it, so a peer that ends sooner is
not blamed. SIGINT, SIGTERM or SIGHUP to the launcher go to every
worker, which is then stopped the same way; the launcher exits with 128 + the signal.

Each worker runs in a session of its own, and stopping a worker signals its process group:
processes a worker started (data loaders, say) go with it. A launcher that dies without
stopping them (SIGKILL, the OOM killer) still takes its workers along: on Linux each worker
gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG), and a small watchdog process started
by the launcher stops the workers' process groups (SIGTERM, SIGKILL after the grace period).
Limits: no elastic restarts (``--nnodes 1:4`` is refused).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

from . import settings
from .auth import SECRET_ENV, SecretFileError, job_secret, new_secret, secret_file_path

GRACE_SECONDS = 5.0
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                      if hasattr(signal, name))
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="collectives-run",
        description="Start N worker processes per node with torchrun's environment variables.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1",
                   help="workers on this node: an integer, or 'auto'/'cpu' for one per CPU core")
    p.add_argument("--nnodes", default="1", help="number of nodes (a fixed integer)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=0)
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default="127.0.0.1")
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=29500)
    p.add_argument("--standalone", action="store_true",
                   help="one node: loopback address and a free port chosen by the launcher")
    p.add_argument("-m", "--module", action="store_true",
                   help="run the target as a module (python -m)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run the target as an executable, not through python")
    p.add_argument("--bind-to", "--bind_to", dest="bind_to", choices=("none", "core"),
                   default="none",
                   help="core: each worker on one core of those this launcher may run on, "
                        "local rank i on the i-th (round robin where workers outnumber "
                        "them), as mpiexec --bind-to core; none (the default, as torchrun): "
                        "wherever the OS puts them")
    p.add_argument("target", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = p.parse_args(argv)

    if ns.nproc_per_node in ("auto", "cpu"):
        ns.nproc_per_node = os.cpu_count() or 1
    try:
        ns.nproc_per_node = int(ns.nproc_per_node)
    except ValueError:
        p.error(f"--nproc-per-node must be an integer or 'auto', got {ns.nproc_per_node!r}")
    try:
        ns.nnodes = int(ns.nnodes)
    except ValueError:
        p.error(f"--nnodes must be a fixed integer (elastic ranges are not supported), "
                f"got {ns.nnodes!r}")
    if ns.nproc_per_node < 1 or ns.nnodes < 1:
        p.error("--nproc-per-node and --nnodes must be >= 1")
    if not 0 <= ns.node_rank < ns.nnodes:
        p.error(f"--node-rank {ns.node_rank} is out of range for --nnodes {ns.nnodes}")
    if ns.standalone:
        if ns.nnodes != 1:
            p.error("--standalone means one node; drop --nnodes or --standalone")
        ns.master_addr, ns.master_port = "127.0.0.1", 0
    if ns.module and ns.no_python:
        p.error("-m and --no-python cannot be combined")
    return ns


def _pump(stream, sink, prefix: bytes):
    """Copy ``stream`` to ``sink`` line by line, each line prefixed; binary-safe."""
    for line in iter(stream.readline, b""):
        sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
        sink.flush()
    stream.close()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode      # killed by signal N -> 128+N


def launch(ns) -> int:
    world_size = ns.nproc_per_node * ns.nnodes
    try:
        secret = _job_secret(ns.nnodes)
    except SecretFileError as exc:
        sys.stderr.write(f"collectives.run: {exc}\n")
        return 2
    store, port = _serve_store(ns, world_size, secret)
    command = _command(ns)

    workers = []
    pumps = []
    received = []                      # signals sent to the launcher: stop the job

    def on_signal(signum, _frame):
        received.append(signum)        # the main loop stops the workers

    # Before the first worker starts: a signal from then on must stop them, not the launcher.
    # A signal ignored already (nohup, a background job) stays ignored.
    old = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS
           if signal.getsignal(s) is not signal.SIG_IGN}
    watchdog = _Watchdog.start()
    _start_workers(ns, command, world_size, port, secret, watchdog, workers, pumps)
    try:
        failed, on_their_own = _supervise(workers, store, watchdog, received)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if watchdog is not None:
            watchdog.release()
        for t in pumps:
            t.join(2.0)
        if store is not None:
            store.close()
    return _conclude(received, failed, on_their_own)


def _job_secret(nnodes: int):
    """The job's secret: COLLECTIVES_SECRET if set, else on one node a fresh one for this job
    alone. Several nodes: None, since a secret made here could not reach the other nodes'
    launchers, so every process falls back to the per-user secret file; it is checked now
    (SecretFileError) and the launcher says loudly that the nodes must share it."""
    secret = settings.SECRET()
    if secret:
        return secret
    if nnodes == 1:
        return new_secret()
    job_secret()
    sys.stderr.write(f"collectives.run: --nnodes {nnodes} without {SECRET_ENV}: every "
                     f"process authenticates with the per-user secret file "
                     f"{secret_file_path()}, so the job works only if every node has the "
                     f"same file (a shared home directory). Otherwise set {SECRET_ENV} to "
                     f"one value on every node, e.g. $(python -c 'import secrets; "
                     f"print(secrets.token_hex(32))')\n")
    return None


def _serve_store(ns, world_size: int, secret):
    """(the store this launcher serves or None, the port workers connect to): node 0's
    launcher runs the TCPStore server; the others' workers connect to node 0's."""
    if ns.node_rank != 0:
        return None, ns.master_port
    from .store import TCPStore
    # Listen on the master address's interface only (loopback for --standalone).
    store = TCPStore(ns.master_addr, ns.master_port, world_size, is_master=True,
                     wait_for_workers=False, secret=secret)
    return store, store.port


def _command(ns) -> list:
    """What each worker runs: the script, ``-m`` module or (``--no-python``) program, with
    its arguments."""
    if ns.no_python:
        command = [ns.target]
    elif ns.module:
        command = [sys.executable, "-u", "-m", ns.target]
    else:
        command = [sys.executable, "-u", ns.target]
    return command + ns.args


def _worker_env(ns, rank: int, local_rank: int, world_size: int, port: int, secret) -> dict:
    """A worker's environment: the launcher's, with torchrun's variables and the secret."""
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(ns.nproc_per_node), GROUP_RANK=str(ns.node_rank),
               ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world_size),
               MASTER_ADDR=ns.master_addr, MASTER_PORT=str(port),
               PYTHONUNBUFFERED="1", **({SECRET_ENV: secret} if secret else {}))
    env[settings.USE_AGENT_STORE.name] = "1"     # node 0's launcher runs the store
    return env


def _start_workers(ns, command, world_size, port, secret, watchdog, workers, pumps) -> None:
    """This node's workers, appended to ``workers`` as (rank, local rank, process), each
    with two threads in ``pumps`` copying its output, prefixed with its rank."""
    cores = sorted(os.sched_getaffinity(0)) if ns.bind_to == "core" else None
    _adopt_orphans()
    for local_rank in range(ns.nproc_per_node):
        setup = _worker_setup(None if cores is None else cores[local_rank % len(cores)])
        rank = ns.node_rank * ns.nproc_per_node + local_rank
        env = _worker_env(ns, rank, local_rank, world_size, port, secret)
        proc = _start_worker(command, env, setup, workers, watchdog)
        prefix = f"[rank {rank}]:".encode()
        for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            t = threading.Thread(target=_pump, args=(stream, sink, prefix), daemon=True)
            t.start()
            pumps.append(t)
        workers.append((rank, local_rank, proc))


def _supervise(workers, store, watchdog, received):
    """Wait until a worker fails, every worker has ended or the launcher got a signal, then
    stop what is left; (the first failure or None, {rank: exit code} of the workers that
    ended unstopped)."""
    failed = None
    ended = []                         # workers in the order their exits were seen
    try:
        while not received:
            _reap_orphans(workers, watchdog)
            _note_exits(workers, ended)
            if any(proc.returncode for _, _, proc in ended) or len(ended) == len(workers):
                break
            time.sleep(0.05)
        if not received and any(proc.returncode for _, _, proc in ended):
            failed = _first_failure(workers, ended, store, received)
        on_their_own = {rank: proc.returncode for rank, _, proc in workers
                        if proc.poll() is not None}
        # A received signal goes to every worker first (SIGINT: a KeyboardInterrupt). On
        # success this only stops what workers left behind in their process groups.
        _stop(workers, received[0] if received else signal.SIGTERM, received)
    except BaseException:              # a bug in the loop: no worker may outlive the launcher
        _stop(workers, signal.SIGTERM, received)
        raise
    return failed, on_their_own


def _conclude(received, failed, on_their_own) -> int:
    """The launcher's exit code, with what it says about why."""
    if received:
        name = signal.Signals(received[0]).name
        sys.stderr.write(f"collectives.run: received {name}; stopped the workers\n")
        sys.stderr.flush()
        return 128 + received[0]
    if failed is None:
        return 0
    rank, local_rank, proc, code = failed
    report = (f"collectives.run: worker rank {rank} (local rank {local_rank}, pid {proc.pid}) "
              f"{_how(code)}, the first to fail; stopped the other workers\n")
    after = [f"worker rank {r} {_how(c)}" for r, c in sorted(on_their_own.items())
             if c and r != rank]
    if after:
        report += (f"collectives.run: after it, {', '.join(after)} (consequences of that "
                   f"failure)\n")
    sys.stderr.write(report)
    sys.stderr.flush()
    return _exit_code(code)


def _how(code: int) -> str:
    return (f"was killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
            else f"exited with code {code}")


def _note_exits(workers, ended) -> None:
    """Append to ``ended`` the workers seen exited since the last look."""
    for worker in workers:
        if worker[2].poll() is not None and worker not in ended:
            ended.append(worker)


# Workers of the job tell the launcher that they are leaving with a failing exit status before
# they abort their transport (facade/setup.py): a peer that fails because of that abort (or of
# anything else the leaving rank did) tells it later. Numbered by one counter in the job's
# store, which the launcher serves, so the launcher knows who failed first even when the
# consequences end first (a leaving rank may still be closing its connections).
_LEAVING = "collectives.run/leaving"


def tell_launcher(store, rank: int, code: int) -> None:
    """Say, in the store of ``collectives.run``, that this worker leaves with ``code``."""
    order = store.add(_LEAVING, 1)
    store.set(f"{_LEAVING}/{rank}", f"{order} {code}")


def _told(store, workers) -> dict:
    """rank -> (order, code) of the workers that said they were leaving with a failure."""
    told = {}
    for rank, _, _ in workers:
        key = f"{_LEAVING}/{rank}"
        if store.check([key]):
            order, code = store.get(key).decode().split()
            told[rank] = (int(order), int(code))
    return told


def _first_failure(workers, ended, store, received):
    """(rank, local rank, proc, exit code) of the worker that failed first. A worker that
    failed without telling (killed by a signal, gone by os._exit, or one that never joined
    the job's process group) failed before any consequence could tell: the first such exit
    seen. Otherwise the first to tell, whose exit is awaited (up to GRACE_SECONDS: it may
    still be closing its connections) for its real exit code."""
    try:
        told = _told(store, workers) if store is not None else {}
    except Exception:                  # the store is the launcher's: never seen to fail
        told = {}
    _note_exits(workers, ended)        # an abrupt death shows before what it caused is said
    silent = [w for w in ended if w[2].returncode and w[0] not in told]
    if silent or not told:
        rank, local_rank, proc = (silent or [w for w in ended if w[2].returncode])[0]
        return rank, local_rank, proc, proc.returncode
    by_rank = {w[0]: w for w in workers}
    for rank in sorted(told, key=lambda r: told[r][0]):
        rank, local_rank, proc = by_rank[rank]
        deadline = time.monotonic() + GRACE_SECONDS
        while proc.poll() is None and time.monotonic() < deadline and not received:
            time.sleep(0.02)
        code = proc.returncode if proc.returncode is not None else told[rank][1]
        if code:
            return rank, local_rank, proc, code
    rank, local_rank, proc = next(w for w in ended if w[2].returncode)
    return rank, local_rank, proc, proc.returncode


def _start_worker(command, env, setup, workers, watchdog):
    """One worker (see _worker_setup), known to the watchdog; one that cannot start stops
    those started before it."""
    try:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=setup)
    except BaseException:
        _stop(workers)
        raise
    if watchdog is not None:
        watchdog.watch(proc.pid)
    return proc


def _signal_group(pgid: int, signum) -> bool:
    """Send ``signum`` to a worker's process group; False when nothing of it is left."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _stop(workers, first=signal.SIGTERM, received=()):
    """Stop every worker with everything it started: ``first`` to each worker's process group,
    SIGKILL to the groups still alive after GRACE_SECONDS, or at once when another signal
    reaches the launcher meanwhile (a second Ctrl-C)."""
    for _, _, proc in workers:
        proc.poll()                    # reap the finished: a zombie still counts in its group
    alive = [proc.pid for _, _, proc in workers if _signal_group(proc.pid, first)]
    seen = len(received)
    deadline = time.monotonic() + GRACE_SECONDS
    while alive and time.monotonic() < deadline and len(received) == seen:
        time.sleep(0.02)
        _reap_orphans(workers)
        alive = [pgid for pgid in alive if _signal_group(pgid, 0)]
    for pgid in alive:
        _signal_group(pgid, signal.SIGKILL)
    for _, _, proc in workers:
        proc.wait()


def _adopt_orphans():
    """On Linux, make the launcher the parent of its workers' orphaned children (a child
    subreaper), so that it can reap them: a zombie still counts as a member of its process
    group, and where init does not reap (a container whose first process is not an init),
    stopping a worker's group would otherwise wait out the whole grace period."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphans(workers, watchdog=None):
    """Reap every child of the launcher that has exited: workers and the watchdog through
    their Popen (which keeps the exit code), adopted orphans directly."""
    own = {proc.pid: proc for _, _, proc in workers}
    if watchdog is not None:
        own[watchdog.proc.pid] = watchdog.proc
    if not hasattr(os, "waitid"):          # no peeking (macOS): the workers' own Popen only
        for proc in own.values():
            proc.poll()
        return
    while True:
        try:   # WNOWAIT: look first, so a worker's exit code stays for its Popen
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None:
            return
        if found.si_pid in own:
            own.pop(found.si_pid).poll()
        else:
            try:
                os.waitpid(found.si_pid, 0)
            except ChildProcessError:
                pass


def _prctl():
    """libc's prctl, or None off Linux (or where ctypes cannot find it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _worker_setup(core=None):
    """What each worker runs between fork and exec. A session, and so a process group, of its
    own: stopping the group stops what the worker starts, and unlike a group alone in the
    terminal's session it may still read the terminal (a debugger) without SIGTTIN stopping
    it. On Linux, SIGTERM when the launcher dies, however it dies; the signal is tied to the
    thread that forks, and workers are started from the main thread, which lives as long as
    the launcher. A launcher that died before prctl took effect sent nothing: the worker sees
    it has a new parent and leaves at once. ``core`` (``--bind-to core``): the one CPU the
    worker and everything it starts may run on, set before it executes anything. As little
    as possible runs here: the launcher has threads (the store server, the output pumps)
    whose locks the child may inherit taken."""
    launcher = os.getpid()
    prctl = _prctl()
    death_signal = int(signal.SIGTERM)

    def setup():
        os.setsid()
        if core is not None:
            os.sched_setaffinity(0, (core,))
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
            if os.getppid() != launcher:
                os._exit(1)
    return setup


# The watchdog: a process of its own session (a signal to the launcher's process group or
# terminal does not reach it) that reads the workers' process group ids from a pipe whose
# write end only the launcher holds. End of file without "done" means the launcher died
# without stopping its workers: SIGTERM to their groups (what the parent-death signal does
# not reach: the workers' own children), SIGKILL to what is left after the grace period.
_WATCHDOG = r"""
import os, signal, sys, time
fd, grace, launcher = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
groups, pending = [], b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except InterruptedError:
        continue
    if not chunk:
        break
    pending += chunk
    *lines, pending = pending.split(b"\n")
    for line in lines:
        if line == b"done":
            sys.exit(0)
        groups.append(int(line))

def signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True

alive = [g for g in groups if signal_group(g, signal.SIGTERM)]
if alive:
    sys.stderr.write(f"collectives.run: the launcher (pid {launcher}) died; stopping its "
                     f"workers (process groups {', '.join(map(str, alive))})\n")
    sys.stderr.flush()
deadline = time.monotonic() + grace
while alive and time.monotonic() < deadline:
    time.sleep(0.05)
    alive = [g for g in alive if signal_group(g, 0)]
for g in alive:
    signal_group(g, signal.SIGKILL)
"""


class _Watchdog:
    """The launcher's side of the watchdog (see _WATCHDOG)."""

    def __init__(self, proc, fd):
        self.proc, self.fd = proc, fd

    @classmethod
    def start(cls):
        """A running watchdog, or None where it cannot start (the workers still get the
        parent-death signal; only their children lose their guard)."""
        if not hasattr(os, "killpg"):
            return None
        read_end, write_end = os.pipe()      # not inherited: only the launcher can write
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(read_end), str(GRACE_SECONDS),
                 str(os.getpid())],
                pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:
            os.close(write_end)
            sys.stderr.write(f"collectives.run: no watchdog for the workers' children "
                             f"({exc})\n")
            return None
        finally:
            os.close(read_end)
        return cls(proc, write_end)

    def watch(self, pgid: int) -> None:
        self._write(f"{pgid}\n".encode())

    def release(self) -> None:
        """The workers are stopped: the watchdog leaves without touching anything."""
        self._write(b"done\n")
        os.close(self.fd)
        try:
            self.proc.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _write(self, data: bytes) -> None:
        try:
            os.write(self.fd, data)
        except OSError:                  # the watchdog died: the workers keep their own guard
            pass


def main(argv=None) -> None:
    sys.exit(launch(parse_args(argv)))


if __name__ == "__main__":
    main()
