"""How the collate side's messages reach the trainer: a collate process, or a thread.

Both transports run :func:`odb._process.collate_body.collate_main` once per epoch
(:meth:`begin`) and offer the same small surface (:class:`Transport`) to
:class:`odb._process.trainer_runner.CollateRunner`, which owns the lifecycle (deadlines,
stall detection, the error contract) on top of it.
- :class:`ProcessTransport`: one collate process for many epochs
  (:mod:`odb._process.collate_process`), forked (the user's collate spec inherited) or spawned
  (the spec arrives once, after the start, through the start-up handshake,
  :mod:`odb._process.trainer_startup`), then one job per epoch on a pipe; batches cross in reusable
  shared-memory blocks leased to the trainer (:mod:`odb._process.handoff`).
- :class:`ThreadTransport`: a daemon thread in the trainer per epoch, batches passed as
  they are (for debugging and ``num_workers=0``; the same semantics).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import queue
import sys
import threading
import time
import traceback
import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol

import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler

from odb._process.collate_body import POLL_S, collate_main
from odb._process.collate_process import process_entry
from odb._process.collate_progress import Heartbeat
from odb._process.comm import leave_failure_note
from odb._process.diagnostics import death_message, remove_shm_of
from odb._process.forking import context_for, trainer_start_method
from odb._process.handoff import PoolReader
from odb._process.messages import CollateSpec, EpochJob
from odb._process.rendezvous import Rendezvous
from odb._process.trainer_startup import JobSender, main_guard_error, unguarded_main_line
from odb.core.config import ODBConfig


class Transport(Protocol):
    """What a runner needs from the collate side it started."""

    where: str  # "the ODB collate process of rank 1", for messages
    root_name: str  # what root_pid() is, for messages
    heartbeat: Heartbeat

    def begin(self, job: EpochJob, prefix: str) -> None:
        """Start one epoch (after the previous one ended); ``prefix`` names its group."""

    def receive(self, timeout_s: float = POLL_S) -> tuple[str, Any]:
        """The next message; raises ``queue.Empty`` after ``timeout_s`` without one."""

    def is_alive(self) -> bool:
        """Whether the collate side still runs (in thread mode: this epoch's thread)."""

    @property
    def exitcode(self) -> int | None:
        """A collate process's exit code once it ended; None while it runs, or a thread."""

    def started(self) -> bool:
        """Whether the collate side has confirmed its start (holds the user's collate spec)."""

    def root_pid(self) -> int:
        """The process whose descendants run the collate side (for diagnostics)."""

    def death_message(self) -> str:
        """Why the collate side is gone."""

    def request_stop(self) -> None:
        """Ask the collate side to stop, without waiting (:meth:`close` waits)."""

    def close(self, timeout_s: float) -> None:
        """Stop it (any epoch in flight too) and wait; see each transport for how long.

        Called once; a closed transport runs no more epochs.
        """


class ThreadTransport:
    """The collate side in a daemon thread of the trainer, a fresh thread per epoch.

    A stopped thread ends at its next check (before and after every sample it reads,
    before every collate call and collective, in the reads ahead): after at most one
    sample's read, or one collective, whose peers end it at once when they stop too.
    :meth:`close` joins it until it has ended, so no torch work runs in it while the
    interpreter finalizes (CPython before 3.14 ends a daemon thread that re-takes the
    GIL then with ``pthread_exit``, which aborts the process inside a torch call).
    """

    def __init__(
        self,
        where: str,
        spec: CollateSpec,
        config: ODBConfig,
        rank: int,
        rendezvous: Rendezvous | None,
    ) -> None:
        self.where, self.root_name = where, "the trainer"
        self.heartbeat = Heartbeat(shared=False)
        self._spec, self._rendezvous, self._depth = spec, rendezvous, config.queue_depth
        self._rank = rank
        self._limit_s = config.align_timeout_s
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, job: EpochJob, prefix: str) -> None:
        # The last epoch's thread has sent its end and is leaving: join it, so this
        # transport never has two threads; the new epoch gets a new queue and group.
        if self._thread is not None:
            self._thread.join(self._limit_s)
        self._queue = queue.Queue(maxsize=self._depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=collate_main,
            name=f"odb-collate-rank{self._rank}",
            daemon=True,
            args=(self._spec, job, self._rendezvous, prefix, self._queue, self._stop),
            kwargs={"heartbeat": self.heartbeat},
        )
        self._thread.start()

    def receive(self, timeout_s: float = POLL_S) -> tuple[str, Any]:
        return self._queue.get(timeout=timeout_s)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def started(self) -> bool:
        return True

    @property
    def exitcode(self) -> int | None:
        return None

    def root_pid(self) -> int:
        return os.getpid()

    def death_message(self) -> str:
        return f"{self.where} ended without a word"

    def request_stop(self) -> None:
        self._stop.set()

    def close(self, timeout_s: float) -> None:
        """Stop the thread and join it until it has ended, at most ``align_timeout_s``.

        A thread cannot be killed: it ends at its next stop check, after the sample
        read or the collective in progress (``align_timeout_s`` bounds both for the
        protocol). Still running after ``timeout_s``, a RuntimeWarning shows its stack;
        after ``align_timeout_s`` close gives up with another: a ``__getitem__`` that
        never returns keeps the thread, and the interpreter may then abort at exit
        (SIGABRT) inside it. Process mode can kill such a collate side.
        """
        self._stop.set()
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            warnings.warn(
                f"{self.where} is still running {timeout_s} s after it was asked to stop; "
                f"waiting for it up to align_timeout_s={self._limit_s} s. It is at:\n"
                f"{_stack_of(thread)}",
                RuntimeWarning,
                stacklevel=2,
            )
            thread.join(self._limit_s)
        if thread.is_alive():
            warnings.warn(
                f"{self.where} did not stop within align_timeout_s={self._limit_s} s (the "
                "dataset or collate_fn does not return); it is left running, and the "
                "interpreter may abort at exit. Use collate_mode='process' (a collate "
                f"process can be killed). It is at:\n{_stack_of(thread)}",
                RuntimeWarning,
                stacklevel=2,
            )


