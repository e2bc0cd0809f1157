"""The job secret with no configuration: a per-user secret file that only this user can read,
so ranks on one host authenticate each other by default, and a process of another user that
knows host:port can neither join the store nor read the secret. Also: the file's creation
(fresh home, concurrent first use) and refusal (symlink, another owner, loose modes), the
loud warning for a remote master without $COLLECTIVES_SECRET, and failure messages that name
the fix."""
import multiprocessing
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings

import pytest

from collectives import auth
from collectives import rendezvous as rendezvous_module
from collectives.auth import AuthenticationError, client_handshake, job_secret
from collectives.store import StoreError, TCPStore

from repo import ROOT
CTX = multiprocessing.get_context("fork")
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def fresh_home(monkeypatch):
    """A home directory with no ~/.config, that every user may traverse (like /home/alice),
    so what keeps others out is the secret file's own directory and mode."""
    home = tempfile.mkdtemp(prefix="collectives-home-")
    os.chmod(home, 0o755)
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    yield home
    subprocess.run(["rm", "-rf", home], check=False)


def _secret_path(home):
    return os.path.join(home, ".config", "collectives", "secret")


def test_fresh_home_gets_a_private_secret_file(fresh_home):
    assert not os.path.exists(os.path.join(fresh_home, ".config"))
    first = job_secret()
    assert len(first) >= 32 and job_secret() == first
    path = _secret_path(fresh_home)
    st, dst = os.lstat(path), os.stat(os.path.dirname(path))
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(dst.st_mode) == 0o700
    assert st.st_uid == dst.st_uid == os.geteuid()


def test_env_secret_wins_and_empty_means_unset(fresh_home, monkeypatch):
    monkeypatch.setenv(auth.SECRET_ENV, "from-the-environment")
    assert job_secret() == b"from-the-environment"
    assert job_secret("an-explicit-secret") == b"an-explicit-secret"
    assert not os.path.exists(_secret_path(fresh_home))
    monkeypatch.setenv(auth.SECRET_ENV, "")
    assert job_secret() == job_secret("") and len(job_secret()) >= 32


def _read_secret(queue):
    try:
        queue.put(job_secret())
    except BaseException as exc:                  # report, never hang the parent
        queue.put(repr(exc))
    queue.close()
    queue.join_thread()
    os._exit(0)


def test_concurrent_first_use_agrees(fresh_home):
    queue = CTX.Queue()
    procs = [CTX.Process(target=_read_secret, args=(queue,)) for _ in range(6)]
    for p in procs:
        p.start()
    got = {queue.get(timeout=30) for _ in procs}
    for p in procs:
        p.join(10)
    assert len(got) == 1 and got == {job_secret()} and len(job_secret()) >= 32


def test_unsafe_secret_files_are_refused(fresh_home):
    path = _secret_path(fresh_home)
    job_secret()                                       # creates it
    os.chmod(path, 0o644)
    with pytest.raises(auth.SecretFileError, match="readable by group or others"):
        job_secret()
    os.unlink(path)
    target = os.path.join(fresh_home, "elsewhere")
    with open(target, "w") as f:
        f.write("x" * 64)
    os.chmod(target, 0o600)
    os.symlink(target, path)
    with pytest.raises(auth.SecretFileError, match="symbolic link") as info:
        job_secret()
    assert path in str(info.value)
    os.unlink(path)
    os.chmod(os.path.dirname(path), 0o777)
    with pytest.raises(auth.SecretFileError, match="directory"):
        job_secret()
    os.chmod(os.path.dirname(path), 0o700)
    if IS_ROOT:
        job_secret()
        os.chown(path, NOBODY, NOBODY)
        with pytest.raises(auth.SecretFileError, match=f"owned by uid {NOBODY}"):
            job_secret()


def test_wrong_secret_failure_names_the_fix(fresh_home):
    server = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=5)
    try:
        with pytest.raises(StoreError) as info:
            TCPStore("127.0.0.1", server.port, timeout=3, secret="another host's secret")
        text = str(info.value)
        assert auth.SECRET_ENV in text and _secret_path(fresh_home) in text
    finally:
        server.close()


