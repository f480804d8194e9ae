"""Run a script or module under ``torchrun`` on this machine, with a hard wall-clock limit.

The launcher and its workers share one process group, killed whole at the limit or when
the caller is interrupted; the failure message holds the output so far.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

from harness.descendant_stacks import descendant_stacks
from harness.processes import kill_tree

_PROGRESS_BAR = re.compile(r"\d+%\|.*\||\[\d\d:\d\d<")


def torchrun_command(
    target: str | os.PathLike[str], world_size: int, args: Sequence[str] = (), module: bool = False
) -> list[str]:
    """``torchrun --standalone --local-addr 127.0.0.1 --nproc_per_node world_size target``.

    ``--standalone``: the launcher's rendezvous store, which its workers join, binds a
    port the OS picks on 127.0.0.1 (``--local-addr``: the host name may not resolve
    to this machine) and holds it, so no other process can take it between choosing
    and binding (as a port found free and released could be). With ``module=True``,
    ``target`` is a module name run as ``torchrun -m``.
    """
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr",
        "127.0.0.1", "--nproc_per_node", str(world_size), *(["-m"] if module else []),
        str(target), *args,
    ]  # fmt: skip


def without_progress_bars(text: str) -> str:
    """``text`` without tqdm's progress-bar lines (``\\r``- or newline-separated): what a
    failure message should show of a run's stderr, whose tail is otherwise all bars."""
    lines = text.replace("\r", "\n").split("\n")
    return "\n".join(
        line for line in lines if line.strip() and not _PROGRESS_BAR.search(line)
    )


def run_torchrun(
    script_path: str | os.PathLike[str],
    world_size: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    module: bool = False,
) -> tuple[int, str, str]:
    """Run ``script_path`` under :func:`torchrun_command` (``module=True``: a module name).

    Returns:
        ``(returncode, stdout, stderr)`` of the launcher.

    Raises:
        AssertionError: still running after ``timeout`` seconds; the launcher and all
            its workers are killed first, and the message holds the output so far and
            the stacks of the launcher's descendants (:mod:`harness.descendant_stacks`).

    Example:
        >>> code, out, err = run_torchrun("train_tiny.py", 2, ["--steps", "3"], timeout=60)
    """
    cmd = torchrun_command(script_path, world_size, args, module)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A rank killed by a fatal signal (an abort at exit) prints every thread's stack.
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
        start_new_session=True,  # the launcher and its workers share one killable group
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = descendant_stacks(proc.pid)  # the workers, their collate processes
        kill_tree([proc.pid], groups=[proc.pid])
        out, err = proc.communicate()
        raise AssertionError(
            f"torchrun ({world_size} ranks) still running after {timeout:.1f} s; killed.\n"
            f"command: {' '.join(cmd)}\n--- stdout ---\n{out[-4000:]}\n"
            f"--- stderr ---\n{err[-4000:]}\n--- the launcher's descendants (py-spy) ---\n"
            f"{stacks}"
        ) from None
    except BaseException:
        kill_tree([proc.pid], groups=[proc.pid])
        proc.communicate()
        raise
    kill_tree([], groups=[proc.pid])  # workers a crashed launcher may have left behind
    return proc.returncode, out, err
