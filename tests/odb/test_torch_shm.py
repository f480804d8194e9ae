"""What ``odb.torch_shm`` relies on of torch's libshm, and a forked child's own connection.

The first test fails when torch changes how a process connects to ``torch_shm_manager``
(``odb/torch_shm.py`` names the version it tracks).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from odb import torch_shm
from odb.collate_process import leave_trainer
from odb.forking import checked_fork_context
from tests.odb.trainer_settings_script import sharing_strategy


def _manager_connections() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        address = torch_shm.manager_address(int(name))
        if address is not None:
            found[int(name)] = address
    return found


def _socket_inode(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def test_torch_connects_to_its_manager_as_tracked() -> None:
    with sharing_strategy("file_system"):
        shared = torch.zeros(4).share_memory_()
        handle, _, _ = shared.untyped_storage()._share_filename_cpu_()
        connections = _manager_connections()
    # One connection per manager, to the socket whose path is the storages' handle.
    assert list(connections.values()) == [handle.decode()], connections


def _child_shares(out: Any) -> None:
    leave_trainer()
    shared = torch.arange(6, dtype=torch.float32).share_memory_()
    connections = _manager_connections()
    out.put((connections, {fd: _socket_inode(fd) for fd in connections}, shared))


def test_a_forked_child_shares_through_its_own_connection_to_the_same_manager() -> None:
    ctx = checked_fork_context()
    with sharing_strategy("file_system"):
        torch.zeros(4).share_memory_()  # this process talks to the manager before the fork
        ((fd, address),) = _manager_connections().items()
        out = ctx.SimpleQueue()
        child = ctx.Process(target=_child_shares, args=(out,))
        child.start()
        connections, inodes, shared = out.get()
        child.join(10)
    assert child.exitcode == 0
    assert torch.equal(shared, torch.arange(6, dtype=torch.float32))
    # The same descriptor number (libshm's table holds it) and manager, a new connection.
    assert connections == {fd: address}
    assert inodes[fd] != _socket_inode(fd), "the child shares the parent's connection"
