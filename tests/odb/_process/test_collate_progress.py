"""The collate side's progress and stop: the heartbeat the trainer reads, and the
alignment group that answers "asked to stop?" from the trainer's stop flag, so a
collective that fails after a stop reads no failure notes
(:meth:`odb._process.comm.AlignmentGroup.stop_requested`; the wait itself, on a real
Gloo group: tests/odb/_process/test_comm.py). That a spawned collate process leaves
nothing in ``/dev/shm``: tests/odb/test_trainer_settings.py."""

from __future__ import annotations

import threading

import pytest

from odb._process.collate_progress import BeatingGroup, Heartbeat, Stopped, check_stop


def test_the_beating_group_is_stopping_once_the_trainer_asks() -> None:
    stop = threading.Event()
    group = BeatingGroup(None, "odb/iter1/", Heartbeat(shared=False), stop)
    assert not group.stop_requested()
    check_stop(stop)
    stop.set()
    assert group.stop_requested()
    with pytest.raises(Stopped):
        check_stop(stop)


def test_a_released_heartbeat_no_longer_touches_the_shared_counter() -> None:
    heartbeat = Heartbeat(shared=True)
    shared = heartbeat.count
    assert shared.is_shared()
    heartbeat.beat()
    heartbeat.release()
    heartbeat.beat()
    heartbeat.beat()
    assert int(shared[0]) == 1
    assert heartbeat.value() == 2
    assert not heartbeat.count.is_shared()
