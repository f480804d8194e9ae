"""A child deadlocked by the interpreter's fork handling is killed and forked again.

The deadlock (CPython gh-112275: a thread-state lock held by another thread at the
fork) cannot be provoked on demand, so an at-fork hook puts the first forked child to
sleep on a lock at the same point: after the fork, before the child's first statement.
Hooks cannot be removed, so each test runs in a spawned process of its own.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import pickle
import platform
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import odb
import odb._process.forking
from harness.ranks import run_ranks
from harness.scenarios import LengthDataset
from odb._process.collate_sources import _worker_context
from odb._process.forking import CheckedForkContext, ForkDeadlockError, checked_fork_context
from odb.core.config import ODBConfig

# At-fork hooks cannot be removed, and the ranks change module settings and loggers: each
# run_ranks call here needs ranks of its own, never pooled ones.
pytestmark = pytest.mark.fresh_ranks


def _deadlock_first_child(flag: Path, always: bool = False) -> None:
    """Install the hook: the child that takes ``flag`` records its pid and sleeps forever."""

    def hook() -> None:
        taken = flag.with_suffix(f".{os.getpid()}")
        try:
            if always:
                taken.write_text("")
            else:
                os.rename(flag, taken)  # atomic: one child takes the flag
        except OSError:
            return
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # asleep in the kernel, as the real deadlock is

    flag.write_text("")
    os.register_at_fork(after_in_child=hook)


def _stuck_pids(flag: Path) -> list[int]:
    return [int(p.suffix[1:]) for p in flag.parent.glob(flag.stem + ".*") if p.suffix[1:].isdigit()]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _capture() -> _Records:
    records = _Records()
    logging.getLogger("odb._process.forking").addHandler(records)
    return records


def _report_pid(out: Any) -> None:
    out.put(os.getpid())


def _fork_a_reporter() -> dict[str, Any]:
    """Fork a checked child that reports its pid; what it reported and how it ended."""
    ctx = checked_fork_context()
    out = ctx.Queue()
    process = ctx.Process(target=_report_pid, args=(out,))
    process.start()
    ran = out.get(timeout=30)
    process.join(30)
    return dict(ran=ran, pid=process.pid, exitcode=process.exitcode)


def _process_rank(rank: int, world_size: int, flag: str) -> dict[str, Any]:
    records = _capture()
    _deadlock_first_child(Path(flag))
    child = _fork_a_reporter()
    stuck = _stuck_pids(Path(flag))
    return dict(
        **child,
        stuck=stuck,
        stuck_alive=[p for p in stuck if psutil.pid_exists(p)],
        messages=records.messages,
    )


@pytest.mark.dist
def test_a_child_stuck_at_the_fork_is_killed_and_forked_again(tmp_path: Path) -> None:
    [result] = run_ranks(_process_rank, 1, str(tmp_path / "flag"), timeout=90)
    assert len(result["stuck"]) == 1
    assert result["stuck_alive"] == []  # killed and reaped, not left behind
    assert result["ran"] == result["pid"] != result["stuck"][0]
    assert result["exitcode"] == 0
    [message] = result["messages"]
    assert "gh-112275" in message and f"pid {result['stuck'][0]}" in message


def _stand_in_held_rank(rank: int, world_size: int, probe: str) -> dict[str, Any]:
    """The first child forks while this process holds a stand-in for the lock that the
    child's ``probe`` (a global of ``odb._process.forking``) takes; later forks find it free.

    Stand-ins, because the real locks cannot be held on demand: glibc's resolver lock is
    internal, and a Gloo worker thread holds the flight recorder's mutex for microseconds,
    retiring a collective after its caller moved on.
    """
    records = _capture()
    held = threading.Lock()

    def take_and_release(*args: Any) -> None:  # what the real probe does in the child
        held.acquire()
        held.release()

    setattr(odb._process.forking, probe, take_and_release)
    held.acquire()
    os.register_at_fork(after_in_parent=lambda: held.locked() and held.release())
    return dict(**_fork_a_reporter(), messages=records.messages)


@pytest.mark.dist
@pytest.mark.parametrize(
    ("probe", "named"),
    [
        # CI met the resolver deadlock, issue 56
        ("_RES_INIT", "resolver lock"),
        # the repeat campaign met it: a collate process stuck creating its first Gloo group
        ("_DUMP_FLIGHT_RECORDER", "flight-recorder lock"),
    ],
)
def test_a_child_forked_while_a_probed_lock_was_held_is_forked_again(
    probe: str, named: str
) -> None:
    """A child takes the lock before it reports (issue 56); without the probe it reports
    and would deadlock later, and no retry is logged."""
    [result] = run_ranks(_stand_in_held_rank, 1, probe, timeout=90)
    assert result["ran"] == result["pid"] and result["exitcode"] == 0
    [message] = result["messages"]  # the first child stuck, the second ran
    assert named in message


def _dump_after_a_collective(rank: int, world_size: int) -> dict[str, Any]:
    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    group.allreduce([torch.ones(1)]).wait()
    dump = odb._process.forking._DUMP_FLIGHT_RECORDER
    ops = [entry["profiling_name"] for entry in pickle.loads(dump(True, False, False))["entries"]]
    return dict(real=dump is torch._C._distributed_c10d._dump_fr_trace, ops=ops)


@pytest.mark.dist
def test_the_child_takes_the_mutex_gloo_records_under() -> None:
    """The child's probe dumps the recorder Gloo's collectives go into (its entries are
    copied under the mutex that ``record_pg_ranks`` and ``retire_id`` take)."""
    [result] = run_ranks(_dump_after_a_collective, 1, timeout=60)
    assert result["real"]
    assert "gloo:all_reduce" in result["ops"]


def _numpy_held_rank(rank: int, world_size: int) -> dict[str, Any]:
    """DataLoader workers forked while a thread holds numpy's global RandomState lock
    (the real one, across the first fork): torch's worker loop seeds numpy first."""
    records = _capture()
    lock = np.random.mtrand._rand._bit_generator.lock
    taken, forked = threading.Event(), threading.Event()

    def hold() -> None:  # a trainer thread inside np.random at the fork
        with lock:
            taken.set()
            forked.wait()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    taken.wait()
    os.register_at_fork(after_in_parent=forked.set)
    ctx = checked_fork_context()
    loader = DataLoader(
        range(8), batch_size=None, num_workers=2, multiprocessing_context=ctx, timeout=20
    )
    return dict(items=sorted(loader), messages=records.messages)


