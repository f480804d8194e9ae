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

Tracks torch 2.13 (``torch/lib/libshm``: ``core.cpp`` keeps the table, ``manager.cpp``
names the socket); ``tests/odb/_process/test_torch_shm.py`` fails when that changes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

MANAGER_DIR_PREFIX = "torch-shm-dir-"
MANAGER_SOCKET_NAME = "manager.sock"


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
