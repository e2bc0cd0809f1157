"""Per-job authentication for TCP connections: a mutual HMAC challenge-response, then a tag
on every frame.

Every TCPStore connection and every socket-transport connection opens with this handshake
before any other byte is trusted. The listener sends a magic word and a random nonce; the
connector answers with its own nonce, an 8-byte identity (its rank, or -1) and
HMAC-SHA256(secret, "client" | context | both nonces | identity); the listener checks it and
answers with its own identity and HMAC(secret, "server" | ...). Both sides therefore prove
they hold the secret without sending it, nonces defeat replay, and ``context`` (e.g. "store"
or a transport namespace) keeps a handshake of one purpose from being accepted for another.
Cost: two small round trips per connection, once.

A handshake alone proves nothing about the bytes after it: a relay planted in the connection
(through an unauthenticated store's address, or on the network path) could forward it
untouched and then rewrite the data. So each handshake also yields the connection's frame keys
(``FrameAuth``), and every frame after it carries a 16-byte tag over an implicit counter and
the frame: AES-GMAC where the ``cryptography`` package imports on both ends (hardware AES:
the faster by far), else HMAC-SHA256, the pair agreeing in the handshake. Nothing is acted on
until its tag checks.

Where the secret comes from (``job_secret``): an explicit value (``TCPStore(secret=...)``),
else $COLLECTIVES_SECRET (``collectives.run`` generates one per job), else the per-user
secret file ``$XDG_CONFIG_HOME/collectives/secret`` (``~/.config/collectives/secret``; where
that cannot be made, as in a container with a read-only home, ``$XDG_RUNTIME_DIR/collectives/
secret`` or ``$TMPDIR/collectives-<uid>/secret``, which serve this host only):
64 random hex digits, created on first use with mode 0600 in a directory of mode 0700, and
refused (``SecretFileError``) if it is a symbolic link or not a plain file, belongs to another
user, group or others may read it, or they may write its directory. So with no configuration at all, every process
of one user on one host (or on hosts sharing the home directory) holds the same secret and
nobody else can: ranks started by hand with env:// authenticate each other, and another user
who reaches the port cannot join. Across hosts that share no home directory, set
$COLLECTIVES_SECRET to one value on every host (or copy the file); ``warn_if_remote`` says so
once when the master is not a local address and no secret is set, and every handshake
failure names that fix.

Elsewhere: a FileStore is protected by its file's permissions (0600, see ``store.FileStore``);
MPI by the MPI launcher (no handshake of ours); NCCL's unique id travels through the store,
but NCCL's own bootstrap and data connections are NCCL's and not authenticated here.

What is trusted: a peer that completes the handshake is a rank of the job. The object
collectives (``all_gather_object``, ``broadcast_object_list``, ...) unpickle what ranks send,
so anyone who holds the secret can run code in every rank: guard the secret (the file, the
environment of the processes) as you would a login. Limits: no encryption (anyone on the
path reads the data, and can cut the connection); a secret is refused below MIN_SECRET bytes,
and one of fewer than 32 random bytes is only as strong as it is hard to guess. Shared-memory
rings and cross-memory reads between processes of one user on one host carry no tags: the
operating system's permissions keep others out of them (``transports.socket.channels``).
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import stat
import struct
import tempfile
import time
import warnings

from . import settings

SECRET_ENV = settings.SECRET.name
MAGIC = b"COLLv1\x00\x00"
NONCE = 32
DIGEST = 32
_IDENT = struct.Struct("<q")

log = logging.getLogger("collectives.auth")


class AuthenticationError(ConnectionError):
    """The peer did not prove it holds the job's secret, or did not speak the protocol."""


class SecretFileError(RuntimeError):
    """The per-user secret file is unsafe (another owner, readable by others, a symbolic link)
    or cannot be created. Not an OSError, so no connection-retry loop swallows it."""


class _CannotCreate(SecretFileError):
    """The secret's directory cannot be made here (not: it is unsafe)."""


_SECRET_DIR_NAME = "collectives"
_SECRET_FILE_NAME = "secret"
_warned_remote = False


def new_secret() -> str:
    return secrets.token_hex(32)


# Every frame's tag is keyed by the secret, and one observed handshake lets an attacker test
# guesses offline: a short secret is guessable, so it is refused, never used quietly.
MIN_SECRET = 16


