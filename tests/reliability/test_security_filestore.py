"""file:// rendezvous and FileStore: a private file (0600, O_NOFOLLOW); a symbolic link,
another user's file, a file group or others may read or write, and a file that is not a
FileStore's are refused with the path, the fault and the fix, and never written; a file left
by an earlier job that is over (killed, or never closed) does not break the next job on the
same path; a record cut short by a killed writer is dropped; the file is removed after the
last rank, and kept as a plain store without a world size."""
import multiprocessing
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from collectives.store import FileStore, StoreError

from repo import ROOT
CTX = multiprocessing.get_context("fork")
NOBODY = 65534
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_new_file_is_private_and_marked(tmp_path):
    path = str(tmp_path / "rdzv")
    old = os.umask(0)                   # the 0600 must not depend on the caller's umask
    try:
        store = FileStore(path, 2, timeout=5)
    finally:
        os.umask(old)
    store.set("k", "v")
    assert _mode(path) == 0o600
    with open(path, "rb") as f:
        assert f.read().startswith(FileStore.HEADER)
    store.close()


def test_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"do not append here\n")
    os.chmod(target, 0o600)
    path = tmp_path / "rdzv"
    os.symlink(target, path)
    with pytest.raises(StoreError, match="symbolic link") as info:
        FileStore(str(path), 2, timeout=5)
    assert str(path) in str(info.value) and "remove" in str(info.value)
    assert target.read_bytes() == b"do not append here\n"


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o660, 0o604])
def test_file_others_may_read_or_write_is_refused(tmp_path, mode):
    path = tmp_path / "rdzv"
    path.write_bytes(b"")
    os.chmod(path, mode)
    with pytest.raises(StoreError, match="group or others") as info:
        FileStore(str(path), 2, timeout=5)
    assert str(path) in str(info.value) and oct(mode) in str(info.value)
    assert path.read_bytes() == b""


@pytest.mark.skipif(not IS_ROOT, reason="needs root to give a file to another user")
@pytest.mark.parametrize("mode", [0o666, 0o600])
def test_another_users_file_is_refused(tmp_path, mode):
    """Another user pre-creates the rendezvous file (0666 so we could write it): using it
    would let them read every key, the job's addresses and anything else put there."""
    path = tmp_path / "rdzv"
    path.write_bytes(b"")
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, mode)
    with pytest.raises(StoreError, match=f"owned by uid {NOBODY}") as info:
        FileStore(str(path), 2, timeout=5)
    assert str(path) in str(info.value)
    assert path.read_bytes() == b""


@pytest.mark.parametrize("content", [b"hello, world\n", bytes(range(256)) * 4,
                                     b"S\x05\x00\x00\x00\x01\x00\x00\x00\xff\xfe\xfd\xfc\xfbx"])
def test_file_that_is_not_a_filestore_is_refused(tmp_path, content):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(StoreError, match="not a FileStore") as info:
        FileStore(str(path), 2, timeout=5)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


def test_empty_file_is_adopted(tmp_path):
    fd, path = tempfile.mkstemp(dir=tmp_path)       # what torch's tests hand to file://
    os.close(fd)
    store = FileStore(path, 1, timeout=5)
    store.set("k", "v")
    assert store.get("k") == b"v"
    store.close()
    assert not os.path.exists(path)                  # the last rank removes it


def _leave_stale_records(path, queue):
    store = FileStore(path, 2, timeout=5)
    store.set("stale", "from the dead job")
    store.add("collectives/socket/generation/0", 1)
    queue.put("written")
    queue.close()
    queue.join_thread()
    os._exit(0)                         # dies without close(), like a killed rank


def test_stale_records_of_a_finished_process_are_dropped_live_ones_kept(tmp_path):
    path = str(tmp_path / "rdzv")
    queue = CTX.Queue()
    child = CTX.Process(target=_leave_stale_records, args=(path, queue))
    child.start()
    assert queue.get(timeout=30) == "written"
    child.join(30)
    assert os.path.exists(path)
    first = FileStore(path, 2, timeout=5)            # nobody holds the file: a new job
    assert not first.check(["stale"])
    assert first.add("collectives/socket/generation/0", 1) == 1
    first.set("mine", "1")
    second = FileStore(path, 2, timeout=5)           # the first is alive: same job, join
    assert second.get("mine") == b"1"
    first.close()
    assert os.path.exists(path)                      # the second still has it open
    second.close()
    assert not os.path.exists(path)


def test_without_world_size_the_file_is_a_plain_persistent_store(tmp_path):
    path = str(tmp_path / "kv")
    store = FileStore(path, timeout=5)
    store.set("k", "v")
    store.close()
    again = FileStore(path, timeout=5)
    assert again.get("k") == b"v"
    again.close()
    assert os.path.exists(path)


def test_record_cut_short_by_a_killed_writer_is_dropped(tmp_path):
    path = str(tmp_path / "kv")
    store = FileStore(path, timeout=5)
    store.set("k", "v")
    store.close()
    with open(path, "ab") as f:
        f.write(b"S\x03\x00\x00\x00\x40\x00\x00\x00abc" + b"partial")   # value cut short
    store = FileStore(path, timeout=5)
    assert store.get("k") == b"v" and not store.check(["abc"])
    store.set("after", "x")
    assert store.get("after") == b"x" and store.get("k") == b"v"
    store.close()
    again = FileStore(path, timeout=5)
    assert again.get("after") == b"x" and again.get("k") == b"v"
    again.close()


# -- a job killed, then run again on the same file:// path -----------------------------------

JOB_SCRIPT = """
    import sys
    import numpy as np
    import collectives as dist
    from datetime import timedelta

    rank = int(sys.argv[2])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank,
                            world_size=2, timeout=timedelta(seconds=float(sys.argv[3])))
    data = np.full(8, rank + 1.0)
    dist.all_reduce(data)
    print("sum", float(data[0]), flush=True)
    dist.destroy_process_group()
"""


def _start(script, path, rank, limit):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLLECTIVES_SECRET", None)
    return subprocess.Popen([sys.executable, str(script), path, str(rank), str(limit)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rerun_after_a_killed_job_works(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB_SCRIPT))
    path = str(tmp_path / "rdzv")
    # The failed job: rank 0 checked in and waits for a rank 1 that never comes; killed.
    dead = _start(script, path, 0, 60)
    try:
        probe = FileStore(path, timeout=30)          # no world size: looks, never resets
        deadline = time.monotonic() + 30
        while probe.num_keys() == 0:                 # rank 0 has written its first record
            assert dead.poll() is None and time.monotonic() < deadline, dead.communicate()
            time.sleep(0.01)
        probe.close()
    finally:
        dead.send_signal(signal.SIGKILL)
        dead.communicate()
    assert os.path.exists(path)
    # The re-run, same path: must not read the dead job's generation counters or address.
    ranks = [_start(script, path, rank, 15) for rank in range(2)]
    try:
        outs = [proc.communicate(timeout=60) for proc in ranks]
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(ranks, outs):
        assert proc.returncode == 0, err
        assert "sum 3.0" in out, (out, err)
    assert not os.path.exists(path)                  # the last rank removed it
