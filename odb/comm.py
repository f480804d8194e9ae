"""The private alignment group: rendezvous and the two collectives of a round.

The collate sides of all ranks talk over their own Gloo group, never the trainer's
(NCCL) group, so alignment traffic cannot interleave with gradient all-reduces.
Rendezvous: at loader construction rank 0's trainer process hosts a ``TCPStore`` on a
free port and broadcasts its address once over the trainer's group; each iteration
(epoch) builds a fresh ``ProcessGroupGloo`` under its own store prefix, so two loaders
or two epochs never share a group. Only public ``torch.distributed`` API is used.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from odb.alignment import STATUS_WIDTH


@dataclass(frozen=True)
class Rendezvous:
    """Where the collate sides of one loader meet: picklable, the same on every rank."""

    host: str
    port: int
    rank: int
    world_size: int
    init_timeout_s: float
    align_timeout_s: float


class StoreHost:
    """Rank 0's ``TCPStore`` server, alive as long as the loader that owns it."""

    def __init__(self, host: str, timeout_s: float) -> None:
        self.host = host
        self.store = dist.TCPStore(
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self.port = self.store.port


def trainer_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the trainer's default group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def open_rendezvous(
    host: str | None, init_timeout_s: float, align_timeout_s: float
) -> tuple[Rendezvous | None, StoreHost | None]:
    """Create the loader's rendezvous; collective over the trainer's group.

    Every rank must call this the same number of times, in the same order (as every
    rank constructs the same loaders). World size 1 needs no group and returns None.
    """
    rank, world = trainer_world()
    if world == 1:
        return None, None
    store_host = None
    address: list[object] = [None]
    if rank == 0:
        store_host = StoreHost(host or socket.gethostname(), init_timeout_s)
        address = [(store_host.host, store_host.port)]
    dist.broadcast_object_list(address, src=0)
    host_name, port = address[0]  # type: ignore[misc]
    return Rendezvous(host_name, port, rank, world, init_timeout_s, align_timeout_s), store_host


class AlignmentGroup:
    """One iteration's Gloo group among the collate sides of all ranks.

    Args:
        rendezvous: Where to meet; None for world size 1 (collectives are local).
        prefix: Store prefix unique to this loader iteration.
    """

    def __init__(self, rendezvous: Rendezvous | None, prefix: str) -> None:
        self.rendezvous = rendezvous
        self.bytes_sent = 0
        self._pg = None
        if rendezvous is None:
            return
        try:
            store = dist.TCPStore(
                rendezvous.host,
                rendezvous.port,
                is_master=False,
                timeout=datetime.timedelta(seconds=rendezvous.init_timeout_s),
            )
            self._pg = dist.ProcessGroupGloo(
                dist.PrefixStore(prefix, store),
                rendezvous.rank,
                rendezvous.world_size,
                datetime.timedelta(seconds=rendezvous.align_timeout_s),
            )
        except RuntimeError as exc:
            raise RuntimeError(
                f"ODB alignment group: rank {rendezvous.rank} could not meet its peers at "
                f"{rendezvous.host}:{rendezvous.port} within init_timeout_s="
                f"{rendezvous.init_timeout_s}: {exc}"
            ) from exc

    @property
    def world_size(self) -> int:
        return 1 if self.rendezvous is None else self.rendezvous.world_size

    def gather_status(self, row: list[int]) -> list[list[int]]:
        """All-gather one fixed-size status row; returns every rank's row in rank order."""
        if len(row) != STATUS_WIDTH:
            raise ValueError(f"status row must have {STATUS_WIDTH} fields, got {len(row)}")
        mine = torch.tensor(row, dtype=torch.int64)
        if self._pg is None:
            return [row]
        out = [torch.zeros(STATUS_WIDTH, dtype=torch.int64) for _ in range(self.world_size)]
        self._run("status all_gather", self._pg.allgather([out], [mine]))
        self.bytes_sent += mine.numel() * mine.element_size()
        return [t.tolist() for t in out]

    def sum_counts(self, counts: list[int]) -> list[int]:
        """All-reduce (sum) a vector of per-step counts over the ranks."""
        vec = torch.tensor(counts, dtype=torch.int64)
        if self._pg is None or not counts:
            return list(counts)
        self._run("count all_reduce", self._pg.allreduce([vec]))
        self.bytes_sent += vec.numel() * vec.element_size()
        return vec.tolist()

    def _run(self, what: str, work: dist.Work) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            assert self.rendezvous is not None
            raise AlignmentTimeoutError(
                f"ODB alignment {what} failed on rank {self.rendezvous.rank}: a peer rank "
                f"died, raised, or was slower than align_timeout_s="
                f"{self.rendezvous.align_timeout_s} s (raise it if a rank's preprocessing "
                f"or step can legitimately take longer). Gloo said: {exc}"
            ) from exc


class AlignmentTimeoutError(RuntimeError):
    """A peer of the alignment group did not answer in time, or is gone."""
