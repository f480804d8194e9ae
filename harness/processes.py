"""Processes and ports of the launchers: kill a process tree, wait for death, pick a port.

Shared by :func:`harness.ranks.run_ranks` and :func:`harness.torchrun.run_torchrun`, so
that whatever a test starts is dead when the helper returns or raises.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Sequence
from datetime import timedelta

import psutil
import torch.distributed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then release).

    Another process can take it before the caller binds it: only for programs that
    cannot bind port 0 themselves (:func:`host_store` and ``torchrun --standalone`` can).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_store(timeout_s: float) -> torch.distributed.TCPStore:
    """The rendezvous store of ranks started by this module, on 127.0.0.1.

    Bound here on a port the OS picks; the caller holds it until its ranks are gone, so
    no other process can take the port between choosing it and the ranks joining (as a
    port found free and released could be). Pass ``store.port`` to the ranks.
    """
    return torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _descendants(pids: Sequence[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs.extend(proc.children(recursive=True))
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    return procs


def kill_tree(pids: Sequence[int], groups: Sequence[int] = ()) -> None:
    """SIGKILL live processes ``pids``, all their descendants and process groups ``groups``.

    Only pass pids of processes that are still running and not yet reaped; a reaped pid
    may already belong to an unrelated process.
    """
    # Collect the whole tree before killing anything: once a parent dies its children
    # are re-parented and can no longer be found through it.
    procs = _descendants(pids)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty: nothing left behind
    # The roots are reaped by their owners (Process.join, Popen.communicate); reaping
    # them here would hide their exit codes. Descendants only need to be dead: a zombie
    # is, whoever reaps it later.
    roots = set(pids)
    wait_dead([p for p in procs if p.pid not in roots], 5.0)


def wait_dead(procs: Sequence[psutil.Process], limit_s: float) -> None:
    """Return once every one of ``procs`` is dead (a zombie counts), or after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not is_dead(p)]
        if pending:
            time.sleep(0.02)


def is_dead(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited (a zombie counts: it runs nothing any more)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