def _stack_of(thread: threading.Thread) -> str:
    """The Python stack ``thread`` runs now (empty once it has ended)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


class ProcessTransport:
    """The collate side in a process that runs many epochs; batches in pool blocks.

    The process is forked or spawned as ``config.collate_start`` says. A spawned one
    re-imports the training script, so an unguarded script is refused here; a forked
    one inherits the user's collate spec instead of unpickling it.
    """

    def __init__(
        self,
        where: str,
        spec: CollateSpec,
        config: ODBConfig,
        rank: int,
        rendezvous: Rendezvous | None,
    ) -> None:
        forked = config.collate_start == "fork"
        unguarded = None if forked else unguarded_main_line()
        if unguarded is not None:
            raise main_guard_error(unguarded)
        self.where, self.root_name = where, "the collate process"
        self.heartbeat = Heartbeat(shared=True)
        ctx = context_for(config.collate_start)
        self._queue: Any = ctx.Queue(maxsize=config.queue_depth)
        self._stop: Any = ctx.Event()
        self._ready: Any = ctx.Event()
        returns, returns_here = ctx.Pipe(duplex=False)
        jobs_in, jobs_out = ctx.Pipe(duplex=False)
        self._process: Any = ctx.Process(
            target=process_entry,
            name=f"odb-collate-rank{rank}",
            args=(
                jobs_in,
                self._ready,
                self._queue,
                self._stop,
                os.getpid(),
                self.heartbeat,
                trainer_start_method(),
                returns,
                (spec, rendezvous) if forked else None,
            ),
        )
        self._blocks = PoolReader(returns_here)
        if forked:
            _fork(self._process)
        else:
            self._process.start()
        returns.close()  # the collate process holds its own ends
        jobs_in.close()
        self._jobs = JobSender(jobs_out)
        if not forked:
            self._jobs.send((spec, rendezvous))  # the handshake: the collate spec, once
        self._watcher = (
            _DeathWatcher(self._process, self._stop, where, rendezvous)
            if rendezvous is not None
            else None
        )

    def begin(self, job: EpochJob, prefix: str) -> None:
        if self._watcher is not None:
            self._watcher.prefix = prefix
        self._jobs.send((job, prefix))

    def receive(self, timeout_s: float = POLL_S) -> tuple[str, Any]:
        """The next message; a batch arrives as ``("step", batch)`` as in a thread."""
        self._blocks.flush()  # blocks whose batches the consumer has dropped go back
        try:
            data = self._queue.get(timeout=timeout_s)
            message = ForkingPickler.loads(data)
            if message[0] == "pooled":
                message = ("step", self._blocks.decode(*message[1]))
            elif message[0] == "end":
                self._blocks.end_epoch()
            return message
        except queue.Empty:
            raise
        except Exception as exc:
            # A batch whose shared memory can no longer be fetched: its sender died
            # while the batch was in flight.
            self._process.join(1.0)
            if not self._process.is_alive():
                raise RuntimeError(self.death_message()) from exc
            raise

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def started(self) -> bool:
        return self._ready.is_set()

    def root_pid(self) -> int:
        return self._process.pid

    @property
    def exitcode(self) -> int | None:
        """The collate process's exit code; None while it runs."""
        return self._process.exitcode

    def death_message(self) -> str:
        return death_message(self.where, self._process.exitcode)

    def request_stop(self) -> None:
        self._stop.set()

    def close(self, timeout_s: float) -> None:
        """Stop the process: wait ``timeout_s``, then terminate it, then kill it."""
        died_unasked = not self._stop.is_set() and not self._process.is_alive()
        self._stop.set()
        self._jobs.close()
        process = self._process
        process.join(timeout_s)
        for end in (process.terminate, process.kill):
            if process.is_alive():
                end()
                process.join(2.0)
        if self._watcher is not None:
            self._watcher.close(died_unasked)
        self._queue.cancel_join_thread()
        self._queue.close()
        self._blocks.close()
        if isinstance(process.exitcode, int) and process.exitcode < 0:
            remove_shm_of(process.pid)


