"""The life of a collate process: one per loader and rank, across epochs.

It starts at the loader's first ``iter()`` (or ``start()``), holds the user's collate
spec (dataset, ``collate_fn``, meter, ``worker_init_fn``), and then runs one epoch per job
the trainer sends (:func:`odb._process.collate_body.collate_main`), idle in between. Forked (the
default on Linux, ``ODBConfig.collate_start``) it inherits the spec and the trainer's
imports, and first lets go of what belongs to the trainer (:func:`leave_trainer`);
spawned it imports torch and receives the spec once through the start-up handshake
(:mod:`odb._process.trainer_startup`): either way once per loader, not per epoch. It ends on the
trainer's stop (the loader was closed or garbage-collected, an iterator was abandoned
mid-epoch, the interpreter exits), after any error of an epoch (the next ``iter()``
starts a fresh one), and by itself when its trainer dies (parent watchdog). Failure
contract: ``docs/reliability.md``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import os
import pickle
import signal
import stat
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from odb._process import torch_shm
from odb._process.batch_pool import share_batches
from odb._process.collate_body import POLL_S, collate_main
from odb._process.collate_progress import Heartbeat
from odb._process.handoff import PoolWriter
from odb._process.messages import CollateSpec, EpochJob
from odb._process.rendezvous import Rendezvous

# How often a collate process checks that its trainer is still alive.
_WATCHDOG_S = 0.5
# A collate process still running this long after the trainer stopped it (stuck in the
# dataset or a collective) kills its workers and exits.
_STOP_GRACE_S = 2.0


def process_entry(
    jobs: Connection,
    ready: Any,
    out: Any,
    stop: Any,
    parent_pid: int,
    heartbeat: Heartbeat,
    start_method: str,
    returns: Connection,
    setup: tuple[CollateSpec, Rendezvous | None] | None = None,
) -> None:
    """Body of a collate process: its setup, then epochs until an error or a stop.

    ``setup`` is ``(spec, rendezvous)``, the user's collate spec and where to meet the
    peers: given in a forked process (inherited, not pickled); None in a spawned one,
    which reads it from the handshake.
    """
    if setup is not None:
        leave_trainer()
    # Ctrl-C reaches the whole foreground process group; the trainer handles it and
    # stops this process through the iterator's cleanup.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One intra-op thread, as in a DataLoader worker: the collate side's copies are
    # small, the cores belong to the workers, and a forked child must not enter an
    # OpenMP pool its trainer had started (GNU OpenMP hangs there).
    torch.set_num_threads(1)
    # DataLoader workers start the way they would in the trainer (a spawned child
    # otherwise defaults to spawn, whatever the trainer uses).
    multiprocessing.set_start_method(start_method, force=True)
    # Forked or spawned, this process is the trainer's child; started by a forkserver it
    # is the server's, and its parent never changes while the trainer lives.
    direct = os.getppid() == parent_pid
    threading.Thread(target=_watchdog, args=(parent_pid, direct, stop), daemon=True).start()
    if setup is None:  # the handshake (trainer_startup.py): the setup arrives after the start
        setup = pickle.loads(jobs.recv_bytes())
    spec, rendezvous = setup
    ready.set()
    encoder = PoolWriter(returns)
    share_batches(encoder.pool)  # big batch fields are built in the hand-off's blocks
    while (message := _next_job(jobs, stop)) is not None:
        job, prefix = message
        if not collate_main(spec, job, rendezvous, prefix, out, stop, heartbeat, encoder):
            break
    jobs.close()
    # Stay alive until the trainer has taken everything: new blocks (and other shared
    # storages) travel as shared-memory file descriptors this process must hand over.
    stop.wait()
    # Free the blocks before the exit skips the teardown: with the file_system sharing
    # strategy a segment's name goes from /dev/shm only once every process that mapped it
    # has freed it (else it stays until torch_shm_manager exits with the trainer).
    share_batches(None)
    del encoder
    gc.collect()
    out.cancel_join_thread()
    atexit.register(_skip_teardown)


def leave_trainer() -> None:
    """In a forked collate process, let go of what belongs to the trainer.

    - Every inherited socket (the trainer's Gloo and NCCL connections, its TCPStore,
      anything of the user's) is replaced by ``/dev/null``: when the trainer dies its
      peers see its connections close at once, not when this process ends. The
      descriptor numbers stay taken, so a socket object inherited from the trainer that
      is collected here later closes nothing of this process's own.
    - Except a connection to torch's shared-memory manager (the ``file_system`` sharing
      strategy, once the trainer shared a storage before the fork): torch reuses it
      for every later storage of this process, so it becomes this process's own new
      connection to the same manager (:mod:`odb._process.torch_shm`), not the trainer's.
    - Signal handlers the trainer installed in Python (a checkpoint-on-SIGTERM handler
      of a Slurm job, say) go back to the defaults: stopping this process must not run
      the trainer's code. Except SIGCHLD's: that is torch's DataLoader handler (it
      installs it once per process, so it would not come back), which turns a worker's
      death into an error where a read would otherwise block on its half-written
      message.
    """
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in _open_descriptors():
            with contextlib.suppress(OSError):  # the listing's own descriptor, now closed
                if fd > 2 and fd != null and stat.S_ISSOCK(os.fstat(fd).st_mode):
                    _leave_socket(fd, null)
    finally:
        os.close(null)
    for number in signal.valid_signals() - {signal.SIGCHLD}:
        with contextlib.suppress(OSError, ValueError):
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)


def _leave_socket(fd: int, null: int) -> None:
    """Replace the trainer's socket ``fd``: by this process's own manager connection
    if it is one to torch's shared-memory manager, else by ``/dev/null``."""
    address = torch_shm.manager_address(fd)
    if address is not None:
        try:
            torch_shm.reconnect(fd, address)
            return
        except OSError:  # the manager is gone: the trainer cannot share through it either
            pass
    os.dup2(null, fd)


