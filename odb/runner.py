"""Where the round loop runs: a dedicated collate process per rank, or a thread.

The collate side owns the DataLoader whose workers run the user's dataset with a null
collate (one ``(index, sample)`` per item, public ``torch.utils.data`` API only), runs
:func:`odb.engine.run_epoch`, and puts finished batches on a bounded queue.

Hand-off in process mode: batches cross to the trainer through reusable shared-memory
slabs (:mod:`odb.handoff`); in thread mode they are passed as they are.

Failure contract (``docs/reliability.md`` has the full table):

- an exception on the collate side (or in a worker, which the DataLoader re-raises
  there) is sent to the trainer and re-raised with its original type and the remote
  traceback attached; before that, the collate side leaves the alignment group and
  leaves a note naming the error in the rendezvous store, so the peers' collectives fail
  at once and say which rank failed first;
- a collate process that dies without a word (SIGKILL, OOM) is reported with its exit
  code or signal, also when it dies while a batch is in flight;
- a collate process whose trainer dies exits by itself within ``_WATCHDOG_S`` (parent
  watchdog), so no orphan keeps Gloo connections or shared memory alive; its
  DataLoader workers follow by PyTorch's own watchdog;
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
import contextlib
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing as mp

from odb.comm import AlignmentGroup, AlignmentTimeoutError, Rendezvous
from odb.engine import EpochJob, EpochResult, SampleMeter, run_epoch
from odb.handoff import SlabReader, SlabWriter
from odb.sources import idle_template, open_samples
from odb.startup import main_guard_error, send_boot, unguarded_main_line

# How often the trainer re-checks a silent collate side, and the collate side re-checks
# a full queue for a trainer that stopped listening.
_POLL_S = 0.1
# How often a collate process checks that its trainer is still alive.
_WATCHDOG_S = 0.5
# A collate process still running this long after the trainer stopped it (stuck in the
# dataset or a collective) kills its workers and exits.
_STOP_GRACE_S = 2.0
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


@dataclass
class CollateSpec:
    """The user's parts the collate side runs (must be picklable in process mode)."""

    dataset: Any
    collate_fn: Callable[[list[Any]], Any]
    meter: SampleMeter
    worker_init_fn: Callable[[int], None] | None = None


class RemoteTraceback(Exception):
    """Carries the traceback text of an exception raised on the collate side."""

    def __str__(self) -> str:
        return self.args[0]


class Heartbeat:
    """A counter the collate side bumps whenever it makes progress; the trainer reads it.

    In process mode the counter is a one-element shared-memory tensor (its file
    descriptor is released with the runner; nothing is left in ``/dev/shm``).
    """

    def __init__(self, shared: bool) -> None:
        self.count = torch.zeros(1, dtype=torch.int64)
        if shared:
            self.count.share_memory_()

    def beat(self) -> None:
        self.count.add_(1)

    def value(self) -> int:
        return int(self.count[0])


class _BeatingGroup(AlignmentGroup):
    """The alignment group, beating after every completed collective."""

    def __init__(self, rendezvous: Rendezvous | None, prefix: str, heartbeat: Heartbeat) -> None:
        super().__init__(rendezvous, prefix)
        self.heartbeat = heartbeat

    def gather_status(self, row: list[int]) -> list[list[int]]:
        rows = super().gather_status(row)
        self.heartbeat.beat()
        return rows

    def sum_counts(self, counts: list[int]) -> list[int]:
        totals = super().sum_counts(counts)
        self.heartbeat.beat()
        return totals

    def gather_indices(self, mine: list[int]) -> list[list[int]]:
        lists = super().gather_indices(mine)
        self.heartbeat.beat()
        return lists


