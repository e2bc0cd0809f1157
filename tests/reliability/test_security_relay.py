"""A relay between two ranks: every frame after the handshake is authenticated.

A real man-in-the-middle process (``helpers/relay.py``) takes rank 0's place in the store,
forwards the job-secret handshake untouched and rewrites the float32 payloads that follow.
The frames' tags (``auth.FrameAuth``) make that an error on the ranks, never a wrong sum.
Under torchrun the store is torch's, which anyone may write; under our launcher the store
authenticates, so there the relay stands for an attacker on the network path.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from repo import HELPERS, ROOT

torch = pytest.importorskip("torch")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_with_relay(store_kind, key, launch, env):
    relay = subprocess.Popen([sys.executable, os.path.join(HELPERS, "relay.py"), store_kind,
                              "127.0.0.1", str(env["MASTER_PORT"]), key],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)
    try:
        job = subprocess.run(launch, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
        relayed, _ = relay.communicate(timeout=30)
    finally:
        relay.kill()
    lines = [json.loads(line[line.index("{"):]) for line in job.stdout.splitlines()
             if '{"rank"' in line]              # our launcher prefixes "[rank N]:"
    said = f"job:\n{job.stdout}\n{job.stderr[-3000:]}\nrelay:\n{relayed}"
    outcomes = {line["rank"]: line for line in lines}
    assert sorted(outcomes) == [0, 1], said
    assert "rewrote 0" not in relayed and "rewrote" in relayed, said
    # never a sum the relay made: each rank raised, and the first to read a rewritten frame
    # says why (the other may learn it only as its peer's exit)
    assert all("error" in line for line in outcomes.values()), said
    assert any("failed authentication" in line["error"] for line in outcomes.values()), said


def _env(port):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               COLLECTIVES_SECRET="relay-test-" + os.urandom(16).hex(),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("COLLECTIVES_SOCKET_HOST", None)
    return env


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None,
                    reason="torchrun is not installed beside this Python")
def test_a_relay_through_torchs_store_under_torchrun_is_an_error():
    port = _free_port()
    env = _env(port)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    _run_with_relay("torch", "default_pg/0//cpu//collectives/socket/1/addr/0",
                    [torchrun, "--nnodes", "1", "--nproc-per-node", "2", "--master-addr",
                     "127.0.0.1", "--master-port", str(port),
                     os.path.join(HELPERS, "relay_job.py"), "torch"], env)


def test_a_relay_on_the_path_under_our_launcher_is_an_error():
    port = _free_port()
    env = _env(port)
    _run_with_relay("ours", "collectives/socket/1/addr/0",
                    [sys.executable, "-m", "collectives.run", "--nnodes", "1",
                     "--nproc-per-node", "2", "--master-port", str(port),
                     os.path.join(HELPERS, "relay_job.py"), "facade"], env)


def test_a_relay_between_a_store_client_and_its_server_is_an_error():
    """The store's frames carry tags too: a rewritten reply is an error, never the value."""
    import select
    import threading

    from collectives.store import TCPStore
    from collectives.store.base import StoreError

    secret = "relay-store-" + os.urandom(16).hex()
    server = TCPStore("127.0.0.1", 0, is_master=True, timeout=10, secret=secret,
                      wait_for_workers=False)
    server.set("answer", "value-one")
    listener = socket.create_server(("127.0.0.1", 0))

    def forward(src, dst, clear):
        """Copy src to dst; after ``clear`` bytes (the handshake), rewrite the value."""
        passed = 0
        while select.select([src], [], [], 10)[0]:
            data = src.recv(1 << 16)
            if not data:
                return
            head, body = data[:max(0, clear - passed)], data[max(0, clear - passed):]
            passed += len(data)
            dst.sendall(head + body.replace(b"value-one", b"value-two"))

    def relay():
        client, _ = listener.accept()
        upstream = socket.create_connection(("127.0.0.1", server.port))
        threading.Thread(target=forward, args=(client, upstream, 81), daemon=True).start()
        forward(upstream, client, 81)

    threading.Thread(target=relay, daemon=True).start()
    victim = TCPStore("127.0.0.1", listener.getsockname()[1], timeout=10, secret=secret)
    try:
        with pytest.raises(StoreError, match="failed authentication"):
            victim.get("answer")
    finally:
        victim.close()
        server.close()
        listener.close()


