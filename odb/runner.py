"""The trainer's side of one epoch's collate side: its lifecycle and its error contract.

:class:`CollateRunner` starts the collate side (:mod:`odb.collate_side`) through a
transport (:mod:`odb.transport`: a dedicated collate process per rank, or a thread),
hands its batches to the loader, and turns every way it can fail into an error in time;
the descriptions in those errors come from :mod:`odb.diagnostics`.

Failure contract (``docs/reliability.md`` has the full table):

- an exception on the collate side (or in a worker, which the DataLoader re-raises
  there) is sent to the trainer and re-raised with its original type and the remote
  traceback attached; before that, the collate side leaves the alignment group and
  leaves a note naming the error in the rendezvous store, so the peers' collectives fail
  at once and say which rank failed first;
- a collate process that dies without a word (SIGKILL, OOM) is reported with its exit
  code or signal, also when it dies while a batch is in flight;
- a collate process whose trainer dies exits by itself within ``_WATCHDOG_S`` of
  :mod:`odb.collate_side` (parent watchdog), so no orphan keeps Gloo connections or
  shared memory alive; its DataLoader workers follow by PyTorch's own watchdog;
- with more than one rank, a trainer waiting for a collate side that makes no progress
  at all (no sample read, no collective finished, no group collated) for
  ``align_timeout_s`` plus a grace raises :class:`~odb.comm.AlignmentTimeoutError`
  instead of waiting forever (a stuck ``__getitem__`` or worker; its peers time out
  at ``align_timeout_s`` anyway);
- the collate process ignores SIGINT: Ctrl-C interrupts the trainer, whose iterator
  cleanup stops the collate side (as PyTorch's DataLoader workers do).
"""

from __future__ import annotations

import atexit
import pickle
import queue
import time
import weakref
from typing import Any

from odb.collate_side import CollateSpec
from odb.comm import AlignmentTimeoutError, Rendezvous
from odb.diagnostics import describe_descendants
from odb.engine import EpochJob, EpochResult
from odb.transport import Transport, open_transport

__all__ = ["CollateRunner", "CollateSpec", "RemoteTraceback"]

# A trainer waiting on a collate side without progress raises after align_timeout_s
# plus this (the peers' own collectives have timed out by then).
_STALL_GRACE_S = 5.0
# Before the alignment group exists (process start-up, rendezvous), the limit is
# init_timeout_s plus this.
_STARTUP_GRACE_S = 30.0
_LIVE_RUNNERS: weakref.WeakSet[CollateRunner] = weakref.WeakSet()


@atexit.register
def _close_live_runners() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: a collate
    # process still waiting for its trainer would otherwise block interpreter exit.
    for runner in list(_LIVE_RUNNERS):
        runner.close(timeout_s=1.0)


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
    """Starts the collate side of one epoch and hands its batches to the trainer."""

    def __init__(
        self, spec: CollateSpec, job: EpochJob, rendezvous: Rendezvous | None, prefix: str
    ) -> None:
        self.result: EpochResult | None = None
        self._closed = False
        self._rendezvous = rendezvous
        self._last_beat = -1
        self._last_progress = time.monotonic()
        self._started_at = time.monotonic()
        self._start_timeout_s = job.config.start_timeout_s
        self._side: Transport = open_transport(spec, job, rendezvous, prefix)
        self.where = self._side.where
        _LIVE_RUNNERS.add(self)

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
            self.result = payload
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
            f"(waited {waited:.1f} s): it is still re-importing your script's main module "
            "(spawn re-runs its top-level code: is everything under an "
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
        if beat == 0:
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

    def _died(self) -> None:
        try:  # a last message may have landed between the poll and the liveness check
            message = self._side.receive(timeout_s=1.0)
        except queue.Empty:
            raise RuntimeError(self._side.death_message()) from None
        if message[0] == "step":  # the queue is closing; the missing end is the news
            raise RuntimeError(self._side.death_message())
        return self._handle(message)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the collate side and wait for it; kill it if it does not stop in time.

        Idempotent: the iterator's cleanup and the exit hook may both call it. A collate
        thread blocked in a collective cannot be interrupted: it ends when the collective
        does (at the latest after ``align_timeout_s``).
        """
        if self._closed:
            return
        self._closed = True
        _LIVE_RUNNERS.discard(self)
        self._side.close(timeout_s)
