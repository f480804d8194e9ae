"""The trainer's side of a loader's collate side: its lifecycle and its error contract.

:class:`CollateRunner` starts the collate side (:mod:`odb._process.collate_body`)
through a transport (:mod:`odb._process.trainer_transport`: a dedicated collate process
per rank, or a thread), sends it one epoch per :meth:`~CollateRunner.begin`, hands its
batches to the loader, and turns every way it can fail into an error in time; the
descriptions in those errors come from :mod:`odb._process.diagnostics`.
:class:`RunnerKeeper` keeps a loader's runner between epochs: reused after an epoch that
ended cleanly, closed after anything else (an error, an iterator abandoned mid-epoch),
so a new epoch never sees an old epoch's messages.
Failure contract (``docs/reliability.md`` has the full table):

- an exception on the collate side (or in a worker, which the DataLoader re-raises
  there) is sent to the trainer and re-raised with its original type and the remote
  traceback attached; before that, the collate side leaves the alignment group and
  leaves a note naming the error in the rendezvous store, so the peers' collectives fail
  at once and say which rank failed first;
- a collate process that dies without a word (SIGKILL, OOM) is reported with its exit
  code or signal, also when it dies while a batch is in flight;
- a collate process whose trainer dies exits by itself within ``_WATCHDOG_S`` of
  :mod:`odb._process.collate_process` (parent watchdog), so no orphan keeps Gloo connections or
  shared memory alive; its DataLoader workers follow by PyTorch's own watchdog;
- with more than one rank, a trainer waiting for a collate side that makes no progress
  at all (no sample read, no collective finished, no group collated) for
  ``align_timeout_s`` plus a grace raises :class:`~odb._process.comm.AlignmentTimeoutError`
  instead of waiting forever (a stuck ``__getitem__`` or worker; its peers time out
  at ``align_timeout_s`` anyway);
- the collate process ignores SIGINT: Ctrl-C interrupts the trainer, whose iterator
  cleanup stops the collate side (as PyTorch's DataLoader workers do).
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import pickle
import queue
import time
import warnings
import weakref
from typing import Any

from odb._process.comm import AlignmentTimeoutError
from odb._process.diagnostics import describe_descendants
from odb._process.gil_handoff import hand_over_gil
from odb._process.messages import CollateSpec, EpochJob, EpochResult
from odb._process.rendezvous import Rendezvous, close_store_hosts
from odb._process.trainer_transport import Transport, open_transport
from odb.core.config import ODBConfig

# A trainer waiting on a collate side without progress raises after align_timeout_s
# plus this (the peers' own collectives have timed out by then).
_STALL_GRACE_S = 5.0
# Before the alignment group exists (process start-up, rendezvous), the limit is
# init_timeout_s plus this.
_STARTUP_GRACE_S = 30.0
_LIVE_RUNNERS: weakref.WeakSet[CollateRunner] = weakref.WeakSet()


_EXIT_FINALIZER_PID = 0  # the process that registered _close_live_runners as a finalizer


@atexit.register
def _close_live_runners() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: a collate
    # process still waiting for its trainer would otherwise block interpreter exit.
    # All are told first, so their stops overlap (a collate thread's peers stop too);
    # then each is joined (a thread until it has ended: none may run at finalization).
    # Idempotent: it also runs as a multiprocessing finalizer (_register_exit_finalizer).
    # Then the rendezvous stores this process hosts (rank 0): once no collate side of
    # this process uses them, their server threads are joined before finalization.
    # Last, Gloo's worker threads of groups still alive (the trainer's own) get the GIL
    # to drop their last collective's tensors while Python can still give it.
    runners = list(_LIVE_RUNNERS)
    for runner in runners:
        runner.request_stop()
    for runner in runners:
        runner.close(timeout_s=1.0)
    close_store_hosts()
    hand_over_gil()


def _register_exit_finalizer() -> None:
    """Run :func:`_close_live_runners` before multiprocessing joins this process's children.

    A process that multiprocessing started (a ``torch.multiprocessing.spawn`` rank, a
    ``Process`` target) joins its non-daemon children when its target returns, before
    any atexit hook; a collate process (non-daemon: it has DataLoader workers) whose
    loader is still referenced then waits for its trainer forever, and the rank never
    exits. Finalizers of priority >= 0 run before that join. Once per process: a forked
    child starts with none.
    """
    global _EXIT_FINALIZER_PID
    if _EXIT_FINALIZER_PID != os.getpid():
        multiprocessing.util.Finalize(None, _close_live_runners, exitpriority=100)
        _EXIT_FINALIZER_PID = os.getpid()


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on the collate side."""

    def __str__(self) -> str:
        return self.args[0]


