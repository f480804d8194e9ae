"""How the collate side shows progress and honours a stop.

The trainer tells a slow collate side from a stuck one by a :class:`Heartbeat` the
collate side bumps whenever it makes progress; it asks the collate side to stop by
setting a stop flag, which :func:`check_stop` turns into :class:`Stopped`. The
alignment group of the collate side (:class:`BeatingGroup`) does both around every
collective.
"""

from __future__ import annotations

import ctypes
import multiprocessing
from collections.abc import Callable
from typing import Any

from odb._process.comm import AlignmentGroup
from odb._process.rendezvous import Rendezvous


class Heartbeat:
    """A counter the collate side bumps whenever it makes progress; the trainer reads it.

    In process mode (``shared``) a 64-bit integer on multiprocessing's shared heap (an
    unlinked file both processes map): a forked collate process inherits the mapping, a
    spawned one (or one a forkserver starts) receives the file's descriptor with its
    start arguments. No name in ``/dev/shm``, so nothing to release at any exit, and no
    word with torch's shared-memory manager, which under ``file_system`` sharing can
    time out while a process unpickles its start arguments (issue 56;
    :mod:`odb._process.torch_shm`). One writer (the collate side), one reader.
    """

    def __init__(self, shared: bool) -> None:
        self._count = multiprocessing.RawValue(ctypes.c_int64, 0) if shared else ctypes.c_int64(0)

    def beat(self) -> None:
        self._count.value += 1

    def value(self) -> int:
        return int(self._count.value)


class Stopped(Exception):
    """The trainer closed the iterator; the collate side ends quietly."""


def check_stop(stop: Any) -> None:
    """Raise :class:`Stopped` once the trainer asked the collate side to stop."""
    if stop.is_set():
        raise Stopped


class BeatingGroup(AlignmentGroup):
    """The alignment group, beating after every completed collective.

    No collective starts once the trainer asked the collate side to stop, the reads
    ahead inside a pending one end (:class:`Stopped`), and one that fails reads no
    failure notes: the stopping rank leaves the group, which ends its peers' pending
    collectives at once (a peer still iterating raises that this rank is gone).
    """

    def __init__(
        self, rendezvous: Rendezvous | None, prefix: str, heartbeat: Heartbeat, stop: Any
    ) -> None:
        super().__init__(rendezvous, prefix)
        self.heartbeat = heartbeat
        self.stop = stop

    def stop_requested(self) -> bool:
        return bool(self.stop.is_set())

    def gather_source_rows(self, row: list[int]) -> list[list[int]]:
        check_stop(self.stop)
        rows = super().gather_source_rows(row)
        self.heartbeat.beat()
        return rows

    def gather_status(
        self, row: list[int], while_waiting: Callable[[], bool] | None = None
    ) -> list[list[int]]:
        check_stop(self.stop)
        if while_waiting is not None:
            while_waiting = _unless_stopped(self.stop, while_waiting)
        rows = super().gather_status(row, while_waiting)
        self.heartbeat.beat()
        return rows

    def sum_counts(self, counts: list[int]) -> list[int]:
        check_stop(self.stop)
        totals = super().sum_counts(counts)
        self.heartbeat.beat()
        return totals

    def gather_indices(self, mine: list[int]) -> list[list[int]]:
        check_stop(self.stop)
        lists = super().gather_indices(mine)
        self.heartbeat.beat()
        return lists


def _unless_stopped(stop: Any, read_ahead: Callable[[], bool]) -> Callable[[], bool]:
    """``read_ahead``, which reads no more (returns False) once the trainer asked to stop."""

    def reading() -> bool:
        return not stop.is_set() and read_ahead()

    return reading
