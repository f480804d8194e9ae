"""What the trainer says about its collate side's processes when something goes wrong.

Descriptions for error messages (which processes are alive under the collate side,
their state and kernel wait channel; how a process ended) and the removal of
shared-memory files a killed process left half-made. Read-only apart from that removal;
no decisions are made here. Process trees come from ``psutil`` when it is installed
(optional: ``odb`` needs only torch); without it the description says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any


def describe_descendants(root: int | None) -> str:
    """``pid name (state, kernel wait)`` of every live descendant of ``root``, for errors.

    A worker stuck in a lock shows a futex wait; one stuck in I/O, its read or poll (the
    wait channel is Linux's ``/proc/<pid>/wchan``, ``-`` elsewhere).
    """
    if root is None:
        return "unknown (no process)"
    try:
        import psutil
    except ImportError:
        return "unknown (install psutil to list them)"
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return f"unknown ({root} is gone)"
    found = [_describe(child) for child in children]
    return "; ".join(found) if found else "none"


def _describe(process: Any) -> str:
    import psutil

    try:
        name, state = process.name(), process.status()
    except psutil.Error:
        return f"{process.pid} (gone)"
    wchan = "-"
    with contextlib.suppress(OSError):
        with open(f"/proc/{process.pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    return f"{process.pid} {name} ({state}, {wchan})"


def death_message(where: str, exitcode: int | None) -> str:
    """Why a collate process is gone, from its exit code, and what to change."""
    how = f"exit code {exitcode}"
    if isinstance(exitcode, int) and exitcode < 0:
        with contextlib.suppress(ValueError):
            how = f"killed by signal {signal.Signals(-exitcode).name}, exit code {exitcode}"
    return (
        f"{where} exited unexpectedly ({how}); if it was killed by the OOM "
        "killer, lower buffer_size or queue_depth"
    )


def remove_shm_of(pid: int | None) -> None:
    """Remove shared-memory files a signal-killed process (collate, worker) left half-made.

    torch names a segment ``torch_<pid>_...`` and unlinks it as soon as it is mapped, so
    a named file left by a dead process is one it was killed in the middle of making;
    whoever holds the segment keeps it through its descriptor.
    """
    if pid is None or not os.path.isdir("/dev/shm"):
        return
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"torch_{pid}_"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