def job_secret(explicit: bytes | str | None = None) -> bytes:
    """The key: ``explicit`` if given, else $COLLECTIVES_SECRET, else the per-user secret file
    (created on first use). An empty value counts as not given: there is no unauthenticated
    mode. Raises ValueError for a given secret shorter than MIN_SECRET bytes, SecretFileError
    when the file is unsafe, too short or cannot be made."""
    for value, where in ((explicit, "the secret given"), (settings.SECRET(), f"${SECRET_ENV}")):
        if value:
            value = value.encode() if isinstance(value, str) else bytes(value)
            if len(value) < MIN_SECRET:
                raise ValueError(f"job secret: {where} has {len(value)} bytes, fewer than "
                                 f"{MIN_SECRET}: it could be guessed from one observed "
                                 f"handshake. {_MAKE_ONE}")
            return value
    return _user_secret()


_MAKE_ONE = ("Make one with: python -c 'import secrets; print(secrets.token_hex(32))'")


def _config_secret_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):              # the XDG rule: a relative value is ignored
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, _SECRET_DIR_NAME, _SECRET_FILE_NAME)


def _runtime_secret_path() -> str:
    """Where the secret goes when the config directory cannot be made (a read-only or missing
    home, as in some containers): this host only."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(base) and os.path.isdir(base):
        return os.path.join(base, _SECRET_DIR_NAME, _SECRET_FILE_NAME)
    return os.path.join(tempfile.gettempdir(), f"{_SECRET_DIR_NAME}-{os.geteuid()}",
                        _SECRET_FILE_NAME)


_path_in_use: tuple[str, str] | None = None      # (config path, the path used instead)


def secret_file_path() -> str:
    """Where the per-user secret lives: $XDG_CONFIG_HOME/collectives/secret, else
    ~/.config/collectives/secret; where neither can be made, $XDG_RUNTIME_DIR/collectives/
    secret or $TMPDIR/collectives-<uid>/secret (the one this process used, once it has)."""
    config = _config_secret_path()
    return _path_in_use[1] if _path_in_use and _path_in_use[0] == config else config


def secret_source() -> str:
    """Where this process's default secret comes from, for messages."""
    if settings.SECRET():
        return f"${SECRET_ENV}"
    return f"the per-user secret file {secret_file_path()}"


def secret_hint() -> str:
    """The fix for a handshake that failed, for every authentication error's message."""
    return (f"every process of a job must hold the same secret: set {SECRET_ENV} to one value "
            f"on every host, or give every host the same {secret_file_path()} (a shared home "
            f"directory does); this process uses {secret_source()}")


