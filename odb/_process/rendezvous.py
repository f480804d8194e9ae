"""Where the collate sides of one loader meet: rank 0's store, and what may be read from it.

At loader construction rank 0's trainer hosts a ``TCPStore`` on a free port
(:class:`StoreHost`; on 127.0.0.1 only when every rank is on this host) and sends its
address and a per-loader secret to the peers over the trainer's own group
(:func:`open_rendezvous`). Every client of the store is a :class:`SignedStore`: values
carry a tag keyed by that secret, and one without it raises :class:`StoreForgeryError`.
The groups built on it: :mod:`odb._process.comm`. Threat model: ``docs/reliability.md``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import secrets
import socket
import weakref
from dataclasses import dataclass, field
from typing import cast

import torch.distributed as dist


@dataclass(frozen=True)
class Rendezvous:
    """Where the collate sides of one loader meet: picklable, the same on every rank.

    ``secret`` keys the tags of every value the ranks write to the store
    (:class:`SignedStore`); drawn by rank 0, it reaches the peers over the trainer's own
    group, never through the store.
    """

    host: str
    port: int
    rank: int
    world_size: int
    init_timeout_s: float
    align_timeout_s: float
    secret: bytes = field(default=b"", repr=False)


class StoreHost:
    """Rank 0's ``TCPStore`` server, alive until :meth:`close` (the loader's close, its
    finalizer or the exit hook, after the collate sides have stopped).

    ``loopback``: listen on 127.0.0.1 only (every rank on this host); otherwise on every
    interface, as torch's own store does (torch offers no way to name one and still
    reach a host name's other addresses). The server runs in a native thread
    (``pt_tcpstore_uv``) that ends when the store is freed: :meth:`close` frees it, so
    the thread is joined then, not whenever the interpreter finalizes.
    """

    def __init__(self, host: str, timeout_s: float, loopback: bool = False) -> None:
        listener = None
        if loopback:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            host = "127.0.0.1"
        self.host = host
        store = dist.TCPStore(
            host,
            listener.getsockname()[1] if listener is not None else 0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            master_listen_fd=listener.detach() if listener is not None else None,
        )
        self.port = store.port
        self.store: dist.TCPStore | None = store
        _LIVE_HOSTS.add(self)

    @property
    def closed(self) -> bool:
        return self.store is None

    def close(self) -> None:
        """Stop the server now (idempotent): its thread is joined before this returns.

        Clients still connected (a peer rank that has not stopped) fail their next
        request; every rank's collate side has stopped by the time the exit hook calls
        this, and a loader's :meth:`~odb.loader.ODBLoader.close` stops its own first.
        """
        store, self.store = self.store, None
        _LIVE_HOSTS.discard(self)
        del store  # the only reference: the server thread is joined in its destructor


_LIVE_HOSTS: weakref.WeakSet[StoreHost] = weakref.WeakSet()


def close_store_hosts() -> None:
    """Close every :class:`StoreHost` still open in this process (the exit hook's last step)."""
    for host in list(_LIVE_HOSTS):
        host.close()


_FORGED = "that this job's ranks did not write"


def is_forgery(exc: BaseException) -> bool:
    """Whether ``exc`` is (or carries, through Gloo's C++ layer) a :class:`StoreForgeryError`."""
    return isinstance(exc, StoreForgeryError) or _FORGED in str(exc)


class StoreForgeryError(RuntimeError):
    """The rendezvous store holds a value that none of this loader's ranks wrote."""


class SignedStore(dist.Store):
    """A client of the loader's store whose values only this loader's ranks can make.

    Every value written carries an HMAC-SHA256 tag keyed by the loader's secret over its
    full key (the iteration's prefix included, so a value cannot be replayed under
    another key or epoch) and the value. A value read without a valid tag was written by
    something else that reached the port: :class:`StoreForgeryError` names the store and
    the key, and the rank stops. Gloo's rendezvous runs through it (``set``, ``wait``,
    ``get``), as do the failure notes.
    """

    _TAG_BYTES = 32

    def __init__(self, rendezvous: Rendezvous, prefix: str, timeout_s: float) -> None:
        super().__init__()
        self._where = f"{rendezvous.host}:{rendezvous.port}"
        self._prefix, self._secret = prefix, rendezvous.secret
        client = dist.TCPStore(
            rendezvous.host,
            rendezvous.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self._store = dist.PrefixStore(prefix, client)

    def _tag(self, key: str, value: bytes) -> bytes:
        message = (self._prefix + key).encode() + b"\0" + value
        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def set(self, key: str, value: str | bytes) -> None:
        data = value if isinstance(value, bytes) else str(value).encode()
        # torch's stub types a Store value str; c10d stores bytes as they are
        self._store.set(key, self._tag(key, data) + data)  # type: ignore[arg-type]

    def get(self, key: str) -> bytes:
        raw = self._store.get(key)
        tag, data = raw[: self._TAG_BYTES], raw[self._TAG_BYTES :]
        if not hmac.compare_digest(tag, self._tag(key, data)):
            raise StoreForgeryError(
                f"the ODB rendezvous store at {self._where} holds a value under "
                f"{self._prefix + key!r} {_FORGED} (no valid tag): another program "
                "reached the store's port and wrote to it. The rank stops rather than "
                "use it. Keep the port unreachable from outside the job (on one node the "
                "store listens on 127.0.0.1 only)."
            )
        return data

    def check(self, keys: list[str]) -> bool:
        return self._store.check(keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Wait for ``keys``, bounded by this store's own timeout whatever ``timeout`` says.

        Gloo's rendezvous passes its group's timeout, a fraction of ``init_timeout_s``
        (see :class:`odb._process.comm.AlignmentGroup`); waiting for a late peer keeps
        the full ``init_timeout_s`` this client was opened with.
        """
        del timeout
        self._store.wait(keys)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._store.set_timeout(timeout)


def trainer_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the trainer's default group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def open_rendezvous(
    host: str | None, init_timeout_s: float, align_timeout_s: float
) -> tuple[Rendezvous | None, StoreHost | None]:
    """Create the loader's rendezvous; collective over the trainer's group.

    Every rank must call this the same number of times, in the same order (as every
    rank constructs the same loaders). World size 1 needs no group and returns None.
    """
    rank, world = trainer_world()
    if world == 1:
        return None, None
    store_host = None
    address: list[object] = [None]
    if rank == 0:
        loopback = host is None and _one_node(world)
        store_host = StoreHost(host or socket.gethostname(), init_timeout_s, loopback)
        address = [(store_host.host, store_host.port, secrets.token_bytes(32))]
    dist.broadcast_object_list(address, src=0)
    host_name, port, secret = cast(tuple[str, int, bytes], address[0])
    rendezvous = Rendezvous(
        host_name, port, rank, world, init_timeout_s, align_timeout_s, secret=secret
    )
    return rendezvous, store_host


def _one_node(world_size: int) -> bool:
    """Whether every rank runs on this host, as the launcher says (torchrun, accelerate
    and DeepSpeed set ``LOCAL_WORLD_SIZE``); False when it does not say."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return local.isdigit() and int(local) == world_size
