"""Pause torch's ``torch_shm_manager``, as a busy machine does, to reproduce its timeouts.

libshm waits one second for the manager to answer a new ``file_system`` storage
(``odb._process.torch_shm``); a manager stopped with ``SIGSTOP`` answers nothing until
it is continued, so every wait in between fails as a late answer does on a loaded
machine (issue 56: a spawned collate process failed this way while unpickling its start
arguments). Use it in a forked test body (``tests.forked.run_forked``), which takes the
manager with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
from collections.abc import Iterator

import torch

from odb._process import torch_shm


def connected_manager() -> int:
    """The pid of this process's ``torch_shm_manager`` (started and connected if need be)."""
    torch.multiprocessing.set_sharing_strategy("file_system")
    torch.zeros(1).share_memory_()
    for name in os.listdir("/proc/self/fd"):
        if torch_shm.manager_address(int(name)) is not None:
            with socket.socket(fileno=os.dup(int(name))) as conn:
                credentials = conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
                )
            return struct.unpack("3i", credentials)[0]
    raise AssertionError("no connection to a torch_shm_manager after sharing a tensor")


@contextlib.contextmanager
def paused_manager(pid: int, resume_after_s: float | None = None) -> Iterator[None]:
    """The manager ``pid`` stopped inside the block (continued after ``resume_after_s``
    seconds if given), and always continued at its end."""
    os.kill(pid, signal.SIGSTOP)
    timer = None
    if resume_after_s is not None:
        timer = threading.Timer(resume_after_s, os.kill, (pid, signal.SIGCONT))
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        os.kill(pid, signal.SIGCONT)
