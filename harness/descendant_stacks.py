"""Stacks of a hung rank's descendants (its collate processes, DataLoader workers), for
the hang report of :mod:`harness.ranks`.

A rank's own stacks come from faulthandler on SIGUSR1
(:func:`harness.rank_process.arm_stack_dump`). A hang is as often in a process the rank
started: a collate process that never joined its group leaves its peers waiting, and
the rank that started it waits on its pipe. Each descendant is read with ``py-spy dump
--native`` (a pin of the artifact's environment): every thread's Python frames with the
native frames between them, so a wait on a lock taken in C++ shows as such. It pauses
the process only while it reads, and needs no cooperation from it (a spawned process,
a process stuck before it ran any Python).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil

# Longest a dump may take per process (py-spy reads one in well under a second).
_DUMP_TIMEOUT_S = 20.0


def descendant_stacks(pid: int) -> str:
    """Every live descendant of ``pid``, each with its threads' stacks."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return f"(no descendants read: process {pid} is gone)"
    if not children:
        return "(no live descendants)"
    return "\n\n".join(process_stacks(child.pid) for child in children)


def process_stacks(pid: int) -> str:
    """``py-spy dump --native`` of ``pid``: its command line, then each thread's stack."""
    spy = _py_spy()
    if spy is None:
        return f"pid {pid}: (py-spy is not installed: no stacks)"
    command = [spy, "dump", "--native", "--pid", str(pid)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_DUMP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"pid {pid}: (py-spy did not finish within {_DUMP_TIMEOUT_S:.0f} s)"
    if done.returncode != 0:
        return f"pid {pid}: (py-spy failed: {done.stderr.strip()[-300:]})"
    return done.stdout.strip()


def _py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's), else on ``PATH``."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")
