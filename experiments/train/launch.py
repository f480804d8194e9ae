"""Distributed set-up of a training run: the process group, its device, start-up timing, logs.

``torchrun`` (or Slurm around it) starts the ranks; a plain ``python -m`` launch gets a
one-process group on a free loopback port. Nothing here reads the data or the model.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import time
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

from experiments.train.config import TrainConfig

log = logging.getLogger("experiments.train")


@dataclasses.dataclass(frozen=True)
class Dist:
    """Where this rank stands: its rank, the world size, its local rank, nodes, device."""

    rank: int
    world_size: int
    local_rank: int
    nodes: int
    device: torch.device


def init_distributed(cfg: TrainConfig) -> Dist:
    """Join torchrun's process group, or make a one-process group for a plain launch.

    A caller that already joined a default group (a launcher of its own, a notebook, the
    test harness's warm ranks) trains in that group, which stays the caller's to end;
    LOCAL_RANK and LOCAL_WORLD_SIZE come from the environment (one node when unset).
    """
    joined = dist.is_initialized()
    if not joined and "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available()
    backend = cfg.strategy.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if joined else 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not joined:
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.strategy.timeout_s))
    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Dist(dist.get_rank(), world, local_rank, max(1, world // per_node), device)


class StartupClock:
    """Seconds spent in each start-up phase, from the process's own start.

    The first phase is the launch and the imports (process creation to :func:`main`);
    each :meth:`mark` closes the phase since the previous one. :meth:`summary` is the
    one log line a slow start is read from (a Slurm job's or a test's stderr).
    """

    def __init__(self) -> None:
        launched = time.time() - psutil.Process().create_time()
        self.phases: dict[str, float] = {"launch and imports": max(0.0, launched)}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = now - self._last
        self._last = now

    def summary(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{name} {s:.1f} s" for name, s in self.phases.items())
        return f"start-up {total:.1f} s: {parts}"


def setup_logging(rank: int) -> None:
    """Log lines to stderr, each naming its rank; INFO on rank 0, WARNING elsewhere."""
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(message)s", stream=sys.stderr)
