"""Where the round loop runs: a dedicated collate process per rank, or a thread.

The collate side owns the DataLoader whose workers run the user's dataset with a null
collate (one ``(index, sample)`` per item, public ``torch.utils.data`` API only), runs
:func:`odb.engine.run_epoch`, and puts finished batches on a bounded queue. Tensors
cross the process boundary through shared memory (``torch.multiprocessing``).

Failure contract: an exception on the collate side (or in a worker, which the
DataLoader re-raises there) is sent to the trainer and re-raised with its original
type and the remote traceback attached; a collate process that dies without a word is
reported with its exit code; a collate process whose trainer dies exits by itself
(parent watchdog), so no orphan keeps Gloo connections or shared memory alive.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.multiprocessing as mp

from odb.comm import AlignmentGroup, Rendezvous
from odb.engine import EpochJob, EpochResult, SampleMeter, run_epoch
from odb.sources import idle_template, open_samples

_POLL_S = 0.1
_WATCHDOG_S = 0.5
_LIVE_RUNNERS: weakref.WeakSet[CollateRunner] = weakref.WeakSet()


@atexit.register
def _close_live_runners() -> None:
    # Registered after multiprocessing's own exit hook, so it runs first: a collate
    # process still waiting for its trainer would otherwise block interpreter exit.
    for runner in list(_LIVE_RUNNERS):
        runner.close(timeout_s=1.0)


@dataclass
class CollateSpec:
    """The user's parts the collate side runs (must be picklable in process mode)."""

    dataset: Any
    collate_fn: Callable[[list[Any]], Any]
    meter: SampleMeter


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on the collate side."""

    def __str__(self) -> str:
        return self.args[0]


def collate_main(
    spec: CollateSpec,
    job: EpochJob,
    rendezvous: Rendezvous | None,
    prefix: str,
    out: Any,
    stop: Any,
) -> None:
    """Body of the collate side; every outcome ends as one message on ``out``."""
    try:
        group = AlignmentGroup(rendezvous, prefix)
        samples = open_samples(
            spec.dataset, job.config, job.rank, job.world_size, job.view, job.skip
        )

        def emit(batch: Any) -> None:
            if not _put(out, ("step", batch), stop):
                raise _Stopped

        def free_slots() -> int:
            try:
                return max(job.config.queue_depth - out.qsize(), 0)
            except NotImplementedError:  # macOS: qsize is unavailable
                return 0

        result = run_epoch(
            job,
            samples,
            group,
            spec.collate_fn,
            spec.meter,
            idle_template(spec.dataset),
            emit,
            free_slots,
        )
        _put(out, ("end", result), stop)
    except _Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the trainer
        packed = _pack_error(exc)
        # Frames of the traceback keep the DataLoader iterator (and its workers) alive.
        traceback.clear_frames(exc.__traceback__)
        _put(out, ("error", packed), stop, give_up_s=5.0)


class _Stopped(Exception):
    """The trainer closed the iterator; the collate side ends quietly."""


def _put(out: Any, message: Any, stop: Any, give_up_s: float | None = None) -> bool:
    """Put unless the trainer stopped listening; False when the message was not sent."""
    deadline = None if give_up_s is None else time.monotonic() + give_up_s
    while not stop.is_set():
        try:
            out.put(message, timeout=_POLL_S)
            return True
        except queue.Full:
            if deadline is not None and time.monotonic() > deadline:
                return False
    return False


def _pack_error(exc: BaseException) -> tuple[bytes | None, str, str]:
    text = "".join(traceback.format_exception(exc))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an unpicklable exception still travels as text
        blob = None
    return blob, f"{type(exc).__name__}: {exc}", text


def _unpack_error(packed: tuple[bytes | None, str, str], where: str) -> BaseException:
    blob, summary, text = packed
    exc = pickle.loads(blob) if blob is not None else RuntimeError(f"{where} raised {summary}")
    exc.__cause__ = RemoteTraceback(f"\n\nTraceback on {where}:\n{text}")
    return exc


def _process_entry(
    spec: CollateSpec,
    job: EpochJob,
    rendezvous: Rendezvous | None,
    prefix: str,
    out: Any,
    stop: Any,
    parent_pid: int,
) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    collate_main(spec, job, rendezvous, prefix, out, stop)
    # Stay alive until the trainer has taken everything: tensors travel as shared-memory
    # file descriptors that this process must still be able to hand over.
    stop.wait()
    out.cancel_join_thread()


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the trainer process is gone (no orphaned collate process)."""
    while True:
        time.sleep(_WATCHDOG_S)
        if os.getppid() != parent_pid:
            os._exit(1)


class CollateRunner:
    """Starts the collate side of one epoch and hands its batches to the trainer."""

    def __init__(
        self, spec: CollateSpec, job: EpochJob, rendezvous: Rendezvous | None, prefix: str
    ) -> None:
        cfg = job.config
        self.where = f"the ODB collate {cfg.collate_mode} of rank {job.rank}"
        self.result: EpochResult | None = None
        self._closed = False
        if cfg.collate_mode == "process":
            ctx = mp.get_context("spawn")
            self._queue: Any = ctx.Queue(maxsize=cfg.queue_depth)
            self._stop: Any = ctx.Event()
            self._worker: Any = ctx.Process(
                target=_process_entry,
                name=f"odb-collate-rank{job.rank}",
                args=(spec, job, rendezvous, prefix, self._queue, self._stop, os.getpid()),
            )
        else:
            self._queue = queue.Queue(maxsize=cfg.queue_depth)
            self._stop = threading.Event()
            self._worker = threading.Thread(
                target=collate_main,
                name=f"odb-collate-rank{job.rank}",
                daemon=True,
                args=(spec, job, rendezvous, prefix, self._queue, self._stop),
            )
        self._worker.start()
        _LIVE_RUNNERS.add(self)

    def qsize(self) -> int:
        try:
            return self._queue.qsize()
        except NotImplementedError:
            return 0

    def next_batch(self) -> Any | None:
        """The next batch, or None at the end of the epoch; re-raises collate errors."""
        while True:
            try:
                kind, payload = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._worker.is_alive():
                    return self._died()
                continue
            if kind == "step":
                return payload
            if kind == "end":
                self.result = payload
                return None
            raise _unpack_error(payload, self.where)

    def _died(self) -> None:
        try:  # a last message may have landed between the poll and the liveness check
            kind, payload = self._queue.get(timeout=1.0)
        except queue.Empty:
            code = getattr(self._worker, "exitcode", None)
            raise RuntimeError(
                f"{self.where} exited unexpectedly (exit code {code}); if it was "
                "killed by the OOM killer, lower buffer_size or queue_depth"
            ) from None
        if kind == "end":
            self.result = payload
            return None
        raise _unpack_error(payload, self.where)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the collate side and wait for it; kill it if it does not stop in time.

        Idempotent: the iterator's cleanup and the exit hook may both call it.
        """
        if self._closed:
            return
        self._closed = True
        _LIVE_RUNNERS.discard(self)
        self._stop.set()
        self._worker.join(timeout_s)
        if isinstance(self._worker, threading.Thread):
            return
        if self._worker.is_alive():
            self._worker.terminate()
            self._worker.join(2.0)
        if self._worker.is_alive():
            self._worker.kill()
            self._worker.join(2.0)
        self._queue.cancel_join_thread()
        self._queue.close()
