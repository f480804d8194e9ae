"""The one place ODB relies on how torch's ``file_system`` sharing talks to its manager.

With ``torch.multiprocessing.set_sharing_strategy("file_system")`` every shared storage
is registered with a ``torch_shm_manager`` process (torch's libshm), which unlinks what
is left in ``/dev/shm`` when its last client is gone. A process keeps one connection
per manager for its whole life, in a process-global table of the C++ library, and
reuses it for every later storage; a forked child inherits that table, and with it the
descriptor of its parent's connection. The manager's listening socket is named
``<tmpdir>/torch-shm-dir-XXXXXX/manager.sock``, and each connected client is one Unix
stream socket whose peer is that path.

A forked collate process (:func:`odb._process.collate_process.leave_trainer`) lets go of every
socket of its trainer, but must keep this one usable: it would otherwise fail its first
shared storage with libshm's ``Other end has closed the connection``. It cannot share
the trainer's connection either (two processes reading the manager's replies on one
stream), so :func:`reconnect` gives it its own connection to the same manager,
under the same descriptor number, which the inherited table then uses unchanged.

Every new or newly mapped ``file_system`` storage waits for the manager's answer, at most
one second (``socket.h``), and a slower answer (a busy machine: the manager not
scheduled in time) fails the storage with ``Shared memory manager connection has timed
out`` (pytorch/pytorch#42518, #129656). ODB's own storages (the hand-off's blocks) are
made by :func:`new_shared_storage` and :func:`open_shared_storage`, which try again
until :data:`MANAGER_PATIENCE_S` has passed: a failed attempt registered nothing that
lives (libshm registers a name before it creates or maps the segment), and the late
answer it left on the connection is an ``OK`` like every other, which the next
attempt reads as its own. ODB never makes a ``file_system`` storage where no retry is
possible (inside the unpickling of a process's start arguments, say).

Tracks torch 2.13 (``torch/lib/libshm``: ``core.cpp`` keeps the table, ``manager.cpp``
names the socket, ``socket.h`` times out); ``tests/odb/_process/test_torch_shm.py``
fails when that changes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Callable

import torch

MANAGER_DIR_PREFIX = "torch-shm-dir-"
MANAGER_SOCKET_NAME = "manager.sock"
# How long ODB waits in all for the manager to register one storage.
MANAGER_PATIENCE_S = 60.0
# libshm's error when the manager did not answer within its one second.
_TIMED_OUT = "Shared memory manager connection has timed out"


class ManagerTimeoutError(RuntimeError):
    """torch's shared-memory manager did not answer within ODB's patience."""


def new_shared_storage(nbytes: int, patience_s: float = MANAGER_PATIENCE_S) -> torch.UntypedStorage:
    """``torch.UntypedStorage._new_shared(nbytes)``, patient with a slow manager.

    Raises:
        ManagerTimeoutError: under ``file_system`` sharing, the manager did not answer
            within ``patience_s`` seconds.
    """
    return _patiently(lambda: torch.UntypedStorage._new_shared(nbytes), patience_s)


def open_shared_storage(
    manager: bytes, name: bytes, nbytes: int, patience_s: float = MANAGER_PATIENCE_S
) -> torch.UntypedStorage:
    """The ``file_system`` storage ``name`` of ``manager``, mapped here, patient as above.

    Raises:
        ManagerTimeoutError: the manager did not answer within ``patience_s`` seconds.
    """
    return _patiently(
        lambda: torch.UntypedStorage._new_shared_filename_cpu(manager, name, nbytes), patience_s
    )


def _patiently(make: Callable[[], torch.UntypedStorage], patience_s: float) -> torch.UntypedStorage:
    """``make()``, again after each of libshm's one-second timeouts, for ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return make()
        except RuntimeError as error:
            if _TIMED_OUT not in str(error):
                raise
            if time.monotonic() >= deadline:
                raise ManagerTimeoutError(
                    f"torch's shared-memory manager (torch_shm_manager, which the "
                    f"file_system sharing strategy registers every shared storage with) "
                    f"did not answer within {patience_s:g} s: the machine is overloaded, "
                    f"or the manager was stopped. Free some cores, or share by descriptor: "
                    f"torch.multiprocessing.set_sharing_strategy('file_descriptor')"
                ) from error


def manager_address(fd: int) -> str | None:
    """The manager socket's path if ``fd`` is a connection to a ``torch_shm_manager``."""
    with contextlib.suppress(OSError):
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        # A duplicate, so that closing the socket object leaves ``fd`` open.
        with socket.socket(fileno=os.dup(fd)) as conn:
            if conn.family != socket.AF_UNIX or conn.type != socket.SOCK_STREAM:
                return None
            peer = conn.getpeername()
        if isinstance(peer, str) and _is_manager_path(peer):
            return peer
    return None


def _is_manager_path(path: str) -> bool:
    head, name = os.path.split(path)
    return name == MANAGER_SOCKET_NAME and os.path.basename(head).startswith(MANAGER_DIR_PREFIX)


def reconnect(fd: int, address: str) -> None:
    """Make descriptor ``fd`` a new connection of this process to the manager at ``address``.

    Raises:
        OSError: the manager is gone (then no process can share through it).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(address)
        inheritable = os.get_inheritable(fd)
        os.dup2(conn.fileno(), fd, inheritable=inheritable)
