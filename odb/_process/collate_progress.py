"""How the collate side shows progress and honours a stop.

The trainer tells a slow collate side from a stuck one by a :class:`Heartbeat` the
collate side bumps whenever it makes progress; it asks the collate side to stop by
setting a stop flag, which :func:`check_stop` turns into :class:`Stopped`. The
alignment group of the collate side (:class:`BeatingGroup`) does both around every
collective.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import weakref
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

from odb._process.comm import AlignmentGroup
from odb._process.rendezvous import Rendezvous


class Heartbeat:
    """A counter the collate side bumps whenever it makes progress; the trainer reads it.

    In process mode (``shared``) eight bytes of a mapping both processes share, of an
    anonymous file (``memfd``): a forked collate process inherits the mapping, a spawned
    one (or one a forkserver starts) receives the file's descriptor with its start
    arguments and maps it. No name in ``/dev/shm`` and nothing held once the object is
    gone, and no word with torch's shared-memory manager, which under ``file_system``
    sharing can time out while a process unpickles its start arguments (issue 56;
    :mod:`odb._process.torch_shm`). One writer (the collate side), one reader.
    """

    def __init__(self, shared: bool) -> None:
        self._fd = _anonymous_file(_COUNTER.size) if shared else None
        self._counter = bytearray(_COUNTER.size) if self._fd is None else _mapping(self._fd)
        if self._fd is not None:  # kept to send; closed with the object
            weakref.finalize(self, os.close, self._fd)

    def beat(self) -> None:
        _COUNTER.pack_into(self._counter, 0, self.value() + 1)

    def value(self) -> int:
        return int(_COUNTER.unpack_from(self._counter)[0])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._fd is None:
            raise TypeError("a thread-mode Heartbeat is not shared and cannot be pickled")
        return _mapped_heartbeat, (reduction.DupFd(self._fd),)

    @classmethod
    def _from_descriptor(cls, fd: int) -> Heartbeat:
        """The heartbeat mapped from received descriptor ``fd`` (closed here; the
        mapping holds its own), not to be sent on."""
        heartbeat = cls.__new__(cls)
        heartbeat._fd = None
        try:
            heartbeat._counter = _mapping(fd)
        finally:
            os.close(fd)
        return heartbeat


_COUNTER = struct.Struct("q")


def _anonymous_file(nbytes: int) -> int:
    """A descriptor of a new ``nbytes``-byte file that has no name anywhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("odb-heartbeat", os.MFD_CLOEXEC)
    else:  # no memfd (not Linux): an unlinked temporary file
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, nbytes)
    return fd


def _mapping(fd: int) -> mmap.mmap:
    """The counter's shared mapping (it holds a descriptor of its own while it lives)."""
    return mmap.mmap(fd, _COUNTER.size)


def _mapped_heartbeat(descriptor: Any) -> Heartbeat:
    """The shared heartbeat of a descriptor received from the trainer, mapped here."""
    return Heartbeat._from_descriptor(descriptor.detach())


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