def _unpack_error(packed: tuple[bytes | None, str, str], where: str) -> BaseException:
    blob, summary, text = packed
    exc = pickle.loads(blob) if blob is not None else RuntimeError(f"{where} raised {summary}")
    exc.__cause__ = RemoteTraceback(f"\n\nTraceback on {where}:\n{text}")
    return exc


class CollateRunner:
    """Starts a rank's collate side, sends it epochs, and hands their batches to the trainer.

    One epoch at a time: :meth:`begin`, then :meth:`next_batch` until it returns None
    (``result`` is then set and the runner may :meth:`begin` again). Any error closes
    nothing by itself; the caller closes the runner (:class:`RunnerKeeper`).
    """

    def __init__(
        self, spec: CollateSpec, config: ODBConfig, rank: int, rendezvous: Rendezvous | None
    ) -> None:
        self.result: EpochResult | None = None
        self.closed = False
        self.busy = False
        self._rendezvous = rendezvous
        self._last_beat = -1
        self._joined_at = 0
        self._last_progress = time.monotonic()
        self._started_at = time.monotonic()
        self._start_timeout_s = config.start_timeout_s
        self._side: Transport = open_transport(spec, config, rank, rendezvous)
        self.where = self._side.where
        _LIVE_RUNNERS.add(self)
        _register_exit_finalizer()

    def begin(self, job: EpochJob, prefix: str) -> None:
        """Start the epoch ``job`` on the collate side; ``prefix`` names its group."""
        assert not (self.busy or self.closed), "begin() on a busy or closed runner"
        self.result, self.busy = None, True
        # Beats count on across epochs: this epoch has joined its group once the
        # counter moves past its value now (see _check_progress).
        self._joined_at = self._last_beat = self._side.heartbeat.value()
        self._last_progress = time.monotonic()
        self._side.begin(job, prefix)

    def alive(self) -> bool:
        """Whether the collate side can run an epoch (a process may die while idle)."""
        return self._side.exitcode is None

    @property
    def exitcode(self) -> int | None:
        """The collate process's exit code (None while it runs, or in thread mode)."""
        return self._side.exitcode

    def next_batch(self) -> Any | None:
        """The next batch, or None at the end of the epoch; re-raises collate errors.

        Raises:
            RuntimeError: The collate process died without reporting an error.
            AlignmentTimeoutError: With more than one rank, the collate side made no
                progress for longer than ``align_timeout_s`` (plus a grace).
        """
        waiting_since = time.monotonic()
        while True:
            try:
                message = self._side.receive()
            except queue.Empty:
                if not self._side.is_alive():
                    return self._died()
                self._check_started()
                self._check_progress(waiting_since)
                continue
            return self._handle(message)

    def _handle(self, message: tuple[str, Any]) -> Any | None:
        kind, payload = message
        if kind == "step":
            return payload
        if kind == "end":
            self.result, self.busy = payload, False
            return None
        raise _unpack_error(payload, self.where)

    def _check_started(self) -> None:
        """Raise when a collate process has not confirmed its start within the deadline."""
        if self._side.started():
            return
        waited = time.monotonic() - self._started_at
        if waited <= self._start_timeout_s:
            return
        where = describe_descendants(self._side.root_pid())
        self.close(timeout_s=0.5)
        raise RuntimeError(
            f"{self.where} did not start within start_timeout_s={self._start_timeout_s} s "
            f"(waited {waited:.1f} s): a spawned one may still be re-importing your script's "
            "main module (spawn re-runs its top-level code: is everything under an "
            '`if __name__ == "__main__":` guard?), or unpickling the dataset, collate_fn '
            "or length_fn is stuck. Raise start_timeout_s if start-up is legitimately that "
            f"slow, or use collate_mode='thread'. Its processes: {where}"
        )

    def _check_progress(self, waiting_since: float) -> None:
        """Raise when a multi-rank collate side has made no progress for too long."""
        rendezvous = self._rendezvous
        if rendezvous is None:
            return  # world size 1: nobody waits on us, a slow dataset is just slow
        now = time.monotonic()
        beat = self._side.heartbeat.value()
        if beat != self._last_beat:
            self._last_beat, self._last_progress = beat, now
            return
        if beat == self._joined_at:
            limit = rendezvous.init_timeout_s + _STARTUP_GRACE_S
            what = f"joined the alignment group (init_timeout_s={rendezvous.init_timeout_s} s)"
        else:
            limit = rendezvous.align_timeout_s + _STALL_GRACE_S
            what = (
                "read a sample, finished a collective or collated a group "
                f"(align_timeout_s={rendezvous.align_timeout_s} s)"
            )
        silent = now - max(self._last_progress, waiting_since)
        if silent > limit:
            raise AlignmentTimeoutError(
                f"{self.where} has not {what} for {silent:.1f} s: the dataset, a "
                "DataLoader worker or collate_fn is stuck, or one sample takes longer than "
                "align_timeout_s to load (its peers have timed out by now). Raise "
                f"align_timeout_s if that is legitimate. Processes under {self._side.root_name}: "
                f"{describe_descendants(self._side.root_pid())}"
            )

    def _died(self) -> Any | None:
        try:  # a last message may have landed between the poll and the liveness check
            message = self._side.receive(timeout_s=1.0)
        except queue.Empty:
            raise RuntimeError(self._side.death_message()) from None
        if message[0] == "step":  # the queue is closing; the missing end is the news
            raise RuntimeError(self._side.death_message())
        return self._handle(message)

    def request_stop(self) -> None:
        """Ask the collate side to stop now; :meth:`close` then waits for it."""
        if not self.closed:
            self._side.request_stop()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the collate side and wait for it.

        Idempotent: the iterator's cleanup and the exit hook may both call it. A collate
        process still running after ``timeout_s`` is terminated, then killed. A collate
        thread cannot be killed: it is joined until it has ended (after the sample read
        or collective in progress), with a warning after ``timeout_s`` and at most
        ``align_timeout_s`` (:meth:`odb._process.trainer_transport.ThreadTransport.close`).
        """
        if self.closed:
            return
        self.closed = True
        _LIVE_RUNNERS.discard(self)
        self._side.close(timeout_s)


class RunnerKeeper:
    """A loader's collate side between epochs: at most one runner, kept for the next epoch.

    :meth:`take` hands out the kept runner when it is still alive, or a new one;
    :meth:`give_back` keeps a runner whose epoch ended cleanly and closes any other (an
    error, an iterator abandoned mid-epoch, or a second runner while one is kept), so a
    reused collate side never holds an old epoch's messages or state. The loader closes
    it when it is garbage-collected (``weakref.finalize``); the exit hook closes every
    runner still alive at interpreter exit.
    """

    def __init__(self, spec: CollateSpec, config: ODBConfig, rank: int) -> None:
        self._spec, self._config, self._rank = spec, config, rank
        self._kept: CollateRunner | None = None
        self._lent: weakref.ReferenceType[CollateRunner] | None = None

    def take(self, rendezvous: Rendezvous | None) -> CollateRunner:
        """A runner ready for :meth:`CollateRunner.begin`."""
        runner, self._kept = self._kept, None
        if runner is not None and not runner.alive():
            warnings.warn(
                f"{runner.where} exited between epochs (exit code {runner.exitcode}); "
                "starting a new one",
                RuntimeWarning,
                stacklevel=3,
            )
            runner.close()
            runner = None
        runner = runner or CollateRunner(self._spec, self._config, self._rank, rendezvous)
        self._lent = weakref.ref(runner)
        return runner

    def start(self, rendezvous: Rendezvous | None) -> None:
        """Start the next epoch's runner now unless one is kept (its start-up runs meanwhile)."""
        if self._kept is None:
            self._kept = CollateRunner(self._spec, self._config, self._rank, rendezvous)

    def give_back(self, runner: CollateRunner) -> None:
        """Keep ``runner`` for the next epoch if its epoch ended cleanly; else close it."""
        if runner.busy or runner.closed or self._kept is not None:
            runner.close()
        else:
            self._kept = runner

    def close(self) -> None:
        """Stop the kept runner and the one lent to an iterator still running (idempotent)."""
        lent = self._lent() if self._lent is not None else None
        runner, self._kept, self._lent = self._kept, None, None
        for one in (lent, runner):
            if one is not None:
                one.close(timeout_s=2.0)
