"""Run a function on W real ranks (torch.distributed over Gloo) with a hard wall-clock limit.

Every distributed test uses this helper so that a bug shows up as a clear failure, never
as a hung test run:

- a rank that raises is named, with its full traceback;
- a fresh rank that returns but then exits with another code than 0 (an abort while
  the interpreter ends) is named, with its code;
- ranks still running at the deadline are named as hung, with the Python stacks they
  were stuck in (faulthandler, dumped on SIGUSR1 just before they are killed);
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
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch.distributed

from harness.rank_process import CALL_FILE, SETTLE_S, Call, serve

# After the first failing rank, peers blocked in a collective cannot finish on their own;
# give healthy peers this long to exit before they are treated as hung and killed.
_FAILURE_GRACE_S = 2.0
# Longest wait for faulthandler to write the stacks after SIGUSR1.
_STACK_DUMP_WAIT_S = 2.0
# Gloo's own timeout stays beyond the wall-clock limit, so a hang is reported by this
# helper (with stacks) rather than as a Gloo error raised in a waiting peer.
_GLOO_TIMEOUT_MARGIN_S = 60.0
# A pooled rank is no child of this process, so its death shows in nothing this process
# can wait on: the wait for ranks looks again this often.
_POLL_S = 0.1
# A pooled rank reports within SETTLE_S of its call's end, after leaving the group and a
# garbage collection; a rank that has not reported after this long is not reused.
_REPORT_WAIT_S = SETTLE_S + 10.0
# Longest a call's ranks may take to start and join their group; a call's timeout
# counts from the moment all of them have, so a slow start never eats into it.
_START_LIMIT_S = 120.0
# Idle ranks a pool keeps: the largest world size of the suite's run_ranks tests.
_POOL_KEEP = 4
# What a rank reports, in order, as it goes through a call (harness/rank_process.py).
_STAGES = ("started", "ready", "done", "clean")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then release).

    Another process can take it before the caller binds it: only for programs that
    cannot bind port 0 themselves (:func:`host_store` and ``torchrun --standalone`` can).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_store(timeout_s: float) -> torch.distributed.TCPStore:
    """The rendezvous store of ranks started by this module, on 127.0.0.1.

    Bound here on a port the OS picks; the caller holds it until its ranks are gone, so
    no other process can take the port between choosing it and the ranks joining (as a
    port found free and released could be). Pass ``store.port`` to the ranks.
    """
    return torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _descendants(pids: Sequence[int]) -> list[psutil.Process]:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs.extend(proc.children(recursive=True))
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    return procs


def kill_tree(pids: Sequence[int], groups: Sequence[int] = ()) -> None:
    """SIGKILL live processes ``pids``, all their descendants and process groups ``groups``.

    Only pass pids of processes that are still running and not yet reaped; a reaped pid
    may already belong to an unrelated process.
    """
    # Collect the whole tree before killing anything: once a parent dies its children
    # are re-parented and can no longer be found through it.
    procs = _descendants(pids)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty: nothing left behind
    # The roots are reaped by their owners (Process.join, Popen.communicate); reaping
    # them here would hide their exit codes. Descendants only need to be dead: a zombie
    # is, whoever reaps it later.
    roots = set(pids)
    _wait_dead([p for p in procs if p.pid not in roots], 5.0)


def _wait_dead(procs: Sequence[psutil.Process], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not _is_dead(p)]
        if pending:
            time.sleep(0.02)


def _is_dead(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class _Rank:
    """This process's handle on one rank process (:func:`harness.rank_process.serve`).

    A fresh rank is a child of this process. A pooled rank is detached (no child of this
    process): its death is seen by polling, and its exit code is never known.
    """

    def __init__(self, detach: bool) -> None:
        ctx = mp.get_context("spawn")
        self._from_rank, child_out = ctx.Pipe(duplex=False)
        child_in, self._to_rank = ctx.Pipe(duplex=False)
        self._launcher = ctx.Process(target=serve, args=(child_in, child_out, detach), name="rank")
        self._launcher.start()
        child_in.close()
        child_out.close()
        self.detached = detach
        self.pid: int | None = None  # known once the rank says it has started
        self._proc: psutil.Process | None = None
        self.said = ""  # the kind of the last message
        self.reasons: list[str] = []  # why a pooled rank is unfit for another call
        if not detach:
            self._started(self._launcher.pid)  # the launcher is the rank

    def read(self) -> None:
        """Take in every message the rank has sent since the last read."""
        while not self._from_rank.closed and self._from_rank.poll():
            try:
                kind, *rest = self._from_rank.recv()
            except EOFError:
                self._from_rank.close()  # the rank and every holder of its pipe are gone
                return
            if kind == "started":
                self._started(rest[0])
            elif kind == "clean":
                self.reasons = rest[0]
            self.said = kind

    def _started(self, pid: int) -> None:
        self.pid = pid
        with contextlib.suppress(psutil.NoSuchProcess):  # already gone: alive() says so
            self._proc = psutil.Process(pid)
        if self.detached:
            self._launcher.join()  # it exits right after reporting its fork

    def alive(self) -> bool:
        if self.detached and self.pid is None and self._launcher.exitcode is not None:
            self.read()  # a launcher reports its fork before it exits
        if not self.detached or self.pid is None:
            return self._launcher.exitcode is None
        return self._proc is not None and not _is_dead(self._proc)

    def reached(self, stage: str) -> bool:
        """Whether the rank has got to ``stage`` (one of _STAGES, or "gone": exited)."""
        if stage == "gone":
            return not self.alive()
        return self.said in _STAGES and _STAGES.index(self.said) >= _STAGES.index(stage)

    def failed(self, stage: str) -> bool:
        """Whether the rank reported an error, or died before ``stage``."""
        if self.said == "failed" or stage == "gone" or self.alive():
            return self.said == "failed"
        self.read()  # what it said before it died
        return self.said == "failed" or not self.reached(stage)

    def waitables(self) -> list[Any]:
        """What :func:`multiprocessing.connection.wait` can wait on for this rank."""
        out: list[Any] = [] if self._from_rank.closed else [self._from_rank]
        return out + ([self._launcher.sentinel] if self._launcher.exitcode is None else [])

    def call(self, workdir: str, number: int) -> None:
        """Hand the rank the call in ``workdir`` as rank ``number``."""
        self.said, self.reasons = "", []  # what it says from now on is about this call
        self.send(("call", workdir, number))

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # the rank is gone: waiting for it says so
            self._to_rank.send(message)

    def signal(self, signum: int) -> None:
        if self._proc is not None:
            with contextlib.suppress(psutil.Error):
                self._proc.send_signal(signum)

    def exit_code(self) -> int | None:
        """A fresh rank's exit code once it has exited; None for a pooled rank or one alive."""
        return None if self.detached else self._launcher.exitcode

    def ended(self) -> str:
        """How the rank ended, for a failure message."""
        if self.detached:
            return "died (a pooled rank, no child of the test process: exit code unknown)"
        return f"exited with code {self._launcher.exitcode} (negative codes are signals)"

    def kill(self) -> None:
        """SIGKILL the rank, its descendants and its process group; return once dead."""
        self.read()
        if self.pid is None:  # a launcher that has not reported its fork yet
            self._launcher.kill()
            self._launcher.join()
            self.read()
        if self.pid is not None:
            live = [self.pid] if self._proc is not None and not _is_dead(self._proc) else []
            kill_tree(live, groups=[self.pid])
            self._launcher.join()  # reaps a fresh rank; a pooled rank's launcher is gone
            _wait_dead([self._proc] if self._proc is not None else [], 5.0)
        self._from_rank.close()
        self._to_rank.close()