def _owner(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_private(path: str, st: os.stat_result, what: str, loose: int) -> None:
    """Refuse a secret ``file`` or ``directory`` that another user owns or may touch."""
    me = os.geteuid()
    if st.st_uid != me:
        raise SecretFileError(f"job secret: the {what} {path} is owned by {_owner(st.st_uid)}, "
                              f"not by this process's user ({_owner(me)}), so another user may "
                              f"know the secret. Remove it (a new one is made), or set "
                              f"{SECRET_ENV}")
    if st.st_mode & loose:
        mode = oct(stat.S_IMODE(st.st_mode))
        if what == "file":
            raise SecretFileError(f"job secret: the file {path} has mode {mode}, readable by "
                                  f"group or others, so the secret may be known: remove it (a "
                                  f"new one is made), or chmod 600 it if nobody else can have "
                                  f"read it, or set {SECRET_ENV}")
        raise SecretFileError(f"job secret: the directory {path} has mode {mode}: group or "
                              f"others may replace the secret file in it. Run chmod 700 "
                              f"{path}, or set {SECRET_ENV}")


def _secret_dir(directory: str, shared_parent: bool = False) -> None:
    """Make (0700) or check the secret's directory; its parents are made as usual. Under a
    ``shared_parent`` (the temporary directory, which every user may write) the directory
    must be a real one, not a symbolic link that another user planted before us."""
    try:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _CannotCreate(f"job secret: cannot create {directory} for the per-user secret "
                            f"({exc}); set {SECRET_ENV}, or XDG_CONFIG_HOME to a writable "
                            f"directory") from None
    try:
        # a symlinked ~/.config/collectives is fine if it is ours; in /tmp a link is planted
        st = (os.lstat if shared_parent else os.stat)(directory)
    except OSError as exc:
        raise SecretFileError(f"job secret: cannot use {directory}: {exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise SecretFileError(f"job secret: {directory} is a symbolic link in a directory "
                              f"every user may write, so another user may have made it: "
                              f"remove it (a private directory is made), or set {SECRET_ENV}")
    if not stat.S_ISDIR(st.st_mode):
        raise SecretFileError(f"job secret: {directory} is not a directory; remove it or set "
                              f"{SECRET_ENV}")
    _check_private(directory, st, "directory", 0o022)


def _read_secret(path: str) -> bytes | None:
    """The secret in ``path``, checked; None if there is no file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SecretFileError(f"job secret: {path} is a symbolic link; the secret file must "
                                  f"be a plain file of your own. Remove the link (a new secret "
                                  f"is made), or set {SECRET_ENV}") from None
        raise SecretFileError(f"job secret: cannot read {path}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"job secret: {path} is not a regular file; remove it")
        _check_private(path, st, "file", 0o077)
        # A creator on a filesystem without hard links writes in place: wait for its write.
        deadline = time.monotonic() + 2.0
        while True:
            value = os.pread(fd, 4096, 0).strip()
            if value or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
    finally:
        os.close(fd)
    if not value:
        raise SecretFileError(f"job secret: {path} is empty; remove it (a new secret is made)")
    if len(value) < MIN_SECRET:
        raise SecretFileError(f"job secret: {path} holds {len(value)} bytes, fewer than "
                              f"{MIN_SECRET}: it could be guessed from one observed handshake. "
                              f"Remove it (a new secret is made), or write a longer one. "
                              f"{_MAKE_ONE}")
    return value


def _user_secret() -> bytes:
    global _path_in_use
    path = config = _config_secret_path()
    try:
        _secret_dir(os.path.dirname(path))
    except _CannotCreate as first:
        # Only a directory that cannot be made falls back; an unsafe one is an error.
        path = _runtime_secret_path()
        try:
            _secret_dir(os.path.dirname(path), shared_parent=True)
        except _CannotCreate as second:
            raise SecretFileError(f"{first}; and {second}") from None
    _path_in_use = (config, path)
    value = _read_secret(path)
    if value is not None:
        return value
    # Create it atomically: write a private temporary file, then hard-link it into place.
    # link() fails if the name exists, so concurrent first users all end up reading the one
    # winner's secret, never a half-written file (and link is atomic on NFS too).
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (new_secret() + "\n").encode())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
                raise
            _create_in_place(path)           # no hard links here (some FUSE/FAT filesystems)
    except OSError as exc:
        raise SecretFileError(f"job secret: cannot create {path} ({exc}); set {SECRET_ENV}, or "
                              f"XDG_CONFIG_HOME to a writable directory") from None
    finally:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
    value = _read_secret(path)
    if value is None:
        raise SecretFileError(f"job secret: {path} vanished while it was being created")
    return value


def _create_in_place(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, (new_secret() + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine: loopback, unspecified, or an address one of its
    interfaces holds (binding to it succeeds). Unresolvable names count as local: the
    connection will fail on its own, with its own message."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return True
    for family, _, _, _, addr in infos:
        ip = ipaddress.ip_address(addr[0].split("%")[0])
        if ip.is_loopback or ip.is_unspecified:
            return True
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((addr[0], 0) if family == socket.AF_INET else addr[:2] + (0, 0))
            return True
        except OSError:
            continue
    return False


def warn_if_remote(host: str, where: str) -> None:
    """Once per process: a master on another host with no $COLLECTIVES_SECRET works only if
    that host has this user's secret file too; say so before the handshake fails."""
    global _warned_remote
    if _warned_remote or settings.SECRET() or is_local_address(host):
        return
    _warned_remote = True
    message = (f"{where}: the master {host} is on another host and {SECRET_ENV} is not set, so "
               f"this process authenticates with the per-user secret file "
               f"{secret_file_path()}: the job works only if every host has the same file (a "
               f"shared home directory). Otherwise set {SECRET_ENV} to one value on every host, "
               f"e.g. $(python -c 'import secrets; print(secrets.token_hex(32))')")
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _mac(secret, role, context, first, second, ident, offer):
    msg = role + b"|" + context.encode() + b"|" + first + second + _IDENT.pack(ident) + offer
    return hmac.new(secret, msg, hashlib.sha256).digest()


TAG = 16                        # bytes that close every frame after a handshake
# The frames' MACs, as bits of the set each side offers in its handshake; the pair uses the
# best both offer. AES-GMAC (AES-256-GCM over the frame, nothing encrypted) runs on AES-NI,
# several times faster than HMAC-SHA256 per byte and per frame; HMAC-SHA256 needs nothing
# beyond the standard library (BENCHMARKS.md §2, "The channel's authentication").
HMAC_SHA256, AES_GMAC = 1, 2
try:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError:                  # the package's `fast` extra brings it
    AESGCM = None
_GCM_MAX = (1 << 31) - 1             # AESGCM's one-shot limit; longer bodies go in pieces


def frame_macs() -> int:
    """The MACs this process offers: HMAC-SHA256 always, AES-GMAC where ``cryptography``
    imports."""
    return HMAC_SHA256 | (AES_GMAC if AESGCM is not None else 0)


class FrameAuth:
    """The frames of one authenticated connection, each closed by a tag.

    The handshake proves that both ends hold the secret, but a relay that forwards it
    untouched would own the connection afterwards; so every frame after it carries a 16-byte
    tag over the frame and an implicit counter, with one key per direction derived from the
    secret and the handshake's transcript (both nonces, both identities, both MAC offers, the
    context). A relay knows none of the keys: it can cut the connection but not alter, insert,
    replay, reorder or drop a frame unseen (a missing frame fails the next one's tag). A frame
    is a head (header bytes) and an optional body (its payload); each side calls ``seal`` for
    the frames it writes and ``authentic`` for the frames it reads, both in wire order."""

    __slots__ = ("sent", "received")
    name = ""

    def __init__(self):
        self.sent = self.received = 0

    @staticmethod
    def derive(secret, context, transcript: bytes, listener: bool, mac: int) -> "FrameAuth":
        def key(direction):
            return hmac.new(secret, b"frames|" + direction + b"|" + context.encode() + b"|"
                            + transcript, hashlib.sha256).digest()
        to_listener, to_connector = key(b"to-listener"), key(b"to-connector")
        send, recv = (to_connector, to_listener) if listener else (to_listener, to_connector)
        return (_GmacFrames if mac == AES_GMAC else _HmacFrames)(send, recv)

    def seal(self, head, body=None) -> memoryview:
        """The tag of the next frame written."""
        tag = self._tag(self._send, self.sent, head, body)
        self.sent += 1
        return memoryview(tag)

    def authentic(self, head, body, tag) -> bool:
        """Whether ``tag`` closes the next frame read, whose bytes are ``head`` and ``body``."""
        mine = self._tag(self._recv, self.received, head, body)
        self.received += 1
        return hmac.compare_digest(mine, bytes(tag))


class _HmacFrames(FrameAuth):
    __slots__ = ("_send", "_recv")
    name = "HMAC-SHA256"

    def __init__(self, send_key, recv_key):
        super().__init__()
        self._send = hmac.new(send_key, digestmod=hashlib.sha256)
        self._recv = hmac.new(recv_key, digestmod=hashlib.sha256)

    @staticmethod
    def _tag(base, counter, head, body):
        mac = base.copy()
        mac.update(_COUNTER.pack(counter))
        mac.update(head)
        if body is not None:
            mac.update(body)
        return mac.digest()[:TAG]


class _GmacFrames(FrameAuth):
    """GMAC: AES-256-GCM with the counter as the nonce (never repeated under one key), the
    head as the plaintext and the body as associated data; only the GCM tag travels."""
    __slots__ = ("_send", "_recv")
    name = "AES-GMAC"

    def __init__(self, send_key, recv_key):
        super().__init__()
        self._send, self._recv = (send_key, AESGCM(send_key)), (recv_key, AESGCM(recv_key))

    @staticmethod
    def _tag(keys, counter, head, body):
        nonce = _NONCE.pack(counter, 0)
        view = None if body is None else memoryview(body).cast("B")   # any array, as bytes
        if view is None or len(view) <= _GCM_MAX:
            return keys[1].encrypt(nonce, head, view)[-TAG:]
        encryptor = Cipher(algorithms.AES(keys[0]), modes.GCM(nonce)).encryptor()
        for at in range(0, len(view), _GCM_MAX):
            encryptor.authenticate_additional_data(view[at:at + _GCM_MAX])
        encryptor.update(head)
        encryptor.finalize()
        return encryptor.tag


_COUNTER = struct.Struct("<Q")
_NONCE = struct.Struct("<QI")
_OFFER = struct.Struct("<B")


def _best(mine: int, theirs: int) -> int:
    common = mine & theirs
    if not common:
        raise AuthenticationError(f"the two ends share no frame MAC (offers {mine:#x} and "
                                  f"{theirs:#x})")
    return AES_GMAC if common & AES_GMAC else HMAC_SHA256


def sign(secret: bytes, purpose: str, value: bytes) -> bytes:
    """``value`` followed by its tag, for a store that need not be authenticated (torch's
    TCPStore): whoever can write the store but lacks the secret cannot forge it."""
    return value + hmac.new(secret, b"value|" + purpose.encode() + b"|" + value,
                            hashlib.sha256).digest()[:TAG]


def signed_value(secret: bytes, purpose: str, blob: bytes) -> bytes | None:
    """The value ``sign`` wrapped in ``blob``, or None when its tag does not check."""
    value = blob[:-TAG]
    return value if len(blob) >= TAG and hmac.compare_digest(sign(secret, purpose, value),
                                                              blob) else None


def _transcript(nonce_s, nonce_c, ident_c, ident_s, offer_c, offer_s) -> bytes:
    return (nonce_s + nonce_c + _IDENT.pack(ident_c) + _IDENT.pack(ident_s)
            + _OFFER.pack(offer_c) + _OFFER.pack(offer_s))


def serve_handshake(sock: socket.socket, secret: bytes, context: str,
                    my_ident: int = -1) -> tuple[int, FrameAuth]:
    """Listener side. Returns the connector's identity and the tags of the frames that
    follow; raises AuthenticationError."""
    nonce_s = os.urandom(NONCE)
    sock.sendall(MAGIC + nonce_s)
    try:
        # the magic first: a client of another protocol is refused at once, however long
        # what it sends
        if recv_exact(sock, len(MAGIC)) != MAGIC:
            raise AuthenticationError("peer does not speak the collectives protocol (bad "
                                      "magic)")
        rest = recv_exact(sock, NONCE + _IDENT.size + _OFFER.size + DIGEST)
    except (ConnectionError, OSError) as exc:
        if isinstance(exc, AuthenticationError):
            raise
        raise AuthenticationError(f"handshake cut short: {exc}") from None
    nonce_c, ident_b = rest[:NONCE], rest[NONCE:NONCE + _IDENT.size]
    offer_b, digest = rest[NONCE + _IDENT.size:-DIGEST], rest[-DIGEST:]
    ident, (offer_c,) = _IDENT.unpack(ident_b)[0], _OFFER.unpack(offer_b)
    if not hmac.compare_digest(digest, _mac(secret, b"client", context, nonce_s, nonce_c,
                                            ident, offer_b)):
        raise AuthenticationError(f"peer failed the challenge (wrong or missing job secret; "
                                  f"{secret_hint()})")
    offer_s = frame_macs()
    mac = _best(offer_s, offer_c)
    mine = _OFFER.pack(offer_s)
    sock.sendall(_IDENT.pack(my_ident) + mine
                 + _mac(secret, b"server", context, nonce_c, nonce_s, my_ident, mine))
    transcript = _transcript(nonce_s, nonce_c, ident, my_ident, offer_c, offer_s)
    return ident, FrameAuth.derive(secret, context, transcript, True, mac)


def client_handshake(sock: socket.socket, secret: bytes, context: str,
                     my_ident: int = -1) -> tuple[int, FrameAuth]:
    """Connector side. Returns the listener's identity and the tags of the frames that
    follow; raises AuthenticationError."""
    try:
        hello = recv_exact(sock, len(MAGIC) + NONCE)
    except (ConnectionError, OSError) as exc:
        raise AuthenticationError(f"listener closed during handshake ({exc}); it may have "
                                  f"refused our secret ({secret_hint()})") from None
    if hello[:len(MAGIC)] != MAGIC:
        raise AuthenticationError("listener does not speak the collectives protocol (bad magic)")
    nonce_s = hello[len(MAGIC):]
    nonce_c = os.urandom(NONCE)
    offer_c = frame_macs()
    mine = _OFFER.pack(offer_c)
    sock.sendall(MAGIC + nonce_c + _IDENT.pack(my_ident) + mine
                 + _mac(secret, b"client", context, nonce_s, nonce_c, my_ident, mine))
    try:
        answer = recv_exact(sock, _IDENT.size + _OFFER.size + DIGEST)
    except (ConnectionError, OSError) as exc:
        raise AuthenticationError(f"listener refused us ({exc}): wrong job secret? "
                                  f"({secret_hint()})") from None
    ident = _IDENT.unpack(answer[:_IDENT.size])[0]
    offer_b = answer[_IDENT.size:_IDENT.size + _OFFER.size]
    if not hmac.compare_digest(answer[-DIGEST:], _mac(secret, b"server", context, nonce_c,
                                                      nonce_s, ident, offer_b)):
        raise AuthenticationError(f"listener failed the challenge (wrong job secret; "
                                  f"{secret_hint()})")
    (offer_s,) = _OFFER.unpack(offer_b)
    transcript = _transcript(nonce_s, nonce_c, my_ident, ident, offer_c, offer_s)
    return ident, FrameAuth.derive(secret, context, transcript, False, _best(offer_c, offer_s))