@pytest.mark.dist
def test_workers_forked_while_numpys_random_lock_was_held_are_forked_again() -> None:
    """Without the child's probe the first worker never seeds numpy: the loader times out."""
    [result] = run_ranks(_numpy_held_rank, 1, timeout=90)
    assert result["items"] == list(range(8))
    [message] = result["messages"]  # the first worker stuck, its second fork ran
    assert "numpy's random lock" in message


def test_the_probe_holds_the_lock_numpys_random_functions_draw_under() -> None:
    """Pins numpy's private attribute the probe reads: a numpy that moves it fails here."""
    np.random.random()  # numpy imports its random module on first use
    lock = odb._process.forking._numpy_random_lock()
    assert lock is not None
    drawn = threading.Event()
    with lock:
        draw = threading.Thread(target=lambda: (np.random.random(), drawn.set()), daemon=True)
        draw.start()
        assert not drawn.wait(0.5)  # the draw waits for the lock the probe holds
    assert drawn.wait(30)


class _Holder:
    """A reference cycle around an object: only the collector frees it."""

    def __init__(self, held: Any) -> None:
        self.held = held
        self.me = self


def _new_threads_then_collect(out: Any, threads: int) -> None:
    """Start ``threads`` threads (glibc gives them the stacks of the parent's), collect."""
    release = threading.Event()
    for _ in range(threads):
        threading.Thread(target=release.wait, daemon=True).start()
    gc.collect()
    release.set()
    out.put("collected")