def _beating(samples: Iterator[Any], heartbeat: Heartbeat, job: EpochJob) -> Iterator[Any]:
    """The samples, beating on each; names a worker that died mid-transfer.

    A DataLoader worker killed while it hands over a sample can surface as a bare
    ``EOFError``/``ConnectionError`` (the pipe or the shared-memory handshake breaks
    before the worker is seen dead). Errors of the user's dataset reach this point
    wrapped by the DataLoader ("Caught ... in DataLoader worker"), so they pass as is.
    """
    while True:
        try:
            item = next(samples)
        except StopIteration:
            return
        except (EOFError, ConnectionError) as exc:
            if job.config.num_workers == 0 or str(exc).startswith("Caught "):
                raise
            raise RuntimeError(
                f"a DataLoader worker of rank {job.rank} exited unexpectedly while handing "
                f"over a sample ({type(exc).__name__}: {exc}); was it killed (OOM killer, "
                "signal)?"
            ) from exc
        heartbeat.beat()
        yield item


def collate_main(
    spec: CollateSpec,
    job: EpochJob,
    rendezvous: Rendezvous | None,
    prefix: str,
    out: Any,
    stop: Any,
    heartbeat: Heartbeat | None = None,
    encoder: SlabWriter | None = None,
) -> None:
    """Body of the collate side; every outcome ends as one message on ``out``.

    With an ``encoder`` (process mode) messages are pickled here, so a batch that cannot
    cross the process boundary fails as an error the trainer sees, instead of being
    dropped by the queue's feeder thread.
    """
    heartbeat = heartbeat if heartbeat is not None else Heartbeat(shared=False)
    group: AlignmentGroup | None = None
    workers: list[Any] = []
    try:
        # Workers start (fork) before the group exists, so they hold no copy of its
        # sockets: a dead collate process then closes its connections at once.
        known = set(multiprocessing.active_children())
        samples = _beating(
            open_samples(
                spec.dataset,
                job.config,
                job.rank,
                job.world_size,
                job.view,
                job.skip,
                job.shard,
                spec.worker_init_fn,
            ),
            heartbeat,
            job,
        )
        workers = [p for p in multiprocessing.active_children() if p not in known]
        group = _BeatingGroup(rendezvous, prefix, heartbeat)
        heartbeat.beat()

        def emit(batch: Any) -> None:
            heartbeat.beat()
            if not _put(out, ("step", batch), stop, encoder):
                raise _Stopped

        def free_slots() -> int:
            try:
                return max(job.config.queue_depth - out.qsize(), 0)
            except NotImplementedError:  # macOS: qsize is unavailable
                return 0

        def collate_fn(samples: list[Any]) -> Any:
            heartbeat.beat()
            return spec.collate_fn(samples)

        result = run_epoch(
            job,
            samples,
            group,
            collate_fn,
            spec.meter,
            idle_template(spec.dataset),
            emit,
            free_slots,
        )
        group.close()
        _put(out, ("end", result), stop, encoder)
    except _Stopped:
        pass
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the trainer
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
        del exc
        _put(out, ("error", packed), stop, encoder)
        for pid in _killed_children(workers):
            _remove_shm_of(pid)
    finally:
        if group is not None:
            group.close()


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


class _Stopped(Exception):
    """The trainer closed the iterator; the collate side ends quietly."""


def _put(out: Any, message: Any, stop: Any, encoder: SlabWriter | None) -> bool:
    """Put unless the trainer stopped listening; False when the message was not sent.

    Never gives up while the trainer listens: a dropped message (an error above all)
    would leave the trainer waiting for a collate side that has nothing more to say.
    """
    if stop.is_set():
        return False
    if encoder is not None:
        message = encoder.encode(message, stop)
        if message is None:
            return False
    while not stop.is_set():
        try:
            out.put(message, timeout=_POLL_S)
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


def _unpack_error(packed: tuple[bytes | None, str, str], where: str) -> BaseException:
    blob, summary, text = packed
    exc = pickle.loads(blob) if blob is not None else RuntimeError(f"{where} raised {summary}")
    exc.__cause__ = RemoteTraceback(f"\n\nTraceback on {where}:\n{text}")
    return exc


