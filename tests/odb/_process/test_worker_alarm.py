"""The worker alarm: a DataLoader worker's death ends a read blocked on its half message,
even when the SIGCHLD of the death itself was missed (odb/_process/worker_alarm.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import struct
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from odb._process.worker_alarm import WorkerAlarm

_HALF = 1 << 20  # the header announces 1 MiB; the writer dies after 1000 bytes of it


def _write_half_and_die(writer: Connection) -> None:
    os.write(writer.fileno(), struct.pack("!i", _HALF) + b"x" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)


def _exit_cleanly() -> None:
    pass


@pytest.fixture
def sigchld_ignored() -> Iterator[None]:
    """No SIGCHLD handler in this process: a death's own signal goes nowhere."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def _dead(process: multiprocessing.process.BaseProcess) -> None:
    """Wait until ``process`` has ended, without reaping it."""
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.dist
def test_a_death_whose_signal_was_missed_ends_the_read(sigchld_ignored: None) -> None:
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)  # this process keeps the write end: no EOF
    worker = ctx.Process(target=_write_half_and_die, args=(writer,))
    worker.start()
    _dead(worker)  # dead before the alarm exists: its SIGCHLD was ignored
    # Should the alarm fail, the rest of the message arrives after 60 s: a failed
    # assertion, not a hung test.
    rescue = threading.Timer(60.0, os.write, (writer.fileno(), b"\0" * _HALF))
    rescue.start()
    alarm = WorkerAlarm([worker.pid])
    try:
        with pytest.raises(RuntimeError) as raised, alarm.reading():
            reader.recv_bytes()
    finally:
        alarm.close()
        rescue.cancel()
        worker.join()
    assert f"DataLoader worker (pid {worker.pid}) was killed by signal SIGKILL" in str(
        raised.value
    )
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL  # put back


@pytest.mark.dist
def test_only_a_failed_worker_and_only_inside_a_read_raises(sigchld_ignored: None) -> None:
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    clean = ctx.Process(target=_exit_cleanly)
    killed = ctx.Process(target=_write_half_and_die, args=(writer,))
    for process in (clean, killed):
        process.start()
        _dead(process)
    calm = WorkerAlarm([clean.pid])
    try:
        with calm.reading():
            signal.raise_signal(signal.SIGCHLD)  # a clean exit is no failure
    finally:
        calm.close()
    alarm = WorkerAlarm([clean.pid, killed.pid])
    try:
        signal.raise_signal(signal.SIGCHLD)  # outside a read: nothing to interrupt
        with pytest.raises(RuntimeError, match="was killed by signal SIGKILL"), alarm.reading():
            signal.raise_signal(signal.SIGCHLD)
    finally:
        alarm.close()
    clean.join()
    killed.join()
    assert (clean.exitcode, killed.exitcode) == (0, -signal.SIGKILL)  # the alarm reaps none


def test_outside_the_main_thread_the_alarm_is_inactive() -> None:
    before = signal.getsignal(signal.SIGCHLD)
    made: list[WorkerAlarm] = []
    thread = threading.Thread(target=lambda: made.append(WorkerAlarm([os.getpid()])))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGCHLD) == before
    assert made[0]._watcher is None
    made[0].close()