def _inherited_garbage_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Fork while a Gloo group (two worker threads) is garbage the collector has not freed.

    Before the fix the child's collector freed it: the group's destructor joined its
    worker threads, whose descriptors the child's new threads had taken, and the child
    aborted ("std::system_error", "Invalid argument"), as a forked test body did in the
    repeat campaign (issue 56).
    """
    gc.disable()  # the garbage stays until the fork
    try:
        ref = weakref.ref(_Holder(dist.ProcessGroupGloo(dist.HashStore(), 0, 1)))
        threads = len(os.listdir("/proc/self/task"))
        ctx = checked_fork_context()
        out = ctx.Queue()
        process = ctx.Process(target=_new_threads_then_collect, args=(out, threads + 2))
        garbage_at_fork = ref() is not None
        process.start()
        process.join(60)
        reported = out.get(timeout=10) if process.exitcode == 0 else None
    finally:
        gc.enable()
    gc.collect()  # freed here, where its threads are
    return dict(
        garbage_at_fork=garbage_at_fork,
        exitcode=process.exitcode,
        reported=reported,
        freed=ref() is None,
    )


@pytest.mark.dist
def test_a_child_frees_nothing_it_inherited() -> None:
    [result] = run_ranks(_inherited_garbage_rank, 1, timeout=120)
    assert result["garbage_at_fork"]
    assert result == dict(garbage_at_fork=True, exitcode=0, reported="collected", freed=True)


def _draw_and_report(out: Any) -> None:
    out.put((os.getpid(), float(torch.randn(1))))  # a draw takes the generator's mutex


def _generator_held_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Fork while another thread holds torch's CPU generator mutex (the real one).

    One long draw holds it (sized to last about 1.5 s on this machine; the draw lets go
    of the GIL, so the fork can happen meanwhile); the fork comes 0.3 s after the draw
    began. Whether it landed inside the draw is measured, not assumed.
    """
    records = _capture()
    window: dict[str, float] = {}
    entered = threading.Event()
    size = _long_draw_size()

    def draw() -> None:
        window["start"] = time.monotonic()
        entered.set()
        torch.empty(size).exponential_()
        window["end"] = time.monotonic()

    forks: list[float] = []
    os.register_at_fork(before=lambda: forks.append(time.monotonic()))
    drawing = threading.Thread(target=draw, daemon=True)
    drawing.start()
    entered.wait()
    time.sleep(0.3)
    ctx = checked_fork_context()
    out = ctx.Queue()
    process = ctx.Process(target=_draw_and_report, args=(out,))
    process.start()
    pid, _ = out.get(timeout=60)
    process.join(30)
    drawing.join()
    return dict(
        ran=pid,
        pid=process.pid,
        exitcode=process.exitcode,
        held=window["start"] < forks[0] < window["end"],
        messages=records.messages,
    )


def _long_draw_size(seconds: float = 1.5, most: int = 100_000_000) -> int:
    """Elements of ``exponential_`` (one serial draw under the mutex) lasting ``seconds``
    here, timed on a short draw; at most ``most`` (400 MB)."""
    sample = 2_000_000
    started = time.perf_counter()
    torch.empty(sample).exponential_()
    return min(int(sample * seconds / (time.perf_counter() - started)), most)


@pytest.mark.dist
def test_a_child_forked_while_the_generator_was_drawing_is_forked_again() -> None:
    """A child takes torch's CPU generator mutex before it reports (the repeat campaign
    met the deadlock in a forked collate process, issue 56); without it the child's
    first draw never returns."""
    [result] = run_ranks(_generator_held_rank, 1, timeout=120)
    assert result["held"], "the fork came after the long draw: the test did not hold the mutex"
    assert result["ran"] == result["pid"] and result["exitcode"] == 0
    assert result["messages"], "the child forked inside the draw was not caught"
    assert all("generator lock" in message for message in result["messages"])


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc",
    reason="__res_init and its lock are glibc's; elsewhere the child has no lock to take",
)
def test_the_child_takes_glibcs_resolver_lock() -> None:
    assert odb._process.forking._RES_INIT is not None  # __res_init found in this libc