def _wait(ranks: Sequence[_Rank], stage: str, deadline: float) -> tuple[list[int], list[int]]:
    """Wait until every rank has reached ``stage``; return (failed, hung) rank numbers.

    A rank fails by reporting an error or by dying first. After the first failure the
    others get ``_FAILURE_GRACE_S``; those still short of ``stage`` then, or at
    ``deadline``, are hung.
    """
    first_failure = None
    while True:
        for rank in ranks:
            rank.read()
        failed = [n for n, rank in enumerate(ranks) if rank.failed(stage)]
        pending = [n for n, r in enumerate(ranks) if n not in failed and not r.reached(stage)]
        now = time.monotonic()
        if failed and first_failure is None:
            first_failure = now
        limit = deadline
        if first_failure is not None:
            limit = min(deadline, first_failure + _FAILURE_GRACE_S)
        if not pending or now >= limit:
            return failed, pending
        waitables = [w for n in pending for w in ranks[n].waitables()]
        mp.connection.wait(waitables, timeout=min(limit - now, _POLL_S))


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
        self._idle: list[_Rank] = []
        atexit.register(self.close)  # no rank outlives the program, however it ends

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def take(self, n: int) -> list[_Rank]:
        dead = [rank for rank in self._idle if not rank.alive()]
        self._idle = [rank for rank in self._idle if rank not in dead]
        self.drop(dead, "died while idle")
        taken, self._idle = self._idle[:n], self._idle[n:]
        self.counts["reused"] += len(taken)
        self.counts["started"] += n - len(taken)
        return taken + [_Rank(detach=True) for _ in range(n - len(taken))]

    def give_back(self, ranks: Sequence[_Rank]) -> None:
        """Keep the ranks of a successful call that report clean; kill the others."""
        clean: list[_Rank] = []
        try:
            _wait(ranks, "clean", time.monotonic() + _REPORT_WAIT_S)
            clean = [r for r in ranks if r.said == "clean" and not r.reasons]
        finally:
            self._idle = clean + self._idle
            for rank in ranks:
                if rank not in clean:
                    why = rank.reasons[0] if rank.reasons else "no clean report in time"
                    self.drop([rank], why.split(":")[0])
            self.drop(self._idle[self.keep :], "more than the pool keeps")
            del self._idle[self.keep :]

    def drop(self, ranks: Sequence[_Rank], why: str) -> None:
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
    ranks: list[_Rank] = []
    try:
        Path(workdir, CALL_FILE).write_bytes(pickle.dumps(call))
        ranks = pool.take(world_size) if pool else [_Rank(detach=False) for _ in range(world_size)]
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


