"""Forking that survives what the parent's other threads leave behind in the child.

A forked child has one thread; a lock that another thread of the parent held at the
fork stays held in the child forever, unless the fork resets it. Five such locks met ODB:

- the interpreter's thread-state lock: CPython before 3.11.10 (and 3.10/3.9 before their
  2024 security releases; 3.12+ is fixed) deadlocks the child in
  ``PyOS_AfterFork_Child``, before it runs a single Python statement (CPython
  gh-112275);
- glibc's resolver lock (``resolv_conf.c``; ``fork`` does not reset it, glibc 2.36 to
  2.42): the child deadlocks at its first name lookup. Every ``TCPStore`` connection
  makes one (c10d formats the peer's address with ``getnameinfo``), and rank 0's store
  server makes one on every connection it accepts, on its own thread: a collate
  process forked on rank 0 while a peer connected hung in its first store connection;
- torch's default CPU generator's mutex (``fork`` does not reset it, torch 2.13): a
  trainer thread drawing random numbers at the fork (a metrics thread, augmentation in
  a thread) leaves it held in the child, which deadlocks at its first draw: the
  DataLoader's base seed in a collate process, ``torch.manual_seed`` in every worker
  (the repeat campaign met it, issue 56);
- c10d's flight-recorder mutex (on by default, ``TORCH_FR_BUFFER_SIZE=2000``, torch
  2.13): every Gloo collective is recorded under it when issued, and retired under it
  by the group's worker thread after the caller's ``wait`` returned; a fork at that
  moment leaves it held in the child, which deadlocks creating its first process group
  (``record_pg_ranks``). ODB forks right after the trainer's rendezvous collective (the
  repeat campaign met it, issue 56).
- numpy's global ``RandomState`` lock (a Python ``RLock``; nothing resets it at the
  fork): a trainer thread in any ``np.random`` function at the fork leaves it held, and
  every DataLoader worker deadlocks seeding numpy (``np.random.seed`` in torch's worker
  loop), including the workers a collate process forked later (found by reading, issue
  56).

The parent's threads leave one more hazard: the C++ objects it owns. glibc hands the
stacks (and thread descriptors) of the parent's threads to the child's new threads, so
a destructor run in the child that joins a thread of the parent (a ``TCPStore``
server's, a Gloo group's workers) joins a stranger: ``std::system_error`` ("Invalid
argument") and an abort. Python runs such destructors when its collector frees the
parent's unreachable objects.

A trainer runs threads (Gloo, the TCPStore, queue feeders, a collate thread), so ODB's
forks of its collate process and of DataLoader workers can meet any of these (how often
the soak met them: ``docs/reliability.md``, "Soak").

:func:`checked_fork_context` is a ``fork`` multiprocessing context whose children
freeze what they inherited for the collector (``gc.freeze``: never freed, nor written
to, in the child), take and release the resolver lock, the generator's mutex, the
flight recorder's and numpy's lock, and then report, as their first statements, that
the fork is behind them. A child that has not reported and sleeps in the kernel is
killed and forked again. Nothing is lost by the retry: the dead child ran none of its
work, so it took nothing from any queue or pipe.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import multiprocessing
import os
import select
import signal
import sys
import time
from multiprocessing import context as mp_context
from multiprocessing import popen_fork, util
from typing import Any

import torch

log = logging.getLogger(__name__)

STUCK_AFTER_S = 2.0
"""A child silent this long after its fork and asleep in the kernel is deadlocked.