class _DeathWatcher:
    """Leaves the failure note of a collate process that died unasked, for its peers.

    A killed collate process cannot say why it left, and its peers' collectives fail
    at once on the closed connection; the note (:func:`odb._process.comm.
    leave_failure_note`, under the epoch's ``prefix``) lets them name this rank's
    collate process and its signal every time instead of a bare "gone". A trainer
    thread waits on the process's sentinel (for a trainer busy in a long step); a
    trainer that saw the death first leaves it from :meth:`close`. Once either way.
    :meth:`close` ends and joins the thread (none of ours runs while the interpreter
    finalizes). It holds the process, never the transport (no reference cycle).
    """

    def __init__(self, process: Any, stop: Any, where: str, rendezvous: Rendezvous) -> None:
        self.prefix: str | None = None
        self._process, self._stop, self._where = process, stop, where
        self._rendezvous = rendezvous
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._noted = False
        self._thread = threading.Thread(
            target=self._watch, name=f"odb-collate-watch-rank{rendezvous.rank}", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        sentinel = self._process.sentinel
        while not multiprocessing.connection.wait([sentinel], timeout=POLL_S):
            if self._closing.is_set():
                return
        if not self._stop.is_set():
            self._leave_note()

    def _leave_note(self) -> None:
        with self._lock:
            if self._noted or self.prefix is None:
                return
            self._noted = True
        for _ in range(50):  # another thread may be reaping the process this very moment
            if self._process.exitcode is not None:
                break
            time.sleep(0.01)
        message = death_message(self._where, self._process.exitcode)
        leave_failure_note(self._rendezvous, self.prefix, message)

    def close(self, died_unasked: bool) -> None:
        """End the thread; leave the note now if the process had died before any stop."""
        self._closing.set()
        self._thread.join()
        if died_unasked:
            self._leave_note()


def _fork(process: Any) -> None:
    """Start ``process``, silencing Python 3.12+'s warning about forking with threads.

    The hazards of forking a trainer that runs threads are handled in the child: by the
    checked fork (:mod:`odb._process.forking`: locks held at the fork, the trainer's
    objects frozen for the child's collector) and by
    :func:`odb._process.collate_process.leave_trainer` (sockets, one intra-op thread).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
        process.start()


def open_transport(
    spec: CollateSpec, config: ODBConfig, rank: int, rendezvous: Rendezvous | None
) -> ProcessTransport | ThreadTransport:
    """Start rank ``rank``'s collate side the way ``config.collate_mode`` says."""
    mode = config.collate_mode
    where = f"the ODB collate {mode} of rank {rank}"
    kind = ProcessTransport if mode == "process" else ThreadTransport
    return kind(where, spec, config, rank, rendezvous)
