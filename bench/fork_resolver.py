"""How often a forked child hangs at its first name lookup while its parent looks names up.

    python -m bench.fork_resolver --forks 3000 --out results/bench/fork_resolver.json

glibc's resolver lock is not reset by ``fork`` (``odb/_process/forking.py``): a child
forked while another thread holds it hangs at its first lookup. Here a thread of this
process looks up ``127.0.0.1`` without pause (as rank 0's ``TCPStore`` server does for
each connection it accepts) while the main thread forks ``--forks`` children per mode,
alternating: ``plain`` (``os.fork``) and ``checked`` (ODB's
:func:`~odb._process.forking.checked_fork_context`, whose child takes the resolver lock
before it reports). Each child looks up ``127.0.0.1`` and exits; one not gone after
``--wait-s`` is counted hung and killed. Prints JSON: per mode the forks, the hung
children, and (checked) the forks retried.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

from bench._io import emit, machine, parser, progress
from odb._process.forking import checked_fork_context

MODES = ("plain", "checked")


def _lookup() -> None:
    socket.gethostbyaddr("127.0.0.1")


def _plain_fork_hangs(wait_s: float) -> bool:
    pid = os.fork()
    if pid == 0:  # the child
        try:
            _lookup()
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


def _checked_fork_hangs(wait_s: float) -> bool:
    child = checked_fork_context().Process(target=_lookup)
    child.start()
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


def run_modes(forks: int, wait_s: float) -> dict[str, Any]:
    """``forks`` children of each mode beside a looking-up thread; counts per mode."""
    retries = _Retries()
    logging.getLogger("odb._process.forking").addHandler(retries)
    stop = threading.Event()
    looker = threading.Thread(target=lambda: [_lookup() for _ in iter(stop.is_set, True)])
    looker.start()
    tally = {mode: {"forks": 0, "hung": 0} for mode in MODES}
    try:
        for index in range(forks):
            tally["plain"]["hung"] += _plain_fork_hangs(wait_s)
            tally["checked"]["hung"] += _checked_fork_hangs(wait_s)
            for mode in MODES:
                tally[mode]["forks"] += 1
            if (index + 1) % 250 == 0 or index + 1 == forks:
                progress(
                    f"{index + 1}/{forks}: "
                    + ", ".join(f"{m} {tally[m]['hung']} hung" for m in MODES)
                    + f", checked retried {retries.count}"
                )
    finally:
        stop.set()
        looker.join()
    tally["checked"]["retried"] = retries.count
    return tally


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--forks", type=int, default=1000, help="children per mode (default 1000)")
    p.add_argument("--wait-s", type=float, default=10.0, help="a child alive this long hangs")
    args = p.parse_args(argv)
    if args.forks < 1:
        p.error(f"--forks must be at least 1, got {args.forks}")
    if args.wait_s <= 0:
        p.error(f"--wait-s must be positive, got {args.wait_s}")
    modes = run_modes(args.forks, args.wait_s)
    result = {"forks_per_mode": args.forks, "wait_s": args.wait_s, "modes": modes}
    emit(result | {"machine": machine()}, args.out)
    return modes


if __name__ == "__main__":
    main()