def _process_entry(
    boot: Connection,
    ready: Any,
    out: Any,
    stop: Any,
    parent_pid: int,
    heartbeat: Heartbeat,
    start_method: str,
    returns: Connection,
    slots: int,
) -> None:
    # Ctrl-C reaches the whole foreground process group; the trainer handles it and
    # stops this process through the iterator's cleanup.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # DataLoader workers start the way they would in the trainer (a spawned child
    # otherwise defaults to spawn, whatever the trainer uses).
    multiprocessing.set_start_method(start_method, force=True)
    threading.Thread(target=_watchdog, args=(parent_pid, stop), daemon=True).start()
    # The handshake (odb/startup.py): the user's parts arrive after the start.
    spec, job, rendezvous, prefix = pickle.loads(boot.recv_bytes())
    boot.close()
    ready.set()
    encoder = SlabWriter(returns, slots)
    collate_main(spec, job, rendezvous, prefix, out, stop, heartbeat, encoder)
    # Stay alive until the trainer has taken everything: new slabs (and batches too big
    # for one) travel as shared-memory file descriptors this process must hand over.
    stop.wait()
    out.cancel_join_thread()
    atexit.register(_skip_teardown)


def _skip_teardown() -> None:
    """End a collate process that finished cleanly without the interpreter's teardown.

    Registered last, so it is the first exit hook to run: after multiprocessing's own
    exit work (finalizers, joining children, flushing std streams), and instead of
    tearing down the interpreter, which took 0.3-0.5 s per epoch with torch loaded. A
    forked child (every DataLoader worker) ends the same way.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _watchdog(parent_pid: int, stop: Any) -> None:
    """End this collate process when its trainer is gone, or stopped it and it is stuck.

    Either way its DataLoader workers are killed first: a worker stuck in the user's
    ``__getitem__`` would otherwise outlive it until the call returns.
    """
    stopped_at = None
    while True:
        time.sleep(_WATCHDOG_S)
        if os.getppid() != parent_pid:
            _exit_now()
        if stopped_at is None and stop.is_set():
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() - stopped_at > _STOP_GRACE_S:
            _exit_now()


def _exit_now() -> None:
    for child in multiprocessing.active_children():
        try:
            child.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    os._exit(1)


def _trainer_start_method() -> str:
    # allow_none: reading the default must not fix it for the user's program.
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


class CollateRunner:
    """Starts the collate side of one epoch and hands its batches to the trainer."""

    def __init__(
        self, spec: CollateSpec, job: EpochJob, rendezvous: Rendezvous | None, prefix: str
    ) -> None:
        cfg = job.config
        self.where = f"the ODB collate {cfg.collate_mode} of rank {job.rank}"
        self.result: EpochResult | None = None
        self._closed = False
        self._process = cfg.collate_mode == "process"
        self._heartbeat = Heartbeat(shared=self._process)
        self._rendezvous = rendezvous
        self._last_beat = -1
        self._last_progress = time.monotonic()
        self._slabs: SlabReader | None = None
        self._started_at = time.monotonic()
        self._start_timeout_s = cfg.start_timeout_s
        if self._process:
            unguarded = unguarded_main_line()
            if unguarded is not None:
                raise main_guard_error(unguarded)
            ctx = mp.get_context("spawn")
            self._queue: Any = ctx.Queue(maxsize=cfg.queue_depth)
            self._stop: Any = ctx.Event()
            self._ready: Any = ctx.Event()
            returns, self._returns = ctx.Pipe(duplex=False)
            boot_in, boot_out = ctx.Pipe(duplex=False)
            slots = cfg.queue_depth + 2
            self._worker: Any = ctx.Process(
                target=_process_entry,
                name=f"odb-collate-rank{job.rank}",
                args=(
                    boot_in,
                    self._ready,
                    self._queue,
                    self._stop,
                    os.getpid(),
                    self._heartbeat,
                    _trainer_start_method(),
                    returns,
                    slots,
                ),
            )
            self._slabs = SlabReader(self._returns, slots)
        else:
            self._queue = queue.Queue(maxsize=cfg.queue_depth)
            self._stop = threading.Event()
            self._worker = threading.Thread(
                target=collate_main,
                name=f"odb-collate-rank{job.rank}",
                daemon=True,
                args=(spec, job, rendezvous, prefix, self._queue, self._stop, self._heartbeat),
            )
        self._worker.start()
        if self._process:
            returns.close()  # the collate process holds its own end
            boot_in.close()
            send_boot(boot_out, (spec, job, rendezvous, prefix))
        _LIVE_RUNNERS.add(self)

    def qsize(self) -> int:
        try:
            return self._queue.qsize()
        except NotImplementedError:
            return 0

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
                message = self._receive()
            except queue.Empty:
                if not self._worker.is_alive():
                    return self._died()
                self._check_started()
                self._check_progress(waiting_since)
                continue
            return self._handle(message)

    def _receive(self, timeout_s: float = _POLL_S) -> tuple[str, Any]:
        """The next message; a batch arrives as ``("step", batch)`` in both modes."""
        if not self._process:
            return self._queue.get(timeout=timeout_s)
        try:
            data = self._queue.get(timeout=timeout_s)
            message = ForkingPickler.loads(data)
            if message[0] == "slab":
                assert self._slabs is not None
                message = ("step", self._slabs.decode(*message[1]))
            return message
        except queue.Empty:
            raise
        except Exception as exc:
            # A batch whose shared memory can no longer be fetched: its sender died
            # while the batch was in flight.
            self._worker.join(1.0)
            if not self._worker.is_alive():
                raise RuntimeError(self._death_message()) from exc
            raise

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
        if not self._process or self._ready.is_set():
            return
        waited = time.monotonic() - self._started_at
        if waited <= self._start_timeout_s:
            return
        where = describe_descendants(self._worker.pid)
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
        beat = self._heartbeat.value()
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
            root = self._worker.pid if self._process else os.getpid()
            raise AlignmentTimeoutError(
                f"{self.where} has not {what} for {silent:.1f} s: the dataset, a "
                "DataLoader worker or collate_fn is stuck, or one sample takes longer than "
                "align_timeout_s to load (its peers have timed out by now). Raise "
                "align_timeout_s if that is legitimate. Processes under "
                f"{'the collate process' if self._process else 'the trainer'}: "
                f"{describe_descendants(root)}"
            )

    def _death_message(self) -> str:
        code = getattr(self._worker, "exitcode", None)
        how = f"exit code {code}"
        if isinstance(code, int) and code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}, exit code {code}"
            except ValueError:
                pass
        return (
            f"{self.where} exited unexpectedly ({how}); if it was killed by the OOM "
            "killer, lower buffer_size or queue_depth"
        )

    def _died(self) -> None:
        try:  # a last message may have landed between the poll and the liveness check
            message = self._receive(timeout_s=1.0)
        except queue.Empty:
            raise RuntimeError(self._death_message()) from None
        if message[0] == "step":  # the queue is closing; the missing end is the news
            raise RuntimeError(self._death_message())
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
        if self._slabs is not None:
            self._slabs.close()
        if isinstance(self._worker.exitcode, int) and self._worker.exitcode < 0:
            _remove_shm_of(self._worker.pid)


def describe_descendants(root: int | None) -> str:
    """``pid name (state, kernel wait)`` of every live descendant of ``root``, for errors.

    Read from Linux's ``/proc``; says so where that is unavailable. A worker stuck in a
    lock shows a futex wait; one stuck in I/O, its read or poll.
    """
    if root is None or not os.path.isdir(f"/proc/{root}/task"):
        return "unknown (no /proc)"
    found = [_describe_pid(pid) for pid in _descendants(root)]
    return "; ".join(found) if found else "none"


def _descendants(root: int) -> list[int]:
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(c) for c in f.read().split()]
                out.extend(children)
                todo.extend(children)
    return out


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip() or "-"
    except OSError:
        return f"{pid} (gone)"
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    state = stat[stat.rindex(")") + 2 :].split()[0]
    return f"{pid} {name} ({state}, {wchan})"


def _remove_shm_of(pid: int | None) -> None:
    """Remove shared-memory files a signal-killed process (collate, worker) left half-made.

    torch names a segment ``torch_<pid>_...`` and unlinks it as soon as it is mapped, so
    a named file left by a dead process is one it was killed in the middle of making;
    whoever holds the segment keeps it through its descriptor.
    """
    if pid is None or not os.path.isdir("/dev/shm"):
        return
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"torch_{pid}_"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
