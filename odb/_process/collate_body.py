"""The collate side: the body that runs in a collate process (or thread), one epoch a call.

For each epoch it owns the DataLoader whose workers run the user's dataset with a null
collate (one ``(index, sample)`` per item, public ``torch.utils.data`` API only), runs
the epoch driver (:func:`odb._process.collate_epoch.run_epoch`), and puts every outcome
on a bounded queue as one message: ``("step", batch)``, ``("end", result)`` or
``("error", packed)``. How the queue crosses to the trainer is the transport's business
(:mod:`odb._process.trainer_transport`); what the trainer does with the messages, the
runner's (:mod:`odb._process.trainer_runner`); the life of a collate process across
epochs, :mod:`odb._process.collate_process`. Failure contract: ``docs/reliability.md``.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import signal
import threading
import traceback
import weakref
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from odb._process.collate_epoch import run_epoch
from odb._process.collate_progress import BeatingGroup, Heartbeat, Stopped, check_stop
from odb._process.collate_sources import idle_template, open_samples, receive_owed
from odb._process.comm import AlignmentGroup, AlignmentTimeoutError
from odb._process.diagnostics import remove_shm_of
from odb._process.handoff import PoolWriter
from odb._process.messages import CollateSpec, EpochJob, EpochResult
from odb._process.rendezvous import Rendezvous
from odb._process.worker_alarm import WorkerAlarm
from odb.core.buffer import sample_nbytes

# How often the collate side re-checks a full queue for a trainer that stopped listening
# (and the trainer re-checks a silent collate side).
POLL_S = 0.1


def _beating(
    samples: Iterator[Any], heartbeat: Heartbeat, job: EpochJob, stop: Any, alarm: WorkerAlarm
) -> Generator[Any, None, None]:
    """The samples, beating on each; names a worker that died mid-transfer.

    Raises :class:`Stopped` before and after every read once the trainer asked the
    collate side to stop: a read in progress (the user's ``__getitem__``) is the
    longest a stop waits for here.

    A DataLoader worker killed while it hands over a sample can surface as a bare
    ``EOFError``/``ConnectionError`` (the pipe or the shared-memory handshake breaks
    before the worker is seen dead). Errors of the user's dataset reach this point
    wrapped by the DataLoader ("Caught ... in DataLoader worker"), so they pass as is.
    A worker that dies while the read waits on its half-written message raises through
    ``alarm`` (:mod:`odb._process.worker_alarm`).

    However it ends (exhausted, stopped, failed or closed), the items the workers owe
    are received (:func:`~odb._process.collate_sources.receive_owed`: their shared
    segments are returned) and the DataLoader's workers are shut down, here, in this
    thread: left to the garbage collector, the iterator may be
    collected in a worker forked for the next epoch (thread mode), whose copy then
    fails "can only test a child process" and dies.
    """
    try:
        while True:
            check_stop(stop)
            try:
                with alarm.reading():
                    item = next(samples)
            except StopIteration:
                return
            except (EOFError, ConnectionError) as exc:
                if job.config.num_workers == 0 or str(exc).startswith("Caught "):
                    raise
                raise RuntimeError(
                    f"a DataLoader worker of rank {job.rank} exited unexpectedly while "
                    f"handing over a sample ({type(exc).__name__}: {exc}); was it killed "
                    "(OOM killer, signal)?"
                ) from exc
            heartbeat.beat()
            check_stop(stop)
            yield item
    finally:
        receive_owed(samples, alarm.reading)
        alarm.close()  # before the shutdown, which may stop a worker by a signal
        shutdown = getattr(samples, "_shutdown_workers", None)  # torch's own __del__ step
        if shutdown is not None:
            shutdown()


def collate_main(
    spec: CollateSpec,
    job: EpochJob,
    rendezvous: Rendezvous | None,
    prefix: str,
    out: Any,
    stop: Any,
    heartbeat: Heartbeat | None = None,
    encoder: PoolWriter | None = None,
) -> bool:
    """One epoch of the collate side; every outcome ends as one message on ``out``.

    With an ``encoder`` (process mode) messages are pickled here, so a batch that cannot
    cross the process boundary fails as an error the trainer sees, instead of being
    dropped by the queue's feeder thread.

    Returns:
        True when the epoch ended cleanly (its ``end`` sent, its DataLoader workers
        shut down), so the side may run another; False after an error or a stop.
    """
    heartbeat = heartbeat if heartbeat is not None else Heartbeat(shared=False)
    group: AlignmentGroup | None = None
    workers: list[Any] = []
    samples: Generator[Any, None, None] | None = None
    alarm = WorkerAlarm([])
    try:
        # Workers start (fork) before the group exists, so they hold no copy of its
        # sockets: a dead collate process then closes its connections at once.
        opened, workers = _open(spec, job)
        alarm = WorkerAlarm([p.pid for p in workers])
        samples = _beating(opened, heartbeat, job, stop, alarm)
        group = BeatingGroup(rendezvous, prefix, heartbeat, stop)
        heartbeat.beat()
        result = _run(spec, job, samples, group, heartbeat, _Outbox(out, stop, encoder))
        group.close()
        # The workers exit before the end is sent, so none outlives a finished epoch.
        samples.close()
        samples = None
        sent = _put(out, ("end", result), stop, encoder)
        if encoder is not None:
            encoder.end_epoch()
        return sent
    except Stopped:
        return False
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the trainer
        if stop.is_set():
            # Asked to stop: what failed since (a peer's collective ended by its own
            # stop) is no news to the trainer, and no failure to note for the peers.
            return False
        _report(exc, group, _Outbox(out, stop, encoder))
        del exc
        for pid in _killed_children(workers):
            remove_shm_of(pid)
        return False
    finally:
        alarm.close()
        if samples is not None:
            samples.close()  # shuts the DataLoader workers down (_beating)
        if group is not None:
            group.close()


def _report(exc: BaseException, group: AlignmentGroup | None, outbox: _Outbox) -> None:
    """Send the trainer ``exc``; first tell the peers and leave the group."""
    _silence_sigchld()
    packed = _pack_error(exc)
    if group is not None:
        # Tell the peers who failed first, then leave the group: their collectives
        # fail at once instead of waiting out align_timeout_s.
        if not isinstance(exc, AlignmentTimeoutError):
            group.report_failure(packed[1])
        group.close()
    # Frames of the traceback keep the DataLoader iterator (and its workers) alive.
    traceback.clear_frames(exc.__traceback__)
    _put(outbox.out, ("error", packed), outbox.stop, outbox.encoder)


def _open(spec: CollateSpec, job: EpochJob) -> tuple[Iterator[tuple[int, Any]], list[Any]]:
    """This rank's samples of the epoch, and the DataLoader workers started for them."""
    known = set(multiprocessing.active_children())
    samples = open_samples(
        spec.dataset,
        job.config,
        job.rank,
        job.world_size,
        job.view,
        job.skip,
        job.shard,
        spec.worker_init_fn,
    )
    return samples, [p for p in multiprocessing.active_children() if p not in known]


class _HeldBatches:
    """Bytes of the batches a collate thread handed to the trainer, until freed there:
    until a batch's first tensor field is freed (a weak-reference finalizer, run by
    whichever thread drops it); a batch without one is not counted."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a finalizer may run inside track()'s thread
        self.nbytes = 0

    def track(self, batch: Any) -> None:
        values = batch.values() if isinstance(batch, Mapping) else ()
        anchor = next((v for v in values if isinstance(v, torch.Tensor)), None)
        if anchor is None:
            return
        nbytes = sample_nbytes(batch)
        with self._lock:
            self.nbytes += nbytes
        weakref.finalize(anchor, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.nbytes -= nbytes


@dataclass
class _Outbox:
    """The bounded queue to the trainer, as the round loop sees it."""

    out: Any
    stop: Any
    encoder: PoolWriter | None
    held: _HeldBatches = field(default_factory=_HeldBatches)

    def emit(self, batch: Any) -> None:
        if self.encoder is None:
            self.held.track(batch)
        if not _put(self.out, ("step", batch), self.stop, self.encoder):
            raise Stopped

    def held_bytes(self) -> int:
        """Bytes of the emitted batches the trainer has not released yet."""
        return self.encoder.held_bytes() if self.encoder is not None else self.held.nbytes

    def free_slots(self, depth: int) -> int:
        try:
            return max(depth - self.out.qsize(), 0)
        except NotImplementedError:  # macOS: qsize is unavailable
            return 0


def _run(
    spec: CollateSpec,
    job: EpochJob,
    samples: Iterator[Any],
    group: AlignmentGroup,
    heartbeat: Heartbeat,
    outbox: _Outbox,
) -> EpochResult:
    """One epoch of the round loop, beating on every emitted step and collated group."""

    def emit(batch: Any) -> None:
        heartbeat.beat()
        outbox.emit(batch)

    def collate_fn(group_samples: list[Any]) -> Any:
        check_stop(outbox.stop)
        heartbeat.beat()
        return spec.collate_fn(group_samples)

    return run_epoch(
        job,
        samples,
        group,
        collate_fn,
        spec.meter,
        idle_template(spec.dataset),
        emit,
        lambda: outbox.free_slots(job.config.queue_depth),
        outbox.held_bytes,
    )


def _silence_sigchld() -> None:
    """Keep the DataLoader's SIGCHLD handler from raising into the error report.

    In the collate process's main thread the DataLoader installs a SIGCHLD handler that
    raises when a worker dies; a second raise while the first error is being reported
    would end the process before the report is sent. Retried, because a pending signal
    can fire again on the way in. No-op in a thread (the handler is main-thread only).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for _ in range(10):
        try:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return
        except BaseException:  # noqa: BLE001, S112 - raised by the pending handler itself
            continue


def _killed_children(children: list[Any]) -> list[int]:
    """Pids of ``children`` (multiprocessing processes) that a signal ended."""
    return [p.pid for p in children if p.exitcode is not None and p.exitcode < 0]


def _put(out: Any, message: Any, stop: Any, encoder: PoolWriter | None) -> bool:
    """Put unless the trainer stopped listening; False when the message was not sent.

    Never gives up while the trainer listens: a dropped message (an error above all)
    would leave the trainer waiting for a collate side that has nothing more to say.
    """
    if stop.is_set():
        return False
    if encoder is not None:
        message = encoder.encode(message)
    while not stop.is_set():
        try:
            out.put(message, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _pack_error(exc: BaseException) -> tuple[bytes | None, str, str]:
    text = "".join(traceback.format_exception(exc))
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:  # noqa: BLE001 - an unpicklable exception still travels as text
        blob = None
    return blob, f"{type(exc).__name__}: {exc}", text