def _run(ranks: Sequence[_Rank], workdir: str, timeout: float, fresh: bool) -> list[Any]:
    """Hand the call to the ranks, start ``fn`` on all together, collect the results."""
    for number, rank in enumerate(ranks):
        rank.call(workdir, number)
    failed, hung = _wait(ranks, "ready", time.monotonic() + _START_LIMIT_S)
    when = f"while starting, at the {_START_LIMIT_S:.0f} s start-up limit"
    if not (failed or hung):
        for rank in ranks:
            rank.send(("go",))
        deadline = time.monotonic() + timeout
        failed, hung = _wait(ranks, "done", deadline)
        if fresh and not (failed or hung):
            failed, hung = _wait(ranks, "gone", deadline)  # a fresh rank exits after its call
        when = f"at the {timeout:.1f} s timeout"
    for number in hung:
        ranks[number].signal(signal.SIGUSR1)
    _wait_for_stacks(workdir, hung)
    return _collect(ranks, hung, workdir, when)


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


def _collect(ranks: Sequence[_Rank], hung: list[int], workdir: str, when: str) -> list[Any]:
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
            parts.extend(f"--- rank {rank} ---\n{_read_stack(workdir, rank)}" for rank in hung)
        raise AssertionError("\n\n".join(parts))
    return results


def torchrun_command(
    target: str | os.PathLike[str], world_size: int, args: Sequence[str] = (), module: bool = False
) -> list[str]:
    """``torchrun --standalone --local-addr 127.0.0.1 --nproc_per_node world_size target``.

    ``--standalone``: the launcher's rendezvous store, which its workers join, binds a
    port the OS picks on 127.0.0.1 (``--local-addr``: the host name may not resolve
    to this machine) and holds it, so no other process can take it between choosing
    and binding (as a port found free and released could be). With ``module=True``,
    ``target`` is a module name run as ``torchrun -m``.
    """
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr",
        "127.0.0.1", "--nproc_per_node", str(world_size), *(["-m"] if module else []),
        str(target), *args,
    ]  # fmt: skip


def without_progress_bars(text: str) -> str:
    """``text`` without tqdm's progress-bar lines (``\\r``- or newline-separated): what a
    failure message should show of a run's stderr, whose tail is otherwise all bars."""
    lines = text.replace("\r", "\n").split("\n")
    return "\n".join(
        line for line in lines if line.strip() and not _PROGRESS_BAR.search(line)
    )


_PROGRESS_BAR = re.compile(r"\d+%\|.*\||\[\d\d:\d\d<")


def run_torchrun(
    script_path: str | os.PathLike[str],
    world_size: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    module: bool = False,
) -> tuple[int, str, str]:
    """Run ``script_path`` under :func:`torchrun_command` (``module=True``: a module name).

    Returns:
        ``(returncode, stdout, stderr)`` of the launcher.

    Raises:
        AssertionError: still running after ``timeout`` seconds; the launcher and all
            its workers are killed first, and the message holds the output so far.

    Example:
        >>> code, out, err = run_torchrun("train_tiny.py", 2, ["--steps", "3"], timeout=60)
    """
    cmd = torchrun_command(script_path, world_size, args, module)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A rank killed by a fatal signal (an abort at exit) prints every thread's stack.
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
        start_new_session=True,  # the launcher and its workers share one killable group
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree([proc.pid], groups=[proc.pid])
        out, err = proc.communicate()
        raise AssertionError(
            f"torchrun ({world_size} ranks) still running after {timeout:.1f} s; killed.\n"
            f"command: {' '.join(cmd)}\n--- stdout ---\n{out[-4000:]}\n"
            f"--- stderr ---\n{err[-4000:]}"
        ) from None
    except BaseException:
        kill_tree([proc.pid], groups=[proc.pid])
        proc.communicate()
        raise
    kill_tree([], groups=[proc.pid])  # workers a crashed launcher may have left behind
    return proc.returncode, out, err
