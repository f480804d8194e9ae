"""The collate side's alignment group answers "asked to stop?" from the trainer's stop
flag, so a collective that fails after a stop reads no failure notes
(:meth:`odb._process.comm.AlignmentGroup.stop_requested`; the wait itself, on a real
Gloo group: tests/odb/_process/test_comm.py)."""

from __future__ import annotations

import threading

from odb._process.collate_body import Heartbeat, _BeatingGroup


def test_the_beating_group_is_stopping_once_the_trainer_asks() -> None:
    stop = threading.Event()
    group = _BeatingGroup(None, "odb/iter1/", Heartbeat(shared=False), stop)
    assert not group.stop_requested()
    stop.set()
    assert group.stop_requested()
