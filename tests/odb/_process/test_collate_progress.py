"""The collate side's progress and stop: the heartbeat the trainer reads, and the
alignment group that answers "asked to stop?" from the trainer's stop flag, so a
collective that fails after a stop reads no failure notes
(:meth:`odb._process.comm.AlignmentGroup.stop_requested`; the wait itself, on a real
Gloo group: tests/odb/_process/test_comm.py). That a spawned collate process leaves
nothing in ``/dev/shm``, and starts while torch's shared-memory manager answers
nothing: tests/odb/test_trainer_settings.py."""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import threading

import pytest

from harness.shm_audit import mapped_file
from odb._process.collate_progress import BeatingGroup, Heartbeat, Stopped, check_stop
from odb._process.forking import checked_fork_context


def test_the_beating_group_is_stopping_once_the_trainer_asks() -> None:
    stop = threading.Event()
    group = BeatingGroup(None, "odb/iter1/", Heartbeat(shared=False), stop)
    assert not group.stop_requested()
    check_stop(stop)
    stop.set()
    assert group.stop_requested()
    with pytest.raises(Stopped):
        check_stop(stop)


def _beat_three_times(heartbeat: Heartbeat) -> None:
    for _ in range(3):
        heartbeat.beat()


def test_a_shared_heartbeat_counts_another_processs_beats_and_has_no_name() -> None:
    heartbeat = Heartbeat(shared=True)
    heartbeat.beat()
    child = checked_fork_context().Process(target=_beat_three_times, args=(heartbeat,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert heartbeat.value() == 4
    # An anonymous file: no /dev/shm name to free at an exit that skips the teardown,
    # nothing of torch's shared-memory manager (issue 56).
    address = ctypes.addressof(ctypes.c_char.from_buffer(heartbeat._counter))
    assert mapped_file(address).startswith("/memfd:odb-heartbeat")


def test_a_dropped_heartbeat_holds_no_descriptor() -> None:
    before = set(os.listdir("/proc/self/fd"))
    heartbeat = Heartbeat(shared=True)
    assert set(os.listdir("/proc/self/fd")) - before  # the file's, and the mapping's own
    del heartbeat
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) - before == set()


def test_a_thread_mode_heartbeat_is_not_pickled() -> None:
    with pytest.raises(TypeError, match="not shared"):
        pickle.dumps(Heartbeat(shared=False))
