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
from tests.shm_manager import connected_manager, paused_manager


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


def _storages_wait_for_a_paused_manager() -> dict[str, Any]:
    pid = connected_manager()
    found: dict[str, Any] = {}
    with paused_manager(pid):
        try:  # libshm alone: the reproducer reproduces
            torch.UntypedStorage._new_shared(16)
        except RuntimeError as error:
            found["libshm"] = str(error).splitlines()[0]
    shared = torch.arange(4, dtype=torch.uint8).share_memory_()
    handle = shared.untyped_storage()._share_filename_cpu_()
    with paused_manager(pid, resume_after_s=2.5):
        made = torch_shm.new_shared_storage(16)
    with paused_manager(pid, resume_after_s=2.5):
        opened = torch_shm.open_shared_storage(*handle)
    # The late answers left on the connection do not confuse later storages.
    later = [torch_shm.new_shared_storage(8) for _ in range(3)]
    found["made"] = made.nbytes()
    found["opened"] = bytes(opened.tolist()) == bytes(range(4))
    found["later"] = [s.nbytes() for s in later]
    return found


@pytest.mark.dist
def test_odbs_storages_wait_for_a_paused_manager() -> None:
    """Issue 56's reproducer, made deterministic: the manager stopped past libshm's
    one-second wait fails torch's own call and not ODB's, which waits it out."""
    found = run_forked(_storages_wait_for_a_paused_manager)
    assert found["libshm"] == torch_shm._TIMED_OUT
    assert found["made"] == 16
    assert found["opened"]
    assert found["later"] == [8, 8, 8]


def _a_manager_that_never_answers() -> str:
    with paused_manager(connected_manager()):
        with pytest.raises(torch_shm.ManagerTimeoutError) as raised:
            torch_shm.new_shared_storage(16, patience_s=2.0)
    return str(raised.value)


@pytest.mark.dist
def test_a_manager_that_never_answers_is_named_with_what_to_change() -> None:
    message = run_forked(_a_manager_that_never_answers)
    assert "torch_shm_manager" in message and "within 2 s" in message
    assert "set_sharing_strategy('file_descriptor')" in message
