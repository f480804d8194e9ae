"""This process's handle on one rank process, and the wait for a set of them to reach a stage.

A rank reports, in order, ``started``, ``ready``, ``done`` and ``clean`` as it goes
through a call (:mod:`harness.rank_process`), or ``failed``. A fresh rank is a child of
this process; a pooled one is detached, so its death is seen by polling.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import time
from collections.abc import Sequence
from typing import Any

import psutil

from harness.processes import is_dead, kill_tree, wait_dead
from harness.rank_process import serve

# After the first failing rank, peers blocked in a collective cannot finish on their own;
# give healthy peers this long to exit before they are treated as hung and killed.
_FAILURE_GRACE_S = 2.0
# A pooled rank is no child of this process, so its death shows in nothing this process
# can wait on: the wait for ranks looks again this often.
_POLL_S = 0.1
# What a rank reports, in order, as it goes through a call (harness/rank_process.py).
_STAGES = ("started", "ready", "done", "clean")


# Every rank process this process has started, pooled or fresh, alive or not.
_STARTED_PIDS: set[int] = set()


def started_rank_pids() -> set[int]:
    """The ids of every rank process this process has started (a pooled rank is no
    child of it: this is how an audit of what the ranks leave finds them)."""
    return set(_STARTED_PIDS)


class RankHandle:
    """This process's handle on one rank process (:func:`harness.rank_process.serve`).

    A fresh rank is a child of this process. A pooled rank is detached (no child of this
    process): its death is seen by polling, and its exit code is never known.
    """

    def __init__(self, detach: bool) -> None:
        ctx = mp.get_context("spawn")
        self._from_rank, child_out = ctx.Pipe(duplex=False)
        child_in, self._to_rank = ctx.Pipe(duplex=False)
        self._launcher = ctx.Process(target=serve, args=(child_in, child_out, detach), name="rank")
        self._launcher.start()
        child_in.close()
        child_out.close()
        self.detached = detach
        self.pid: int | None = None  # known once the rank says it has started
        self._proc: psutil.Process | None = None
        self.said = ""  # the kind of the last message
        self.reasons: list[str] = []  # why a pooled rank is unfit for another call
        if not detach:
            self._started(self._launcher.pid)  # the launcher is the rank

    @classmethod
    def fresh(cls, n: int) -> list[RankHandle]:
        """``n`` newly spawned ranks, children of this process, that exit after one call."""
        return [cls(detach=False) for _ in range(n)]

    def read(self) -> None:
        """Take in every message the rank has sent since the last read."""
        while not self._from_rank.closed and self._from_rank.poll():
            try:
                kind, *rest = self._from_rank.recv()
            except EOFError:
                self._from_rank.close()  # the rank and every holder of its pipe are gone
                return
            if kind == "started":
                self._started(rest[0])
            elif kind == "clean":
                self.reasons = rest[0]
            self.said = kind

    def _started(self, pid: int) -> None:
        self.pid = pid
        _STARTED_PIDS.add(pid)
        with contextlib.suppress(psutil.NoSuchProcess):  # already gone: alive() says so
            self._proc = psutil.Process(pid)
        if self.detached:
            self._launcher.join()  # it exits right after reporting its fork

    def alive(self) -> bool:
        if self.detached and self.pid is None and self._launcher.exitcode is not None:
            self.read()  # a launcher reports its fork before it exits
        if not self.detached or self.pid is None:
            return self._launcher.exitcode is None
        return self._proc is not None and not is_dead(self._proc)

    def reached(self, stage: str) -> bool:
        """Whether the rank has got to ``stage`` (one of _STAGES, or "gone": exited)."""
        if stage == "gone":
            return not self.alive()
        return self.said in _STAGES and _STAGES.index(self.said) >= _STAGES.index(stage)

    def failed(self, stage: str) -> bool:
        """Whether the rank reported an error, or died before ``stage``."""
        if self.said == "failed" or stage == "gone" or self.alive():
            return self.said == "failed"
        self.read()  # what it said before it died
        return self.said == "failed" or not self.reached(stage)

    def waitables(self) -> list[Any]:
        """What :func:`multiprocessing.connection.wait` can wait on for this rank."""
        out: list[Any] = [] if self._from_rank.closed else [self._from_rank]
        return out + ([self._launcher.sentinel] if self._launcher.exitcode is None else [])

    def call(self, workdir: str, number: int) -> None:
        """Hand the rank the call in ``workdir`` as rank ``number``."""
        self.said, self.reasons = "", []  # what it says from now on is about this call
        self.send(("call", workdir, number))

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # the rank is gone: waiting for it says so
            self._to_rank.send(message)

    def signal(self, signum: int) -> None:
        if self._proc is not None:
            with contextlib.suppress(psutil.Error):
                self._proc.send_signal(signum)

    def exit_code(self) -> int | None:
        """A fresh rank's exit code once it has exited; None for a pooled rank or one alive."""
        return None if self.detached else self._launcher.exitcode

    def ended(self) -> str:
        """How the rank ended, for a failure message."""
        if self.detached:
            return "died (a pooled rank, no child of the test process: exit code unknown)"
        return f"exited with code {self._launcher.exitcode} (negative codes are signals)"

    def kill(self) -> None:
        """SIGKILL the rank, its descendants and its process group; return once dead."""
        self.read()
        if self.pid is None:  # a launcher that has not reported its fork yet
            self._launcher.kill()
            self._launcher.join()
            self.read()
        if self.pid is not None:
            live = [self.pid] if self._proc is not None and not is_dead(self._proc) else []
            kill_tree(live, groups=[self.pid])
            self._launcher.join()  # reaps a fresh rank; a pooled rank's launcher is gone
            wait_dead([self._proc] if self._proc is not None else [], 5.0)
        self._from_rank.close()
        self._to_rank.close()


def wait_for_stage(
    ranks: Sequence[RankHandle], stage: str, deadline: float
) -> tuple[list[int], list[int]]:
    """Wait until every rank has reached ``stage``; return (failed, hung) rank numbers.

    A rank fails by reporting an error or by dying first. After the first failure the
    others get ``_FAILURE_GRACE_S``; those still short of ``stage`` then, or at
    ``deadline``, are hung.
    """
    first_failure = None
    while True:
        for rank in ranks:
            rank.read()
        failed = [n for n, rank in enumerate(ranks) if rank.failed(stage)]
        pending = [n for n, r in enumerate(ranks) if n not in failed and not r.reached(stage)]
        now = time.monotonic()
        if failed and first_failure is None:
            first_failure = now
        limit = deadline
        if first_failure is not None:
            limit = min(deadline, first_failure + _FAILURE_GRACE_S)
        if not pending or now >= limit:
            return failed, pending
        waitables = [w for n in pending for w in ranks[n].waitables()]
        mp.connection.wait(waitables, timeout=min(limit - now, _POLL_S))