A healthy child reports microseconds after the fork; between the fork and its report it
runs only the interpreter's at-fork code, in one thread, so a sleep there is a wait for
a lock no thread of the child can release."""

ATTEMPTS = 5
"""Forks tried before giving up with an error."""

_POLL_S = 0.25


class ForkDeadlockError(RuntimeError):
    """Every attempt to fork a child deadlocked before the child ran."""


class CheckedForkPopen(popen_fork.Popen):
    """``popen_fork.Popen`` whose child reports on a pipe once the fork is behind it."""

    def _launch(self, process_obj: Any) -> None:
        for attempt in range(1, ATTEMPTS + 1):
            if self._launch_once(process_obj):
                return
            log.warning(
                "a forked child (pid %d) deadlocked on a lock held at the fork (CPython "
                "gh-112275, fixed in Python 3.11.10 and 3.12, glibc's resolver lock, "
                "torch's CPU generator lock, c10d's flight-recorder lock or numpy's "
                "random lock); killed it and forked again (attempt %d of %d)",
                self.pid,
                attempt,
                ATTEMPTS,
            )
        raise ForkDeadlockError(
            f"{ATTEMPTS} forks in a row deadlocked before the child ran (CPython "
            "gh-112275, or glibc's resolver lock, torch's CPU generator lock, c10d's "
            "flight-recorder lock or numpy's random lock held by a thread of this "
            "process). Upgrade Python (3.11.10+ or 3.12+), or start "
            "processes with spawn (ODBConfig(collate_start_method='spawn', "
            "worker_start_method='spawn'))"
        )

    def _launch_once(self, process_obj: Any) -> bool:
        """Fork once; True when the child reported, False when it was stuck and is gone."""
        code = 1
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        ready_r, ready_w = os.pipe()
        self.pid = _fork_frozen()
        if self.pid == 0:  # pragma: no cover - the child; its outcome is checked by the parent
            try:
                _take_resolver_lock()  # deadlocks here, not at the first lookup, if held
                _take_generator_lock()  # deadlocks here, not at the first draw, if held
                _take_flight_recorder_lock()  # here, not at the first process group
                _take_numpy_random_lock()  # here, not when a worker seeds numpy
                os.write(ready_w, b"\0")  # the fork is behind us
                for fd in (parent_r, parent_w, ready_r, ready_w):
                    os.close(fd)
                code = process_obj._bootstrap(parent_sentinel=child_r)
            finally:
                os._exit(code)
        os.close(ready_w)
        try:
            reported = _await_report(self.pid, ready_r)
        finally:
            os.close(ready_r)
        if not reported:
            _kill_and_reap(self.pid)
            for fd in (parent_r, child_w, child_r, parent_w):
                os.close(fd)
            return False
        os.close(child_w)
        os.close(child_r)
        # close_fds: in CPython's multiprocessing.util (as its popen_fork uses it), not in typeshed
        self.finalizer = util.Finalize(self, util.close_fds, (parent_r, parent_w))  # type: ignore[attr-defined]
        self.sentinel = parent_r
        return True


def _fork_frozen() -> int:
    """``os.fork()``; the child freezes what it inherited before it can collect any of it.

    Nothing the parent owned is freed in the child (the destructors of C++ objects that
    own threads would join strangers, see above), and the child's collector does not
    write to (and copy) the inherited pages. No collection runs between the fork and the
    freeze: the collector is off across the fork, in both processes, as briefly as that.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        pid = os.fork()
    except BaseException:
        if collecting:
            gc.enable()
        raise
    if pid == 0:
        gc.freeze()
    if collecting:
        gc.enable()
    return pid


def _resolver_init() -> Any:
    """glibc's ``__res_init`` (None elsewhere): it takes the resolver lock, no network."""
    try:
        return getattr(ctypes.CDLL(None), "__res_init", None)
    except OSError:
        return None


_RES_INIT = _resolver_init()  # looked up in the parent: a child only calls it


def _take_resolver_lock() -> None:
    """Take and release glibc's resolver lock (reading ``/etc/resolv.conf``).

    In a child forked while another thread held it, this never returns, as the child's
    first name lookup would not: the parent sees the child asleep, unreported.
    """
    if _RES_INIT is not None:
        _RES_INIT()


def _take_generator_lock() -> None:
    """Take and release the mutex of torch's default CPU generator.

    ``get_state`` holds it while it copies the state (``initial_seed`` would not take
    it); in a child forked while another thread drew random numbers it never returns,
    as the child's first draw would not.
    """
    torch.default_generator.get_state()


