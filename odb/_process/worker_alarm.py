"""A DataLoader worker's death, raised in a collate process's read until the read ends.

A worker killed while it writes a message longer than a pipe holds leaves half of it in
the DataLoader's result pipe; the collate process's main thread, reading it, then waits
for bytes that never come. Only a signal gets it out: PyTorch's SIGCHLD handler raises
in the main thread when a worker dies, which interrupts the read. But PyTorch reports
each death once, and that one raise lands wherever the main thread is when SIGCHLD
arrives: in a finalizer (a ``__del__``, a weak-reference callback), where Python drops
it, it is lost, and the read that follows never ends (seen about once in 250 kills
under load). :class:`WorkerAlarm` closes that gap for one epoch: while the main thread
is inside a read (:meth:`WorkerAlarm.reading`) and a worker has died, a watcher thread
signals the main thread every :data:`POKE_S`, and the SIGCHLD handler (PyTorch's,
wrapped) raises each time, until the read is left.

Main thread only (Python runs signal handlers there); elsewhere every method is a no-op.
Workers are checked with ``waitid(WNOWAIT)``: nothing is reaped here, so PyTorch's own
bookkeeping still finds the dead worker and names it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

POKE_S = 0.5
"""How often the main thread is signalled while it reads and a worker is dead."""


class WorkerAlarm:
    """Raise a dead DataLoader worker in the main thread's reads, for one epoch.

    Args:
        pids: the epoch's DataLoader worker processes.

    Use :meth:`reading` around every read of the DataLoader, and :meth:`close` before
    the epoch's workers are shut down (the shutdown may stop one by a signal, which is
    no failure). Inactive (no handler, no thread) outside the main thread or without
    workers.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = list(pids)
        self._reading = False
        self._closed = threading.Event()
        self._previous: Any = None
        self._watcher: threading.Thread | None = None
        if self._pids and threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGCHLD)
            signal.signal(signal.SIGCHLD, self._handle)
            self._watcher = threading.Thread(target=self._watch, name="odb-worker-alarm")
            self._watcher.daemon = True
            self._watcher.start()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Mark a read of the DataLoader: a dead worker raises inside it."""
        self._reading = True
        try:
            yield
        finally:
            self._reading = False

    def close(self) -> None:
        """Stop watching; put back the SIGCHLD handler found, unless replaced since."""
        self._reading = False
        self._closed.set()
        if self._watcher is None:
            return
        self._watcher.join()  # ends at once: nothing forks beside it afterwards
        self._watcher = None
        if signal.getsignal(signal.SIGCHLD) == self._handle:
            signal.signal(signal.SIGCHLD, self._previous)

    def dead_worker(self) -> str | None:
        """How the first worker found dead ended (``None`` if every one is alive)."""
        for pid in self._pids:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped already: its death was seen where it was
                continue
            if info is None:
                continue
            if info.si_code == os.CLD_EXITED:
                if info.si_status != 0:
                    return f"DataLoader worker (pid {pid}) exited with code {info.si_status}"
            else:
                name = signal.Signals(info.si_status).name
                return f"DataLoader worker (pid {pid}) was killed by signal {name}"
        return None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if callable(self._previous):
            self._previous(signum, frame)  # PyTorch's: raises the first time a worker dies
        if self._reading and (dead := self.dead_worker()) is not None:
            raise RuntimeError(
                f"{dead} while the collate process read its samples; was it killed (OOM "
                "killer, signal)?"
            )

    def _watch(self) -> None:
        main = threading.main_thread().ident
        assert main is not None
        while not self._closed.wait(POKE_S):
            if self._reading and self.dead_worker() is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pthread_kill(main, signal.SIGCHLD)