def _open_descriptors() -> list[int]:
    for listing in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return [int(name) for name in os.listdir(listing)]
    return []


def _next_job(jobs: Connection, stop: Any) -> tuple[EpochJob, str] | None:
    """The next epoch's ``(job, prefix)``; None once the trainer stopped or closed the pipe."""
    try:
        while not stop.is_set():
            if jobs.poll(POLL_S):
                return pickle.loads(jobs.recv_bytes())
    except (EOFError, OSError):
        pass
    return None


def _skip_teardown() -> None:
    """End a collate process that finished cleanly without the interpreter's teardown.

    Registered last, so it is the first exit hook to run: after multiprocessing's own
    exit work (finalizers, joining children, flushing std streams), and instead of
    tearing down the interpreter, which is slow with torch loaded (``docs/benchmarks.md``,
    "Hand-off design figures"). A forked child (every DataLoader worker) ends the same
    way.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _watchdog(parent_pid: int, direct: bool, stop: Any) -> None:
    """End this collate process when its trainer is gone, or stopped it and it is stuck.

    Either way its DataLoader workers are killed first: a worker stuck in the user's
    ``__getitem__`` would otherwise outlive it until the call returns.
    """
    stopped_at = None
    while True:
        time.sleep(_WATCHDOG_S)
        if not _trainer_alive(parent_pid, direct):
            _exit_now()
        if stopped_at is None and stop.is_set():
            stopped_at = time.monotonic()
        if stopped_at is not None and time.monotonic() - stopped_at > _STOP_GRACE_S:
            _exit_now()


def _trainer_alive(parent_pid: int, direct: bool) -> bool:
    """Whether the trainer still runs: still this process's parent when ``direct``."""
    if direct:
        return os.getppid() == parent_pid
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the number: the trainer is gone
        return False
    return True


def _exit_now() -> None:
    for child in multiprocessing.active_children():
        try:
            child.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    os._exit(1)
