"""Run ranks that are expected to fail, and audit what they leave behind.

:func:`harness.ranks.run_ranks` treats the first failing rank as the end of the run (its
peers get a short grace, then are killed as hung). Fault tests need the opposite: a
rank may be killed on purpose, and every *other* rank must then end by itself, with a
clear error, within the configured timeout. :func:`run_fault_ranks` therefore

- starts the ranks as ``run_ranks`` does (same rank entry, own process group per rank,
  faulthandler on SIGUSR1, Gloo default group), but forked from a fork server that
  imported torch and the rank code once (:func:`rank_server`), not spawned: a spawned
  rank spends about 2 s of CPU on the interpreter and its imports before it runs;
- waits for *every* rank to exit, up to a hard ``timeout``; ranks still running then
  are reported as hung with their Python stacks, and killed;
- after the ranks have exited, waits up to ``orphan_wait_s`` for every process of their
  process groups (collate processes, DataLoader workers, resource trackers) to exit by
  itself, and reports the ones that did not as orphans before killing them.

The function run on each rank must be module-level and should catch the loader's
error itself and return a description of it (see ``tests/odb/fault_ranks.py``), so
that a rank that failed as expected still reports a result.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.processes import host_store, kill_tree
from harness.rank_process import group_members, rank_main
from harness.ranks import _read_stack, _wait_for_stacks

_GLOO_TIMEOUT_MARGIN_S = 60.0
# What the fork server imports once for every rank it forks.
_SERVER_IMPORTS = ["torch", "torch.distributed", "psutil", "odb", "tests.odb.fault_ranks"]
_served = False  # inside rank_server()


@contextlib.contextmanager
def rank_server() -> Iterator[None]:
    """The fork server the ranks of :func:`run_fault_ranks` start from, inside the block.

    multiprocessing's own fork server (one per program), started at the first call with
    torch and the rank code imported, and stopped on the way out: it is a child of this
    process, which other tests' listings of their children would see. A forked rank
    is still a process of its own; it gets this process's working directory and
    ``sys.path`` as a spawned one does (multiprocessing's preparation) and its whole
    environment from :func:`run_fault_ranks` (the server's is the one it started with).
    """
    global _served
    mp.set_forkserver_preload(_SERVER_IMPORTS)
    _served = True
    try:
        yield
    finally:
        _served = False
        multiprocessing.forkserver._forkserver._stop()  # no public stop in 3.11
        mp.set_forkserver_preload([])


@dataclass
class RankOutcome:
    """How one rank ended."""

    rank: int
    exitcode: int | None
    value: Any = None  # what fn returned ("ok" ranks)
    error: str | None = None  # the traceback of an exception that escaped fn
    hung: bool = False
    stack: str = ""


@dataclass
class FaultRun:
    """Everything a fault test checks: per-rank outcomes, hangs and orphans."""

    outcomes: list[RankOutcome]
    orphans: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def hung(self) -> list[int]:
        return [o.rank for o in self.outcomes if o.hung]

    def describe(self) -> str:
        parts = [f"wall {self.wall_s:.1f} s, orphans: {self.orphans or 'none'}"]
        for o in self.outcomes:
            parts.append(f"--- rank {o.rank}: exit {o.exitcode}, hung={o.hung}")
            if o.value is not None:
                parts.append(repr(o.value))
            if o.error:
                parts.append(o.error)
            if o.stack:
                parts.append(o.stack)
        return "\n".join(parts)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} ({' '.join(proc.cmdline())[:120]})"
    except psutil.NoSuchProcess:
        return f"pid {proc.pid} (gone)"


def run_fault_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    orphan_wait_s: float = 10.0,
    env: Mapping[str, str] | None = None,
) -> FaultRun:
    """Run ``fn(rank, world_size, *args)`` on ranks of their own; never raises for a rank.

    Inside :func:`rank_server` the ranks are forked from its server, else spawned.

    Returns:
        A :class:`FaultRun`. Every process the ranks started is dead when it returns.
    """
    ctx = mp.get_context("forkserver" if _served else "spawn")
    workdir = tempfile.mkdtemp(prefix="fault_ranks-")
    store = host_store(timeout + _GLOO_TIMEOUT_MARGIN_S)  # held until the ranks are gone
    port = store.port
    procs: list[Any] = []
    started = time.monotonic()
    try:
        for rank in range(world_size):
            proc = ctx.Process(
                target=rank_main,
                args=(
                    rank,
                    world_size,
                    port,
                    "gloo",
                    timeout + _GLOO_TIMEOUT_MARGIN_S,
                    {**os.environ, **(env or {})},
                    workdir,
                    fn,
                    args,
                ),
                name=f"rank{rank}",
            )
            proc.start()
            procs.append(proc)
        pgids = {p.pid for p in procs}
        deadline = started + timeout
        while True:
            alive = [p for p in procs if p.exitcode is None]
            now = time.monotonic()
            if not alive or now >= deadline:
                break
            mp.connection.wait([p.sentinel for p in alive], timeout=deadline - now)
        hung = [rank for rank, p in enumerate(procs) if p.exitcode is None]
        for rank in hung:
            try:
                os.kill(procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        _wait_for_stacks(workdir, hung)
        orphans: list[str] = []
        if not hung:
            # Every rank has exited: what is left of their process groups must go by itself.
            settle = time.monotonic() + orphan_wait_s
            left = group_members(pgids)
            while left and time.monotonic() < settle:
                time.sleep(0.1)
                left = group_members(pgids)
            orphans = [_describe(p) for p in left]
        wall_s = time.monotonic() - started
        outcomes = _outcomes(procs, hung, workdir)
        return FaultRun(outcomes, orphans, wall_s)
    finally:
        live = [p.pid for p in procs if p.exitcode is None]
        kill_tree(live, groups=[p.pid for p in procs])
        for p in procs:
            p.join()
        shutil.rmtree(workdir, ignore_errors=True)


def _outcomes(procs: list[Any], hung: list[int], workdir: str) -> list[RankOutcome]:
    out = []
    for rank, proc in enumerate(procs):
        outcome = RankOutcome(rank, proc.exitcode, hung=rank in hung)
        if outcome.hung:
            outcome.stack = _read_stack(workdir, rank)
        path = Path(workdir, f"rank{rank}.result")
        if path.exists():
            status, value = pickle.loads(path.read_bytes())
            if status == "ok":
                outcome.value = value
            else:
                outcome.error = value
        out.append(outcome)
    return out