class _NoStore:
    def __init__(self, host, port, *args, **kwargs):
        self.host, self.port = host, port


def test_remote_master_without_secret_warns_once(fresh_home, monkeypatch):
    monkeypatch.setattr(rendezvous_module, "TCPStore", _NoStore)
    monkeypatch.setattr(auth, "_warned_remote", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # loopback and our own name: no warning
        rendezvous_module.rendezvous("tcp://127.0.0.1:29500", 1, 2)
        rendezvous_module.rendezvous(f"tcp://{socket.gethostname()}:29500", 1, 2)
    with pytest.warns(RuntimeWarning) as record:
        rendezvous_module.rendezvous("tcp://192.0.2.7:29500", 1, 2)      # TEST-NET-1: not ours
    text = str(record[0].message)
    assert auth.SECRET_ENV in text and _secret_path(fresh_home) in text and "192.0.2.7" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # once per process
        rendezvous_module.rendezvous("tcp://192.0.2.7:29500", 1, 2)
    monkeypatch.setattr(auth, "_warned_remote", False)
    monkeypatch.setenv(auth.SECRET_ENV, "set-everywhere")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rendezvous_module.rendezvous("tcp://192.0.2.7:29500", 1, 2)


# -- another user on the same host -----------------------------------------------------------

RANK_SCRIPT = """
    import sys
    import numpy as np
    import collectives as dist
    from collectives.rendezvous import rendezvous

    store, rank, size = rendezvous("env://")        # what init_process_group() does first
    print("ready", flush=True)
    sys.stdin.readline()                 # the test plays the intruder meanwhile
    dist.init_process_group(store=store, rank=rank, world_size=size)
    data = np.full(4, rank + 1.0)
    dist.all_reduce(data)
    objects = [None, None]
    dist.all_gather_object(objects, {"rank": rank})
    print("done", float(data[0]), objects, flush=True)
    sys.stdin.readline()                 # the test looks into the store meanwhile
    dist.destroy_process_group()
"""


def _intruder(port, secret_path, queue):
    """Another user who knows host:port: every way in must fail."""
    report = {}
    try:
        # Nobody cannot read root's Python install: load lazily imported modules first.
        "127.0.0.1".encode("idna")
        socket.getaddrinfo("127.0.0.1", port)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        try:
            with open(secret_path, "rb") as f:
                report["read_secret"] = f.read()
        except OSError as exc:
            report["read_secret"] = type(exc).__name__
        # The key a store without a secret used to have (empty), and a guess.
        for name, key in (("empty_key", b""), ("guessed_key", b"a-guessed-secret-value")):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.settimeout(5)
                    client_handshake(sock, key, "collectives-store")
                report[name] = "joined"
            except (AuthenticationError, OSError) as exc:
                report[name] = type(exc).__name__
        try:
            TCPStore("127.0.0.1", port, timeout=3,
                     secret="a-guessed-secret-value").get("collectives/socket/1")
            report["store"] = "joined"
        except StoreError as exc:
            report["store"] = str(exc)
    except BaseException as exc:                  # report, never hang the parent
        report["crash"] = repr(exc)
    queue.put(report)
    queue.close()
    queue.join_thread()
    os._exit(0)


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _read_line(proc, limit):
    ready, _, _ = select.select([proc.stdout], [], [], limit)
    return proc.stdout.readline() if ready else ""


@pytest.mark.skipif(not IS_ROOT, reason="needs root to run the intruder as another uid")
def test_env_job_without_secret_keeps_another_user_out(fresh_home, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               COLLECTIVES_SOCKET_SHM="0")
    for name in (auth.SECRET_ENV, "COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(name, None)
    ranks = [subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(r)),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for r in range(2)]
    try:
        for proc in ranks:
            line = _read_line(proc, 60)
            assert line.strip() == "ready", (line, proc.poll())
        queue = CTX.Queue()
        intruder = CTX.Process(target=_intruder, args=(port, _secret_path(fresh_home), queue))
        intruder.start()
        report = queue.get(timeout=60)
        intruder.join(10)
        assert "crash" not in report, report
        assert report["read_secret"] == "PermissionError", report
        assert report["empty_key"] == report["guessed_key"] == "AuthenticationError", report
        assert "authentication failed" in report["store"], report
        for proc in ranks:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in ranks:
            line = _read_line(proc, 60)
            assert line.startswith("done 3.0 [{'rank': 0}, {'rank': 1}]"), (line, proc.poll())
        # The job ran, and no secret travelled through the store for anyone to read.
        honest = TCPStore("127.0.0.1", port, timeout=5)
        assert honest.get("collectives/socket/generation/0") == b"1"
        assert not honest.check(["collectives/socket/1/secret"])
        honest.close()
        for proc in ranks:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in ranks:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (out, err)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


NODE_SCRIPT = """
    import numpy as np
    import collectives as dist

    dist.init_process_group("gloo")
    data = np.full(8, dist.get_rank() + 1.0)
    dist.all_reduce(data)
    print("sum", float(data[0]), flush=True)
    dist.destroy_process_group()
"""


def test_launcher_nodes_without_secret_share_the_user_file(fresh_home, tmp_path):
    """Two launchers as two nodes of one user (one host here, like a shared home directory):
    no COLLECTIVES_SECRET, yet they authenticate each other, and the launcher says why."""
    script = tmp_path / "node.py"
    script.write_text(textwrap.dedent(NODE_SCRIPT))
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(auth.SECRET_ENV, None)
    nodes = [subprocess.Popen([sys.executable, "-m", "collectives.run", "--nnodes", "2",
                               "--node-rank", str(node), "--nproc-per-node", "1",
                               "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(script)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path)
             for node in range(2)]
    try:
        outs = [proc.communicate(timeout=60) for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for node, (proc, (out, err)) in enumerate(zip(nodes, outs)):
        assert proc.returncode == 0, (node, out, err)
        assert f"[rank {node}]:sum 3.0" in out, (out, err)
        assert _secret_path(fresh_home) in err and auth.SECRET_ENV in err, err


def test_unwritable_home_falls_back_to_a_private_runtime_dir(fresh_home, monkeypatch, tmp_path):
    """A container with a read-only (here: impossible) home still gets a private secret."""
    monkeypatch.setenv("HOME", "/dev/null/home")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    secret = job_secret()
    path = runtime / "collectives" / "secret"
    assert len(secret) >= 32 and job_secret() == secret and path.read_bytes().strip() == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.secret_file_path() == str(path)
    # An unsafe fallback is refused like the first choice, never skipped.
    os.chmod(path, 0o644)
    with pytest.raises(auth.SecretFileError, match="readable by group or others"):
        job_secret()


def test_a_short_secret_is_refused_wherever_it_comes_from(fresh_home, monkeypatch):
    """One observed handshake lets an attacker test guesses offline: a guessable secret is
    an error naming where it came from, never used quietly."""
    monkeypatch.setenv(auth.SECRET_ENV, "a")
    with pytest.raises(ValueError, match=r"\$COLLECTIVES_SECRET has 1 bytes, fewer than 16"):
        job_secret()
    with pytest.raises(ValueError, match="the secret given has 5 bytes"):
        job_secret("short")
    monkeypatch.delenv(auth.SECRET_ENV)
    path = _secret_path(fresh_home)
    os.makedirs(os.path.dirname(path), mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"x\n")
    os.close(fd)
    with pytest.raises(auth.SecretFileError, match=r"holds 1 bytes, fewer than 16"):
        job_secret()
    assert len(job_secret("0123456789abcdef")) == auth.MIN_SECRET


def test_a_planted_link_in_the_shared_fallback_directory_is_refused(fresh_home, monkeypatch,
                                                                   tmp_path):
    """Where the home cannot hold the secret it goes to a directory under /tmp, which every
    user may write: a link planted there before us (to a directory of ours whose parent
    another user controls, say) is refused, not followed."""
    monkeypatch.setenv("HOME", "/dev/null/home")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)          # re-read TMPDIR
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, shared / f"collectives-{os.geteuid()}")
    with pytest.raises(auth.SecretFileError, match="symbolic link in a directory every user"):
        job_secret()
    assert not (target / "secret").exists()
