"""Key-value stores for rendezvous, with torch.distributed's names and meanings.

``TCPStore`` (a server thread in one process, clients everywhere), ``FileStore`` (a shared
file, for one host or a shared filesystem), ``HashStore`` (one process), ``PrefixStore`` (a
namespace over another store). Methods: ``set``, ``get`` (blocks until the key exists or the
timeout), ``add``, ``wait(keys, timeout)``, ``compare_set``, ``delete_key``, ``num_keys``,
``check``. Keys are str, values bytes (str values are encoded). Timeouts raise
``StoreTimeout`` naming the keys still missing.

TCPStore connections are authenticated with the job secret (``collectives.auth``); a client
that fails the handshake is logged and dropped, never trusted. Frames are length-prefixed and
bounded (``MAX_FRAME``); a malformed request is answered with an error naming the operation.
Cost: one round trip per call; the server runs one thread per connection, bounded against
floods (see ``_StoreServer``), fine for the hundreds of ranks rendezvous needs, not a database.
Timeouts: None, inf, ``timedelta.max`` or anything from ``_FOREVER_S`` (about 31 years) up
mean no deadline; NaN and negative timeouts are ValueError.
FileStore polls the file (fcntl lock, append-only log) every few milliseconds.
"""
from .base import (DEFAULT_TIMEOUT, HashStore, PrefixStore, Store, StoreError, StoreGone,
                   StoreTimeout)
from .file import FileStore
from .tcp import TCPStore
from .wire import MAX_FRAME

__all__ = ["DEFAULT_TIMEOUT", "MAX_FRAME", "FileStore", "HashStore", "PrefixStore", "Store",
           "StoreError", "StoreGone", "StoreTimeout", "TCPStore"]
