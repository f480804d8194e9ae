"""How often a forked child hangs on a lock another thread of its parent held at the fork.

    python -m bench.fork_resolver --forks 3000 --out results/bench/fork_resolver.json
    python -m bench.fork_resolver --lock generator --forks 1000

Neither lock is reset by ``fork`` (``odb/_process/forking.py``); a child forked while
another thread holds one hangs at its first use of it. ``--lock resolver`` (glibc's
resolver lock): a thread of this process looks up ``127.0.0.1`` without pause (as rank
0's ``TCPStore`` server does for each connection it accepts), and each child looks it up.
``--lock generator`` (torch's CPU generator mutex): a thread draws 64 x 64
``torch.randn`` without pause (the worst case: it holds the mutex most of the time), and
each child draws. Meanwhile the main thread forks ``--forks`` children per mode, alternating:
``plain`` (``os.fork``) and ``checked`` (ODB's
:func:`~odb._process.forking.checked_fork_context`, whose child takes both locks before
it reports). A child not gone after ``--wait-s`` is counted hung and killed. Prints
JSON: per mode the forks, the hung children, and (checked) the forks retried and the
starts given up (every attempt stuck: ``ForkDeadlockError``, a clear error).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from bench._io import emit, machine, parser, progress
from odb._process.forking import ForkDeadlockError, checked_fork_context

MODES = ("plain", "checked")


def _lookup() -> None:
    socket.gethostbyaddr("127.0.0.1")


def _draw() -> None:
    torch.randn(64, 64)


# Per lock: what the holding thread (without pause) and each child do.
LOCKS: dict[str, Callable[[], None]] = {"resolver": _lookup, "generator": _draw}


def _plain_fork_hangs(use: Callable[[], None], wait_s: float) -> bool:
    pid = os.fork()
    if pid == 0:  # the child
        try:
            use()
        finally:
            os._exit(0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return True


def _checked_fork_hangs(use: Callable[[], None], wait_s: float) -> bool | None:
    """Whether the child hung; None when the start gave up (every attempt stuck)."""
    child = checked_fork_context().Process(target=use)
    try:
        child.start()
    except ForkDeadlockError:
        return None
    child.join(wait_s)
    if child.is_alive():
        child.kill()
        child.join()
        return True
    return False


class _Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _hold(use: Callable[[], None], stop: threading.Event) -> None:
    while not stop.is_set():
        use()


def run_modes(forks: int, wait_s: float, lock: str = "resolver") -> dict[str, Any]:
    """``forks`` children of each mode beside a thread using ``lock``; counts per mode."""
    use = LOCKS[lock]
    retries = _Retries()
    logging.getLogger("odb._process.forking").addHandler(retries)
    stop = threading.Event()
    holder = threading.Thread(target=_hold, args=(use, stop))
    holder.start()
    tally = {mode: {"forks": 0, "hung": 0} for mode in MODES}
    tally["checked"]["gave_up"] = 0
    try:
        for index in range(forks):
            tally["plain"]["hung"] += _plain_fork_hangs(use, wait_s)
            checked = _checked_fork_hangs(use, wait_s)
            tally["checked"]["hung"] += bool(checked)
            tally["checked"]["gave_up"] += checked is None
            for mode in MODES:
                tally[mode]["forks"] += 1
            if (index + 1) % max(1, forks // 10) == 0 or index + 1 == forks:
                progress(
                    f"{index + 1}/{forks}: "
                    + ", ".join(f"{m} {tally[m]['hung']} hung" for m in MODES)
                    + f", checked retried {retries.count}"
                )
    finally:
        stop.set()
        holder.join()
    tally["checked"]["retried"] = retries.count
    return tally


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--forks", type=int, default=1000, help="children per mode (default 1000)")
    p.add_argument("--wait-s", type=float, default=10.0, help="a child alive this long hangs")
    p.add_argument("--lock", choices=sorted(LOCKS), default="resolver", help="the held lock")
    args = p.parse_args(argv)
    if args.forks < 1:
        p.error(f"--forks must be at least 1, got {args.forks}")
    if args.wait_s <= 0:
        p.error(f"--wait-s must be positive, got {args.wait_s}")
    modes = run_modes(args.forks, args.wait_s, args.lock)
    result = dict(lock=args.lock, forks_per_mode=args.forks, wait_s=args.wait_s, modes=modes)
    emit(result | {"machine": machine()}, args.out)
    return modes


if __name__ == "__main__":
    main()
