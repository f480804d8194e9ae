"""One repeat of a pytest selection with a hard limit, and the busy processes beside it.

:func:`run_limited` runs ``pytest`` in its own session; a run still going at the limit
is a hang: pytest's own ``faulthandler_timeout`` has printed every thread's stack of
the pytest process shortly before, the process tree's states (each thread's kernel
wait) are read from ``/proc`` and every process's stacks with py-spy
(:mod:`harness.descendant_stacks`), all are saved, and the whole session is killed.
:class:`Load` starts busy processes and stops them, whatever happens between.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from harness.descendant_stacks import descendant_stacks, process_stacks

# pytest dumps its threads' stacks this long before the repeat's limit.
_DUMP_MARGIN_S = 20.0


def pytest_command(selection: list[str], junit: Path, limit_s: float) -> list[str]:
    """The repeat's command: quiet, no cache, a JUnit report, stacks dumped before the limit."""
    dump = max(limit_s - _DUMP_MARGIN_S, limit_s / 2)
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", f"faulthandler_timeout={dump:.0f}", *selection,
    ]  # fmt: skip


def run_limited(cmd: list[str], limit_s: float, log: Path) -> tuple[int | None, float]:
    """Run ``cmd`` with its output in ``log``; ``(exit code, wall_s)``, None for a hang.

    A hang appends the process tree's state to ``log`` and kills the session.
    """
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
            out.write(f"\n=== HANG: still running after {limit_s} s; the process tree ===\n")
            out.write(describe_tree(proc.pid))
            out.write("\n=== each process's stacks (py-spy) ===\n")
            out.write(process_stacks(proc.pid) + "\n\n" + descendant_stacks(proc.pid) + "\n")
            out.flush()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return code, round(time.perf_counter() - started, 1)


def describe_tree(pid: int) -> str:
    """Every process under ``pid``: command line, state, and each thread's kernel wait."""
    lines = []
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return "(gone)\n"
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            lines.append(f"pid {proc.pid} ppid {proc.ppid()} {proc.status()}: "
                         + " ".join(proc.cmdline())[:300])  # fmt: skip
            for task in sorted(os.listdir(f"/proc/{proc.pid}/task"), key=int):
                lines.append(f"    task {task} {_read(proc.pid, task, 'comm')}: "
                             f"wchan {_read(proc.pid, task, 'wchan')}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _read(pid: int, task: str, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/task/{task}/{name}").read_text().strip()
    except OSError:
        return "?"


class Load:
    """``n`` busy processes (``while True: pass``) beside the repeats; a context manager.

    They are stopped at exit, by their own ids, however the block ends.
    """

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"load must be >= 0 busy processes, got {n}")
        self.n = n
        self._procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Load:
        cmd = [sys.executable, "-c", "while True: pass"]
        self._procs = [subprocess.Popen(cmd) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs = []

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]
