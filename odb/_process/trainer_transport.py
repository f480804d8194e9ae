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

import gc
import os
import queue
import threading
import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol

import torch.multiprocessing  # noqa: F401 - registers the tensor reductions with ForkingPickler

from odb._process.collate_body import POLL_S, Heartbeat, collate_main
from odb._process.collate_process import process_entry
from odb._process.comm import Rendezvous
from odb._process.diagnostics import death_message, remove_shm_of
from odb._process.forking import context_for, trainer_start_method
from odb._process.handoff import PoolReader
from odb._process.messages import CollateSpec, EpochJob
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

    def close(self, timeout_s: float) -> None:
        """Stop it (any epoch in flight too); wait ``timeout_s``, then kill what can be killed.

        Called once; a closed transport runs no more epochs.
        """


class ThreadTransport:
    """The collate side in a daemon thread of the trainer, a fresh thread per epoch."""

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
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin(self, job: EpochJob, prefix: str) -> None:
        # The last epoch's thread may still be leaving (its end is sent): it touches
        # only its own queue and group, so the new epoch gets new ones.
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

    def close(self, timeout_s: float) -> None:
        # A thread blocked in a collective cannot be interrupted: it ends when the
        # collective does (at the latest after align_timeout_s).
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


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

    def begin(self, job: EpochJob, prefix: str) -> None:
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

    def close(self, timeout_s: float) -> None:
        self._stop.set()
        self._jobs.close()
        process = self._process
        process.join(timeout_s)
        for end in (process.terminate, process.kill):
            if process.is_alive():
                end()
                process.join(2.0)
        self._queue.cancel_join_thread()
        self._queue.close()
        self._blocks.close()
        if isinstance(process.exitcode, int) and process.exitcode < 0:
            remove_shm_of(process.pid)


def _fork(process: Any) -> None:
    """Fork ``process`` with the trainer's objects frozen for the garbage collector.

    Frozen objects are never visited by the child's collector, so it does not write to
    (and copy) the pages of the trainer's objects it inherited (``gc.freeze``). The
    hazards of forking a trainer that runs threads are handled in the child
    (:func:`odb._process.collate_process.leave_trainer`, one intra-op thread) and, for a child
    the interpreter deadlocked at the fork, by the checked fork (:mod:`odb._process.forking`);
    Python 3.12+'s warning about them is therefore silenced here.
    """
    gc.freeze()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", "This process .* is multi-threaded", DeprecationWarning
            )
            process.start()
    finally:
        gc.unfreeze()


def open_transport(
    spec: CollateSpec, config: ODBConfig, rank: int, rendezvous: Rendezvous | None
) -> ProcessTransport | ThreadTransport:
    """Start rank ``rank``'s collate side the way ``config.collate_mode`` says."""
    mode = config.collate_mode
    where = f"the ODB collate {mode} of rank {rank}"
    kind = ProcessTransport if mode == "process" else ThreadTransport
    return kind(where, spec, config, rank, rendezvous)
