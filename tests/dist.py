"""Run a function on W real ranks (torch.distributed over Gloo) with a hard wall-clock limit.

Every distributed test uses this helper so that a bug shows up as a clear failure, never
as a hung test run:

- a rank that raises is named, with its full traceback;
- ranks still running at the deadline are named as hung, with the Python stacks they
  were stuck in (faulthandler, dumped on SIGUSR1 just before they are killed);
- every rank process and its descendants are killed before the helper returns or raises.

Functions passed to `run_ranks` must be module-level (picklable by reference), because
ranks are started with the ``spawn`` method: fork after torch has started threads is unsafe.

Example:
    >>> def _sum(rank, world_size):  # module level in a real test
    ...     t = torch.tensor([rank]); dist.all_reduce(t); return t.item()
    >>> run_ranks(_sum, 2)
    [1, 1]
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch.distributed

# After the first failing rank, peers blocked in a collective cannot finish on their own;
# give healthy peers this long to exit before they are treated as hung and killed.
_FAILURE_GRACE_S = 2.0
# Longest wait for faulthandler to write the stacks after SIGUSR1.
_STACK_DUMP_WAIT_S = 2.0
# Gloo's own timeout stays beyond the wall-clock limit, so a hang is reported by this
# helper (with stacks) rather than as a Gloo error raised in a waiting peer.
_GLOO_TIMEOUT_MARGIN_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_store(timeout_s: float) -> torch.distributed.TCPStore:
    """The rendezvous store of ranks started by :func:`_rank_main`, on 127.0.0.1.

    Bound here on a port the OS picks; the caller holds it until its ranks are gone, so
    no other process can take the port between choosing it and the ranks joining (as a
    port found free and released could be). Pass ``store.port`` to the ranks.
    """
    return torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=timeout_s),
    )


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    pg_timeout_s: float,
    env: Mapping[str, str],
    workdir: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    # Own process group: descendants a rank leaves behind stay killable via killpg even
    # after the rank itself has exited and been reaped.
    os.setpgrp()
    # The rank starts its own children (DataLoader workers) the way a torchrun-launched
    # trainer does: with the platform's default start method (fork on Linux). Spawn is
    # only how this helper starts the ranks, and a spawned child would inherit it.
    mp.set_start_method(mp.get_all_start_methods()[0], force=True)
    # Registered first, so that a hang anywhere below (even inside a C++ collective)
    # can be dumped on SIGUSR1. The file must stay open for the process lifetime.
    stack_file = open(Path(workdir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    result_path = Path(workdir, f"rank{rank}.result")
    try:
        import torch.distributed as dist

        # The store is the parent's (run_ranks holds its port from bind to the end), so
        # no other process can take the port between choosing it and the ranks joining.
        store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=timedelta(seconds=pg_timeout_s)
        )
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout_s),
        )
        value = fn(rank, world_size, *args)
        payload = pickle.dumps(("ok", value))
    except BaseException:
        payload = pickle.dumps(("error", traceback.format_exc()))
        result_path.write_bytes(payload)
        sys.stdout.flush()
        sys.stderr.flush()
        # No destroy_process_group here: it can block on peers that are still running.
        os._exit(1)
    result_path.write_bytes(payload)
    dist.destroy_process_group()


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
    deadline = time.monotonic() + 5.0
    pending = [p for p in procs if p.pid not in roots]
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if not _is_dead(p)]
        if pending:
            time.sleep(0.02)


def _is_dead(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_ranks(procs: Sequence[Any]) -> None:
    # `exitcode is None` polls (and reaps) each process, so only live pids are passed on.
    live = [p.pid for p in procs if p.exitcode is None]
    kill_tree(live, groups=[p.pid for p in procs])
    for p in procs:
        p.join()


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


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks; return results.

    Each rank joins a fresh process group (``backend`` over TCP on 127.0.0.1, free port)
    before ``fn`` is called. ``env`` entries are set in every rank before that.

    Args:
        fn: module-level function; its return value must be picklable.
        world_size: number of ranks, at least 1.
        *args: extra picklable arguments passed to ``fn`` after rank and world size.
        timeout: hard wall-clock limit in seconds for the whole run, start-up included.
        backend: torch.distributed backend.
        env: environment variables to set in each rank.

    Returns:
        The ranks' return values, indexed by rank.

    Raises:
        AssertionError: a rank raised or died (the message names it and includes its
            traceback), or ranks were still running at ``timeout`` (the message names
            them and includes their stacks). All rank processes are dead by then.

    Example:
        >>> run_ranks(_rank_and_size, 3)  # _rank_and_size returns (rank, world_size)
        [(0, 3), (1, 3), (2, 3)]
    """
    if world_size < 1:
        raise ValueError(f"Invalid world_size {world_size}, it should be at least 1")
    ctx = mp.get_context("spawn")
    workdir = tempfile.mkdtemp(prefix="run_ranks-")
    store = host_store(timeout + _GLOO_TIMEOUT_MARGIN_S)  # held until the ranks are gone
    port = store.port
    procs = []
    try:
        for rank in range(world_size):
            proc = ctx.Process(
                target=_rank_main,
                args=(
                    rank,
                    world_size,
                    port,
                    backend,
                    timeout + _GLOO_TIMEOUT_MARGIN_S,
                    dict(env or {}),
                    workdir,
                    fn,
                    args,
                ),
                name=f"rank{rank}",
            )
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + timeout
        first_failure = None
        while True:
            alive = [p for p in procs if p.exitcode is None]
            if not alive:
                break
            now = time.monotonic()
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = now
            if now >= deadline or (
                first_failure is not None and now - first_failure >= _FAILURE_GRACE_S
            ):
                break
            wait_s = deadline - now
            if first_failure is not None:
                wait_s = min(wait_s, first_failure + _FAILURE_GRACE_S - now)
            mp.connection.wait([p.sentinel for p in alive], timeout=max(wait_s, 0.0))

        hung = [rank for rank, p in enumerate(procs) if p.exitcode is None]
        for rank in hung:
            try:
                os.kill(procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        _wait_for_stacks(workdir, hung)
        _kill_ranks(procs)
        return _collect(procs, hung, workdir, timeout)
    finally:
        _kill_ranks(procs)  # again, for an exception or interrupt raised above
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(procs: list[Any], hung: list[int], workdir: str, timeout: float) -> list[Any]:
    results: list[Any] = []
    failures: list[tuple[int, str]] = []  # (when reported, message)
    for rank, proc in enumerate(procs):
        path = Path(workdir, f"rank{rank}.result")
        if rank in hung:
            results.append(None)
        elif not path.exists():
            failures.append(
                (
                    time.time_ns(),
                    f"rank {rank} exited with code {proc.exitcode} without reporting a "
                    "result (negative codes are signals)",
                )
            )
            results.append(None)
        else:
            status, value = pickle.loads(path.read_bytes())
            if status == "error":
                failures.append((path.stat().st_mtime_ns, f"rank {rank} raised:\n{value}"))
            results.append(value)
    if failures or hung:
        # Earliest first: later errors in peers are usually consequences of the first.
        parts = [message for _, message in sorted(failures)]
        if hung:
            why = "after another rank failed" if failures else f"at the {timeout:.1f} s timeout"
            parts.append(f"ranks {hung} hung (still running {why}); killed. Their stacks:")
            parts.extend(f"--- rank {rank} ---\n{_read_stack(workdir, rank)}" for rank in hung)
        raise AssertionError("\n\n".join(parts))
    return results


def run_torchrun(
    script_path: str | os.PathLike[str],
    world_size: int,
    args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    module: bool = False,
) -> tuple[int, str, str]:
    """Run ``script_path`` under ``torchrun --nproc_per_node world_size`` on a free port.

    With ``module=True``, ``script_path`` is a module name run as ``torchrun -m``.

    Returns:
        ``(returncode, stdout, stderr)`` of the launcher.

    Raises:
        AssertionError: still running after ``timeout`` seconds; the launcher and all
            its workers are killed first, and the message holds the output so far.

    Example:
        >>> code, out, err = run_torchrun("train_tiny.py", 2, ["--steps", "3"], timeout=60)
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc_per_node",
        str(world_size),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *(["-m"] if module else []),
        str(script_path),
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
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
