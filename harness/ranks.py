"""Run a function on W real ranks (torch.distributed over Gloo) with a hard wall-clock limit.

Every distributed test uses this helper so that a bug shows up as a clear failure, never
as a hung test run:

- a rank that raises is named, with its full traceback;
- a fresh rank that returns but then exits with another code than 0 (an abort while
  the interpreter ends) is named, with its code;
- ranks still running at the deadline are named as hung, with the Python stacks they
  were stuck in (faulthandler, dumped on SIGUSR1 just before they are killed), and the
  stacks, Python and native, of the processes each hung rank started (its collate processes and
  workers: :mod:`harness.descendant_stacks`);
- when the helper returns or raises, every rank process and its descendants are dead,
  or the rank is back in its pool, clean (below).

Each call joins a fresh process group through a new TCP store that this process binds
on a port the OS picks and holds until the ranks are done. Ranks are spawned processes
(fork after torch has started threads is unsafe), so ``fn`` must be module-level
(picklable by reference). The ranks wait for each other before ``fn``: however long a
rank took to start, every rank begins ``fn`` at the same moment.

Warm ranks: a rank process costs seconds to start (the interpreter, torch and what the
test imports). Inside :func:`use_pool` (the whole pytest session, ``tests/conftest.py``),
``run_ranks`` takes its ranks from a :class:`RankPool` of processes that stay alive
across calls and gives them back afterwards. A rank goes back only if its call succeeded
and it is clean: it left the process group; its environment, working directory,
``sys.path`` and torch settings were put back; no thread, process or signal handler of
the call is left. Otherwise it is killed, never reused. A test that kills, signals or
corrupts a rank, or that needs a fresh interpreter, passes ``fresh=True`` or carries
the ``fresh_ranks`` marker (docs/testing.md, "Distributed tests").

Example:
    >>> def _sum(rank, world_size):  # module level in a real test
    ...     t = torch.tensor([rank]); dist.all_reduce(t); return t.item()
    >>> run_ranks(_sum, 2)
    [1, 1]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.descendant_stacks import descendant_stacks
from harness.processes import host_store
from harness.rank_handle import RankHandle, wait_for_stage
from harness.rank_process import CALL_FILE, SETTLE_S, Call

# Longest wait for faulthandler to write the stacks after SIGUSR1.
_STACK_DUMP_WAIT_S = 2.0
# Gloo's own timeout stays beyond the wall-clock limit, so a hang is reported by this
# helper (with stacks) rather than as a Gloo error raised in a waiting peer.
_GLOO_TIMEOUT_MARGIN_S = 60.0
# A pooled rank reports within SETTLE_S of its call's end, after leaving the group and a
# garbage collection; a rank that has not reported after this long is not reused.
_REPORT_WAIT_S = SETTLE_S + 10.0
# Longest a call's ranks may take to start and join their group; a call's timeout
# counts from the moment all of them have, so a slow start never eats into it.
_START_LIMIT_S = 120.0
# Idle ranks a pool keeps: the largest world size of the suite's run_ranks tests.
_POOL_KEEP = 4


class RankPool:
    """Idle rank processes that successive :func:`run_ranks` calls share.

    A call takes as many ranks as it needs (starting the rest) and gives back those that
    come out clean (module docstring); any process can serve any rank number of any
    world size. At most ``keep`` ranks stay idle, the most recently used first.
    ``counts`` says how many ranks were started and reused, and why any were dropped.

    Example:
        >>> with RankPool() as pool, use_pool(pool):
        ...     first, second = run_ranks(_pid, 2), run_ranks(_pid, 2)
        >>> first == second  # the same two processes
        True
    """

    def __init__(self, keep: int = _POOL_KEEP) -> None:
        self.keep = keep
        self.counts: Counter[str] = Counter()
        self.owner = os.getpid()  # a forked copy of this process must not use its ranks
        self._idle: list[RankHandle] = []
        atexit.register(self.close)  # no rank outlives the program, however it ends

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def take(self, n: int) -> list[RankHandle]:
        dead = [rank for rank in self._idle if not rank.alive()]
        self._idle = [rank for rank in self._idle if rank not in dead]
        self.drop(dead, "died while idle")
        taken, self._idle = self._idle[:n], self._idle[n:]
        self.counts["reused"] += len(taken)
        self.counts["started"] += n - len(taken)
        return taken + [RankHandle(detach=True) for _ in range(n - len(taken))]

    def give_back(self, ranks: Sequence[RankHandle]) -> None:
        """Keep the ranks of a successful call that report clean; kill the others."""
        clean: list[RankHandle] = []
        try:
            wait_for_stage(ranks, "clean", time.monotonic() + _REPORT_WAIT_S)
            clean = [r for r in ranks if r.said == "clean" and not r.reasons]
        finally:
            self._idle = clean + self._idle
            for rank in ranks:
                if rank not in clean:
                    why = rank.reasons[0] if rank.reasons else "no clean report in time"
                    self.drop([rank], why.split(":")[0])
            self.drop(self._idle[self.keep :], "more than the pool keeps")
            del self._idle[self.keep :]

    def drop(self, ranks: Sequence[RankHandle], why: str) -> None:
        """Kill ``ranks`` and count them under ``why``."""
        for rank in ranks:
            rank.kill()
        if ranks:
            self.counts[f"dropped: {why}"] += len(ranks)

    def close(self) -> None:
        """Kill every idle rank (a clean idle rank holds nothing that needs an exit)."""
        if os.getpid() != self.owner:
            return
        atexit.unregister(self.close)
        idle, self._idle = self._idle, []
        for rank in idle:
            rank.kill()

    def pids(self) -> list[int]:
        """The idle ranks' process ids, the next to be taken first."""
        return [rank.pid for rank in self._idle if rank.pid is not None]

    def summary(self) -> str:
        dropped = [
            f"{n} {key.removeprefix('dropped: ')}"
            for key, n in self.counts.items()
            if key.startswith("dropped: ")
        ]
        return (
            f"rank pool: {self.counts['reused']} rank starts saved (ranks reused), "
            f"{self.counts['started']} ranks started"
            + (f"; dropped: {', '.join(dropped)}" if dropped else "")
        )


