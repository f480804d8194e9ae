"""What runs inside a rank process that ``harness.ranks`` starts.

The test process's side is ``harness/ranks.py``. This module imports no torch at its top,
so that a pooled rank forks away from its launcher before torch is imported.

- :func:`serve` is the body of every ``run_ranks`` rank. Per call it joins a fresh
  process group, says it is ready, waits for the test process's go (so every rank
  starts ``fn`` together, however long a peer took to start), calls ``fn`` and reports.
  A fresh rank then leaves the group and exits. A pooled rank leaves the group, puts
  back what a call may change (environment, working directory, ``sys.path``, torch
  settings), reports whether anything else was left behind (threads, processes,
  signal handlers), and waits for its next call.
- :func:`rank_main` runs one call and exits, reporting by its exit code and a result
  file (``tests/odb/fault_harness.py``, whose ranks are killed on purpose).

Messages to the test process (``conn_out``): ``("started", pid)``, ``("ready",)``,
``("done",)`` once ``rank{r}.result`` is written, ``("failed",)`` before exiting on an
error, and ``("clean", reasons)`` (empty: fit for another call). From it (``conn_in``):
``("call", workdir, rank)`` with the call in ``workdir/call.pkl``, then ``("go",)``;
closing it ends the rank.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, NoReturn

import psutil

CALL_FILE = "call.pkl"
# After a call, how long a pooled rank waits for the threads and processes the call
# started to end by themselves (a loader's workers finishing their shutdown).
SETTLE_S = 2.0
# torch installs this SIGCHLD handler once per process, on a DataLoader's first
# workers, as it would in a fresh rank; torch remembers it did, so it must stay.
_TORCH_SIGCHLD_MODULE = "torch.utils.data._utils.signal_handling"


@dataclass(frozen=True)
class Call:
    """One ``run_ranks`` call as each of its ranks reads it (the rank number apart)."""

    world_size: int
    port: int  # of the test process's TCP store
    backend: str
    pg_timeout_s: float
    environ: dict[str, str]  # the test process's environment, run_ranks' env on top
    cwd: str
    sys_path: list[str]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    fresh: bool  # exit after this call


def rank_environ(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables a launcher sets for a rank (``torchrun`` sets these too)."""
    return dict(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def arm_stack_dump(workdir: str, rank: int) -> IO[str]:
    """Dump every thread's stack to ``workdir/rank{rank}.stack`` on SIGUSR1.

    The returned file must stay open while the rank may be signalled.
    """
    stack_file = open(Path(workdir, f"rank{rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    return stack_file


def default_start_method() -> None:
    """Start children as a torchrun-launched trainer does: the platform's default (fork).

    Spawn is only how the ranks themselves are started, and a spawned rank inherits it.
    """
    mp.set_start_method(mp.get_all_start_methods()[0], force=True)


def join_group(rank: int, world_size: int, port: int, backend: str, pg_timeout_s: float) -> None:
    """Join the default process group through the test process's store on ``port``."""
    import torch.distributed as dist

    # The store is the test process's, bound on a port the OS picked and held until the
    # ranks are done, so no other process can take the port before the ranks join.
    timeout = timedelta(seconds=pg_timeout_s)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def _fail(result_path: Path, conn_out: Connection | None = None) -> NoReturn:
    """Report the exception being handled (its traceback in ``result_path``) and exit."""
    result_path.write_bytes(pickle.dumps(("error", traceback.format_exc())))
    if conn_out is not None:
        try:
            conn_out.send(("failed",))
        except OSError:
            pass  # the test process is gone
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group here: it can block on peers that are still running.
    os._exit(1)


def rank_main(
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
    """One call in a process of its own; exit code 1 and an error result if it raised.

    ``env`` is the rank's whole environment (the launcher's variables are set on top):
    a rank forked from a fork server would otherwise have the server's.
    """
    # Own process group: descendants a rank leaves behind stay killable via killpg even
    # after the rank itself has exited and been reaped.
    os.setpgrp()
    default_start_method()
    # Armed first, so that a hang anywhere below (even in a C++ collective) can be dumped.
    stack_file = arm_stack_dump(workdir, rank)  # noqa: F841 - must stay open
    _set_environ({**env, **rank_environ(rank, world_size, port)})
    result_path = Path(workdir, f"rank{rank}.result")
    try:
        join_group(rank, world_size, port, backend, pg_timeout_s)
        payload = pickle.dumps(("ok", fn(rank, world_size, *args)))
    except BaseException:
        _fail(result_path)
    result_path.write_bytes(payload)
    import torch.distributed as dist

    dist.destroy_process_group()


class _Baseline:
    """A pooled rank as it was before its first call: what each call starts from."""

    def __init__(self) -> None:
        import torch
        import torch.distributed  # noqa: F401 - what every call needs, imported once

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.sys_path = list(sys.path)
        self.threads = {t.ident for t in threading.enumerate()}
        self.rng = torch.get_rng_state()
        self.torch_threads = torch.get_num_threads()
        self.sharing = torch.multiprocessing.get_sharing_strategy()
        self.dtype = torch.get_default_dtype()

    def enter(self, call: Call, rank: int) -> None:
        """Make the process what a rank freshly spawned for ``call`` would be."""
        import torch

        default_start_method()
        torch.set_rng_state(self.rng)  # an interpreter's default generator starts seeded
        _set_environ({**call.environ, **rank_environ(rank, call.world_size, call.port)})
        os.chdir(call.cwd)
        sys.path[:] = call.sys_path

    def restore(self) -> None:
        """Put back the settings a call may change on purpose (and a test may not undo)."""
        import torch

        _set_environ(self.environ)
        os.chdir(self.cwd)
        sys.path[:] = self.sys_path
        torch.set_num_threads(self.torch_threads)
        torch.multiprocessing.set_sharing_strategy(self.sharing)
        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(True)  # the default


def _set_environ(environ: Mapping[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)


def _watched() -> dict[str, Any]:
    """Process state a call must leave as it found it, or the rank is not reused."""
    import torch

    state: dict[str, Any] = {
        f"handler of {getattr(n, 'name', n)}": signal.getsignal(n) for n in signal.valid_signals()
    }
    state["deterministic algorithms"] = torch.are_deterministic_algorithms_enabled()
    state["gc enabled"] = gc.isenabled()
    return state


def _changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"changed {key}: {before[key]!r} -> {after[key]!r}"
        for key in before
        if after[key] != before[key]
        and getattr(after[key], "__module__", None) != _TORCH_SIGCHLD_MODULE
    ]


def group_members(pgids: set[int]) -> list[psutil.Process]:
    """Live (not zombie) processes whose process group is in ``pgids``."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _left_running(threads_before: set[int | None]) -> list[str]:
    """Threads and processes the call started that are still running after ``SETTLE_S``."""
    me = psutil.Process()
    deadline = time.monotonic() + SETTLE_S
    while True:
        mp.active_children()  # reaps this process's finished multiprocessing children
        threads = [t.name for t in threading.enumerate() if t.ident not in threads_before]
        children = {p.pid for p in me.children(recursive=True) if _running(p)}
        if not (threads or children) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    # Descendants whose parent died are no one's children, but stay in the rank's group.
    children |= {p.pid for p in group_members({os.getpgid(0)})} - {os.getpid()}
    reasons = [f"threads left running: {threads}"] if threads else []
    return reasons + ([f"processes left running: {sorted(children)}"] if children else [])


def _clean_up(base: _Baseline, before: dict[str, Any]) -> list[str]:
    """Leave the group and restore the baseline; say what keeps the rank from reuse."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    base.restore()
    gc.collect()  # a loader in a reference cycle closes its workers now, not some day
    return _changed(before, _watched()) + _left_running(base.threads)


def _run_call(
    conn_in: Connection, conn_out: Connection, workdir: str, rank: int, base: _Baseline
) -> tuple[Call, dict[str, Any]]:
    """Join the call's group, wait for the go, run ``fn``; exit if anything raised."""
    result_path = Path(workdir, f"rank{rank}.result")
    try:
        call: Call = pickle.loads(Path(workdir, CALL_FILE).read_bytes())
        base.enter(call, rank)
        before = _watched()
        join_group(rank, call.world_size, call.port, call.backend, call.pg_timeout_s)
        conn_out.send(("ready",))
        conn_in.recv()  # the go; EOFError if the test process is gone
        payload = pickle.dumps(("ok", call.fn(rank, call.world_size, *call.args)))
    except BaseException:
        _fail(result_path, conn_out)
    result_path.write_bytes(payload)
    conn_out.send(("done",))
    return call, before


def serve(conn_in: Connection, conn_out: Connection, detach: bool) -> None:
    """Body of a ``run_ranks`` rank: one call (fresh) or calls until ``conn_in`` closes.

    With ``detach`` the rank forks away from this launcher process, which exits, so
    the rank is no child of the test process: tests that list their own children, or
    ``multiprocessing.active_children()``, do not see the idle ranks of the pool.
    """
    if detach:
        pid = os.fork()
        if pid:
            conn_out.send(("started", pid))
            os._exit(0)
    else:
        conn_out.send(("started", os.getpid()))
    os.setpgrp()  # own group: what the rank leaves behind stays killable with killpg
    base = _Baseline()  # imports torch: the warm part of a pooled rank
    while True:
        try:
            _, workdir, rank = conn_in.recv()
        except EOFError:
            return  # the pool is closed, or the test process is gone
        stack_file = arm_stack_dump(workdir, rank)  # noqa: F841 - open until the next call
        call, before = _run_call(conn_in, conn_out, workdir, rank, base)
        if call.fresh:
            import torch.distributed as dist

            dist.destroy_process_group()
            return
        conn_out.send(("clean", _clean_up(base, before)))
