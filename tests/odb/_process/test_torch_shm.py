"""What ``odb._process.torch_shm`` relies on of torch's libshm, and a forked child's own connection.

The first test fails when torch changes how a process connects to ``torch_shm_manager``
(``odb/_process/torch_shm.py`` names the version it tracks). Each runs in a forked child, which
takes its manager with it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from odb._process import torch_shm
from odb._process.collate_process import leave_trainer
from odb._process.forking import checked_fork_context
from tests.forked import run_forked


def _manager_connections() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        address = torch_shm.manager_address(int(name))
        if address is not None:
            found[int(name)] = address
    return found


def _socket_inode(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _connections_and_handle() -> tuple[list[str], str]:
    torch.multiprocessing.set_sharing_strategy("file_system")
    shared = torch.zeros(4).share_memory_()
    handle, _, _ = shared.untyped_storage()._share_filename_cpu_()
    return list(_manager_connections().values()), handle.decode()


@pytest.mark.dist
def test_torch_connects_to_its_manager_as_tracked() -> None:
    connections, handle = run_forked(_connections_and_handle)
    # One connection per manager, to the socket whose path is the storages' handle.
    assert connections == [handle], connections


def _child_shares(out: Any) -> None:
    leave_trainer()
    shared = torch.arange(6, dtype=torch.float32).share_memory_()
    connections = _manager_connections()
    out.put((connections, {fd: _socket_inode(fd) for fd in connections}, shared))


def _fork_after_sharing() -> dict[str, Any]:
    torch.multiprocessing.set_sharing_strategy("file_system")
    torch.zeros(4).share_memory_()  # this process talks to the manager before the fork
    ((fd, address),) = _manager_connections().items()
    ctx = checked_fork_context()
    out = ctx.SimpleQueue()
    child = ctx.Process(target=_child_shares, args=(out,))
    child.start()
    connections, inodes, shared = out.get()
    child.join(10)
    return {
        "exitcode": child.exitcode,
        "shared": shared.tolist(),
        "expected": {fd: address},
        "connections": connections,
        "new_connection": inodes[fd] != _socket_inode(fd),
    }


@pytest.mark.dist
def test_a_forked_child_shares_through_its_own_connection_to_the_same_manager() -> None:
    found = run_forked(_fork_after_sharing)
    assert found["exitcode"] == 0
    assert found["shared"] == list(range(6))
    # The same descriptor number (libshm's table holds it) and manager, a new connection.
    assert found["connections"] == found["expected"]
    assert found["new_connection"], "the child shares the parent's connection"