_active_pool: RankPool | None = None


@contextlib.contextmanager
def use_pool(pool: RankPool | None) -> Iterator[RankPool | None]:
    """Inside, :func:`run_ranks` takes its ranks from ``pool`` (None: fresh ranks)."""
    global _active_pool
    previous, _active_pool = _active_pool, pool
    try:
        yield pool
    finally:
        _active_pool = previous


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    fresh: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results.

    Each rank joins a fresh process group (``backend`` over TCP on 127.0.0.1), then the
    ranks start ``fn`` together. Each rank sees this process's environment (``env`` on
    top), working directory and ``sys.path`` as they are at the call.

    Args:
        fn: module-level function; its return value must be picklable.
        world_size: number of ranks, at least 1.
        *args: extra picklable arguments passed to ``fn`` after rank and world size.
        timeout: hard wall-clock limit in seconds for ``fn``, from the moment every rank
            has joined the group (starting and joining have a limit of their own,
            _START_LIMIT_S, so a slow start never eats into it).
        backend: torch.distributed backend.
        env: environment variables to set in each rank, for this call only.
        fresh: newly spawned ranks that exit after the call, even inside
            :func:`use_pool` (a test that kills or corrupts a rank, or needs a fresh
            interpreter). Outside a pool every call is fresh.

    Returns the ranks' return values, indexed by rank (``[(0, 3), (1, 3), (2, 3)]`` for
    a ``fn`` returning ``(rank, world_size)`` at 3). Raises AssertionError when a rank
    raised or died (named, with its traceback) or ranks still ran at ``timeout`` (named,
    with their stacks); every rank of the call is dead by then.
    """
    if world_size < 1:
        raise ValueError(f"Invalid world_size {world_size}, it should be at least 1")
    pool = _pool_for(fresh)
    workdir = tempfile.mkdtemp(prefix="run_ranks-")
    gloo_timeout_s = _START_LIMIT_S + timeout + _GLOO_TIMEOUT_MARGIN_S
    store = host_store(gloo_timeout_s)  # held until the ranks are done
    call = Call(
        world_size, store.port, backend, gloo_timeout_s,
        {**os.environ, **(env or {})}, os.getcwd(), list(sys.path), fn, args,
        fresh=pool is None,
    )  # fmt: skip
    ranks: list[RankHandle] = []
    try:
        Path(workdir, CALL_FILE).write_bytes(pickle.dumps(call))
        ranks = pool.take(world_size) if pool else RankHandle.fresh(world_size)
        results = _run(ranks, workdir, timeout, fresh=pool is None)
        if pool is not None:
            done, ranks = ranks, []
            pool.give_back(done)
        return results
    finally:
        if pool is not None:
            pool.drop(ranks, "call failed")
        else:
            for rank in ranks:
                rank.kill()  # a fresh rank has exited by now; its group may hold leftovers
        shutil.rmtree(workdir, ignore_errors=True)


def _pool_for(fresh: bool) -> RankPool | None:
    """The pool a call takes its ranks from; None for fresh ranks (asked for, or in a
    forked copy of the pool's process, which has no pool)."""
    pool = _active_pool
    return None if fresh or (pool is not None and pool.owner != os.getpid()) else pool


def _run(ranks: Sequence[RankHandle], workdir: str, timeout: float, fresh: bool) -> list[Any]:
    """Hand the call to the ranks, start ``fn`` on all together, collect the results."""
    for number, rank in enumerate(ranks):
        rank.call(workdir, number)
    failed, hung = wait_for_stage(ranks, "ready", time.monotonic() + _START_LIMIT_S)
    when = f"while starting, at the {_START_LIMIT_S:.0f} s start-up limit"
    if not (failed or hung):
        for rank in ranks:
            rank.send(("go",))
        deadline = time.monotonic() + timeout
        failed, hung = wait_for_stage(ranks, "done", deadline)
        if fresh and not (failed or hung):
            # a fresh rank exits after its call
            failed, hung = wait_for_stage(ranks, "gone", deadline)
        when = f"at the {timeout:.1f} s timeout"
    for number in hung:
        ranks[number].signal(signal.SIGUSR1)
    _wait_for_stacks(workdir, hung)
    below = {number: _descendants_of(ranks[number]) for number in hung}
    return _collect(ranks, below, workdir, when)


def _descendants_of(rank: RankHandle) -> str:
    return "(unknown: no pid)" if rank.pid is None else descendant_stacks(rank.pid)


def _wait_for_stacks(workdir: str, ranks: Sequence[int]) -> None:
    deadline = time.monotonic() + _STACK_DUMP_WAIT_S
    paths = [Path(workdir, f"rank{rank}.stack") for rank in ranks]
    while time.monotonic() < deadline and not all(p.stat().st_size for p in paths if p.exists()):
        time.sleep(0.02)
    if ranks:
        time.sleep(0.1)  # let a dump that has started finish


def _read_stack(workdir: str, rank: int) -> str:
    path = Path(workdir, f"rank{rank}.stack")
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return text or "(no stack dumped: the rank had not reached its faulthandler set-up)"


def _collect(
    ranks: Sequence[RankHandle], below: dict[int, str], workdir: str, when: str
) -> list[Any]:
    """Each rank's result; raise the failures, earliest first, and the hung ranks' stacks
    (``below``: the stacks of each hung rank's descendants)."""
    hung = sorted(below)
    results: list[Any] = []
    failures: list[tuple[int, str]] = []  # (when reported, message)
    for number, rank in enumerate(ranks):
        path = Path(workdir, f"rank{number}.result")
        if number in hung or (not path.exists() and rank.alive()):
            results.append(None)  # hung, or waiting to start fn when a peer failed
        elif not path.exists():
            message = f"rank {number} {rank.ended()} without reporting a result"
            failures.append((time.time_ns(), message))
            results.append(None)
        else:
            status, value = pickle.loads(path.read_bytes())
            if status == "error":
                failures.append((path.stat().st_mtime_ns, f"rank {number} raised:\n{value}"))
            elif rank.exit_code() not in (0, None):  # a complete run must exit 0
                failures.append((time.time_ns(), f"rank {number} returned, then {rank.ended()}"))
            results.append(value)
    if failures or hung:
        # Earliest first: later errors in peers are usually consequences of the first.
        parts = [message for _, message in sorted(failures)]
        if hung:
            why = "after another rank failed" if failures else when
            parts.append(f"ranks {hung} hung (still running {why}); killed. Their stacks:")
            for number in hung:
                parts.append(f"--- rank {number} ---\n{_read_stack(workdir, number)}")
                parts.append(f"--- rank {number}'s descendants (py-spy) ---\n{below[number]}")
        raise AssertionError("\n\n".join(parts))
    return results