def test_an_nccl_unique_id_written_by_someone_else_is_refused(monkeypatch):
    """The NCCL unique id says where rank 0's NCCL listens, and it goes through the store,
    which under torchrun anyone may write: it is signed with the job secret, so a replaced id
    is an error on the reader, never a communicator with the writer."""
    import types

    from collectives.errors import TransportError
    from collectives.store import HashStore
    from collectives.transports import nccl as nccl_transport

    monkeypatch.setenv("COLLECTIVES_SECRET", "nccl-id-test-" + os.urandom(16).hex())
    fake = types.SimpleNamespace(get_unique_id=lambda: bytes(range(128)))
    store = HashStore()
    assert nccl_transport._exchange_unique_id(0, 2, store, 5, fake) == bytes(range(128))
    assert nccl_transport._exchange_unique_id(1, 2, store, 5, fake) == bytes(range(128))
    store.set(nccl_transport._uid_key(2), bytes(128))       # an attacker's own id
    with pytest.raises(TransportError, match="unique id .* failed authentication"):
        nccl_transport._exchange_unique_id(1, 2, store, 5, fake)


@pytest.mark.parametrize("offers", [("gmac", "gmac"), ("gmac", "hmac"), ("hmac", "gmac"),
                                    ("hmac", "hmac")])
def test_the_two_ends_agree_on_the_frame_mac_and_it_holds(offers, monkeypatch):
    """AES-GMAC where both ends have ``cryptography``, HMAC-SHA256 otherwise: each side's
    offer is covered by the handshake's MACs, the keys by both offers, and a frame sealed on
    one end checks on the other (a rewritten one does not), in each direction."""
    import threading

    from collectives import auth
    if auth.AESGCM is None and "gmac" in offers:
        pytest.skip("cryptography is not installed: AES-GMAC is not offered here")
    bits = {"gmac": auth.HMAC_SHA256 | auth.AES_GMAC, "hmac": auth.HMAC_SHA256}
    roles = dict(zip(("listener", "connector"), offers))
    monkeypatch.setattr(auth, "frame_macs",
                        lambda: bits[roles[threading.current_thread().name]])
    secret = os.urandom(32)
    a, b = socket.socketpair()
    out = {}
    listener = threading.Thread(target=lambda: out.update(
        listener=auth.serve_handshake(a, secret, "test", 0)), name="listener")
    listener.start()
    threading.current_thread().name, saved = "connector", threading.current_thread().name
    try:
        out["connector"] = auth.client_handshake(b, secret, "test", 1)
    finally:
        threading.current_thread().name = saved
    listener.join(10)
    (who_c, served), (who_l, dialed) = out["listener"], out["connector"]
    assert (who_c, who_l) == (1, 0)
    expected = "AES-GMAC" if offers == ("gmac", "gmac") else "HMAC-SHA256"
    assert served.name == dialed.name == expected
    head, body = b"h" * 24, np.arange(1000, dtype=np.float32)
    for sender, receiver in ((served, dialed), (dialed, served)):
        tag = sender.seal(head, body)
        assert receiver.authentic(head, body.view(np.uint8), tag)
        tag = sender.seal(head, body)
        assert not receiver.authentic(head, (body + 1).view(np.uint8), tag)
    a.close()
    b.close()


def test_the_socket_transport_runs_on_hmac_where_gmac_is_missing(monkeypatch):
    """Without ``cryptography`` (HMAC-SHA256 on both ends) the transport works and refuses
    a relay's frames alike."""
    from collectives import auth
    from socket_ranks import inject, transport_pair
    monkeypatch.setattr(auth, "frame_macs", lambda: auth.HMAC_SHA256)
    store, (t0, t1) = transport_pair()
    try:
        assert t0._peers[1].auth.name == t1._peers[0].auth.name == "HMAC-SHA256"
        got = np.zeros(4, np.float32)
        t0.send(np.ones(4, np.float32), 1, 7)
        t1.recv(got, 0, 7, 5)
        assert got.tolist() == [1.0] * 4
        head = np.zeros(1, dtype=[("k", "u1"), ("s", "V7"), ("t", "<i8"), ("n", "<u8")])
        head["t"], head["n"] = 7, 16
        inject(t0, 1, [head.tobytes() + np.full(4, 1000.0, np.float32).tobytes() + bytes(16)],
               sealed=False)
        with pytest.raises(Exception, match="failed authentication"):
            t1.recv(got, 0, 7, 5)
    finally:
        t0.close(timeout=2)
        t1.close(timeout=2)
        store.close()


def test_a_gmac_body_beyond_the_one_shot_limit_is_tagged_in_pieces(monkeypatch):
    """Bodies longer than AESGCM's one-shot limit (2 GiB) are fed in pieces: the same tag."""
    from collectives import auth
    if auth.AESGCM is None:
        pytest.skip("cryptography is not installed: AES-GMAC is not offered here")
    key, head, body = os.urandom(32), os.urandom(24), os.urandom(10_000)
    whole = auth.FrameAuth.derive(key, "t", b"x", True, auth.AES_GMAC).seal(head, body)
    monkeypatch.setattr(auth, "_GCM_MAX", 3000)
    pieces = auth.FrameAuth.derive(key, "t", b"x", True, auth.AES_GMAC).seal(head, body)
    assert bytes(whole) == bytes(pieces)