def _flight_recorder_dump() -> Any:
    """c10d's ``_dump_fr_trace`` (None without ``torch.distributed``): it takes the mutex."""
    if not torch.distributed.is_available():
        return None
    return getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)


_DUMP_FLIGHT_RECORDER = _flight_recorder_dump()  # looked up in the parent: a child calls it


def _take_flight_recorder_lock() -> None:
    """Take and release the mutex of c10d's flight recorder (the one Gloo records into).

    Dumping the collectives copies the recorder's entries under it (8-20 ms with the
    2000 entries of a full recorder; nothing when it is off); in a child forked while a
    Gloo worker thread retired a collective it never returns, as the child's first
    process group would not.
    """
    if _DUMP_FLIGHT_RECORDER is not None:
        _DUMP_FLIGHT_RECORDER(True, False, True)  # collectives, no stacks, active only


def _take_numpy_random_lock() -> None:
    """Take and release the lock of numpy's global ``RandomState`` (once numpy's random
    module is imported: a child that imports it later makes a fresh one).

    A DataLoader worker seeds it first (``np.random.seed``); in a child forked while
    another thread was in an ``np.random`` function this never returns, as that would not.
    """
    lock = _numpy_random_lock()
    if lock is not None:
        with lock:
            pass


def _numpy_random_lock() -> Any:
    """The lock numpy's global ``RandomState`` draws under; None before ``numpy.random``
    is imported, or if a numpy keeps it elsewhere (a test pins where the installed one
    keeps it: a missed lock must fail there, not as a child that never reports)."""
    state = getattr(sys.modules.get("numpy.random.mtrand"), "_rand", None)
    return getattr(getattr(state, "_bit_generator", None), "lock", None)


def _await_report(pid: int, ready_r: int) -> bool:
    """Wait for the child's report; False once it is silent and asleep (deadlocked)."""
    started = time.monotonic()
    poller = select.poll()  # not select(): a trainer's descriptors may pass FD_SETSIZE
    poller.register(ready_r, select.POLLIN)
    while True:
        if poller.poll(_POLL_S * 1000):
            return os.read(ready_r, 1) == b"\0"  # b"": the child died before it ran
        if time.monotonic() - started >= STUCK_AFTER_S and _asleep(pid):
            return False


def _asleep(pid: int) -> bool:
    """Whether ``pid`` sleeps in the kernel (Linux ``/proc``); False where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself hold spaces.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"S"


def _kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class CheckedForkProcess(mp_context.ForkProcess):
    """A ``fork`` process started through :class:`CheckedForkPopen`."""

    _start_method = "fork"

    @staticmethod
    def _Popen(process_obj: Any) -> CheckedForkPopen:
        return CheckedForkPopen(process_obj)


class CheckedForkContext(mp_context.ForkContext):
    """The ``fork`` context, with :class:`CheckedForkProcess` as its ``Process``."""

    Process = CheckedForkProcess


_CONTEXT = CheckedForkContext()


def checked_fork_context() -> CheckedForkContext:
    """The ``fork`` multiprocessing context whose children are checked as above.

    Its queues, events and pipes are the standard fork context's; only ``Process``
    differs. Pass it wherever a context is taken (``DataLoader(multiprocessing_context=)``).
    """
    return _CONTEXT


def trainer_start_method() -> str:
    """The start method of this program: the one it set, else the platform's default."""
    # allow_none: reading the default must not fix it for the user's program.
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


def context_for(
    method: str,
) -> mp_context.ForkContext | mp_context.SpawnContext | mp_context.ForkServerContext:
    """The multiprocessing context of start method ``method``; ``fork`` is checked.

    Raises:
        ValueError: ``method`` is none of ``fork``, ``spawn``, ``forkserver``.
    """
    if method == "fork":
        return checked_fork_context()
    if method == "spawn":
        return multiprocessing.get_context("spawn")
    if method == "forkserver":
        return multiprocessing.get_context("forkserver")
    raise ValueError(f"unknown start method {method!r}; use 'fork', 'spawn' or 'forkserver'")