def _always_stuck_rank(rank: int, world_size: int, flag: str) -> str:
    odb._process.forking.ATTEMPTS = 2
    _deadlock_first_child(Path(flag), always=True)
    process = checked_fork_context().Process(target=os.getpid)
    try:
        process.start()
    except ForkDeadlockError as exc:
        return str(exc)
    return "started"


@pytest.mark.dist
def test_every_fork_stuck_raises_a_clear_error(tmp_path: Path) -> None:
    [message] = run_ranks(_always_stuck_rank, 1, str(tmp_path / "flag"), timeout=90)
    assert "2 forks in a row deadlocked" in message
    assert "3.11.10" in message and "spawn" in message


def _dataloader_rank(rank: int, world_size: int, flag: str) -> dict[str, Any]:
    records = _capture()
    _deadlock_first_child(Path(flag))
    ctx = checked_fork_context()
    loader = DataLoader(range(40), batch_size=None, num_workers=2, multiprocessing_context=ctx)
    items = list(loader)
    return dict(items=items, stuck=len(_stuck_pids(Path(flag))), warned=len(records.messages))


@pytest.mark.dist
def test_dataloader_workers_survive_a_stuck_fork(tmp_path: Path) -> None:
    [result] = run_ranks(_dataloader_rank, 1, str(tmp_path / "flag"), timeout=90)
    assert result == dict(items=list(range(40)), stuck=1, warned=1)


LENGTHS = [(i * 7) % 30 + 1 for i in range(90)]


def _loader_rank(rank: int, world_size: int, flag: str, options: dict[str, Any]) -> dict[str, Any]:
    records = _capture()
    _deadlock_first_child(Path(flag))
    loader = odb.ODBLoader(LengthDataset(LENGTHS), token_budget=64, num_workers=2, **options)
    seen: collections.Counter[int] = collections.Counter()
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            if not odb.pop_step_info(batch).idle:
                seen.update(batch["index"].flatten().tolist())
    return dict(seen=dict(seen), warned=len(records.messages))


@pytest.mark.dist
@pytest.mark.parametrize(
    "options",
    [
        # Ranks are spawned, so a thread-mode trainer's own start method is spawn here.
        {"collate_mode": "thread", "worker_start_method": "fork"},
        {"collate_mode": "process", "collate_start_method": "fork"},
    ],
    ids=["thread-mode-worker", "forked-collate-process"],
)
def test_odb_loses_nothing_when_a_fork_is_stuck(tmp_path: Path, options: dict[str, Any]) -> None:
    """The first fork is a worker (thread mode) or the collate process itself."""
    results = run_ranks(_loader_rank, 2, str(tmp_path / "flag"), options, timeout=120)
    seen: collections.Counter[int] = collections.Counter()
    for result in results:
        seen.update(result["seen"])
    assert seen == {i: 2 for i in range(len(LENGTHS))}  # every sample once per epoch
    assert len(_stuck_pids(tmp_path / "flag")) == 1
    assert sum(r["warned"] for r in results) == 1


@pytest.mark.parametrize(
    ("options", "checked"),
    [
        ({"collate_mode": "thread"}, True),  # the trainer's start method: fork here
        ({"collate_mode": "process"}, True),
        ({"collate_mode": "thread", "worker_start_method": "fork"}, True),
        ({"collate_mode": "process", "worker_start_method": "spawn"}, False),
    ],
)
def test_every_worker_fork_is_checked(options: dict[str, Any], checked: bool) -> None:
    context = _worker_context(ODBConfig(token_budget=8, num_workers=2, **options))
    assert isinstance(context, CheckedForkContext) is checked
    assert context.get_start_method() == ("fork" if checked else "spawn")
