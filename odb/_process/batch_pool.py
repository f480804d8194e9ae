"""Which hand-off pool, if any, this process builds big batch fields in.

An ODB collate process registers its hand-off pool (:class:`odb._process.handoff.BlockPool`)
here for as long as it collates, so :func:`odb.batch_empty` and :func:`odb.batch_cat`,
called from the user's collate function, build big fields straight into blocks the
trainer receives without a copy. The registration is process-global and names the
process that made it: a process forked later (a DataLoader worker) does not use it.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
from torch.utils.data import get_worker_info


class Pool(Protocol):
    """What a pool gives a collate function: ``nbytes`` of shared memory, as bytes."""

    def empty(self, nbytes: int) -> torch.Tensor: ...


_pool: Pool | None = None
_pool_pid = -1


def share_batches(pool: Pool | None) -> None:
    """Build big batch fields in this process from ``pool`` (an ODB collate process's
    :class:`odb._process.handoff.BlockPool`), or stop (None). Processes forked later do not."""
    global _pool, _pool_pid
    _pool, _pool_pid = pool, os.getpid()


def own_pool() -> Pool | None:
    """The pool this process registered, or None (none, or registered by a parent)."""
    return _pool if _pool_pid == os.getpid() else None


def batches_cross_processes() -> bool:
    """Whether a batch built here is handed to another process (collate process, worker)."""
    return own_pool() is not None or get_worker_info() is not None
