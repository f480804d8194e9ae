"""The distributed test helper: results, rank errors and hangs, no process left behind,
and its pool of warm ranks: reused, nothing carried from one call to the next, and a rank
whose call failed or that was left unclean never reused."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from harness.ranks import RankPool, run_ranks, use_pool
from harness.torchrun import run_torchrun, without_progress_bars

pytestmark = pytest.mark.dist
FRESH = pytest.mark.parametrize("fresh", [False, True], ids=["pooled", "fresh"])


def _who(rank: int, world_size: int) -> tuple[int, int, int, int]:
    """This rank's process, rank, world size and the sum of all ranks."""
    t = torch.tensor([rank])
    dist.all_reduce(t)
    return os.getpid(), rank, world_size, int(t.item())


def _pids(results: list[tuple[int, ...]]) -> list[int]:
    return [result[0] for result in results]


def _write_pid(where: Path, rank: int) -> None:
    Path(where, f"rank{rank}.pid").write_text(str(os.getpid()))


def _read_pids(where: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(where.glob("rank*.pid"))]


def _raise_on_rank_1(rank: int, world_size: int, where: str) -> None:
    _write_pid(Path(where), rank)
    if rank == 1:
        raise ValueError("bad value on purpose")
    dist.barrier()


def _exit_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        os._exit(3)
    dist.barrier()


def _hang_on_last_rank(rank: int, world_size: int, where: str) -> None:
    _write_pid(Path(where), rank)
    if rank == world_size - 1:
        # A child too, to prove the helper kills the whole tree.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(where, "child.pid").write_text(str(child.pid))
        time.sleep(600)
    dist.barrier()


def _live_descendants() -> list[psutil.Process]:
    """Child processes of this test process, except multiprocessing's resource tracker."""
    live = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if "resource_tracker" in " ".join(proc.cmdline()):
                continue
            live.append(proc)
        except psutil.NoSuchProcess:
            pass
    return live


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_results_come_back_by_rank(world_size):
    results = run_ranks(_who, world_size, timeout=60)
    total = sum(range(world_size))
    assert [r[1:] for r in results] == [(rank, world_size, total) for rank in range(world_size)]
    assert len(set(_pids(results))) == world_size  # one process per rank
    assert _live_descendants() == []


@FRESH
def test_rank_error_names_rank_and_traceback(tmp_path, fresh):
    with RankPool() as pool, use_pool(pool), pytest.raises(AssertionError) as excinfo:
        run_ranks(_raise_on_rank_1, 2, str(tmp_path), timeout=60, fresh=fresh)
    message = str(excinfo.value)
    assert "rank 1 raised" in message
    assert "ValueError: bad value on purpose" in message
    assert "_raise_on_rank_1" in message  # the full traceback, not just the message
    assert pool.pids() == [] and pool.counts["reused"] == 0
    assert all(_gone(pid) for pid in _read_pids(tmp_path))  # neither rank reused
    assert _live_descendants() == []


@FRESH
def test_a_rank_that_dies_is_named(fresh):
    with pytest.raises(AssertionError, match="rank 1 (exited with code 3|died)"):
        run_ranks(_exit_on_rank_1, 2, timeout=60, fresh=fresh)
    assert _live_descendants() == []


@FRESH
def test_hung_rank_is_reported_with_stack_and_killed(tmp_path, fresh):
    with RankPool() as pool, use_pool(pool), pytest.raises(AssertionError) as excinfo:
        run_ranks(_hang_on_last_rank, 2, str(tmp_path), timeout=5.0, fresh=fresh)
    message = str(excinfo.value)
    assert "ranks [0, 1] hung" in message
    assert "at the 5.0 s timeout" in message  # counted from fn's start, not the spawn
    assert "_hang_on_last_rank" in message  # both ranks' stacks point into the test fn
    child = int((tmp_path / "child.pid").read_text())
    below = message.split("--- rank 1's descendants (py-spy) ---")[1]
    # the hung rank's child, with its stack: in time.sleep, in the kernel's sleep
    assert f"Process {child}: " in below, below
    assert "<module> (<string>:1)" in below and "clock_nanosleep" in below, below
    assert pool.pids() == []
    assert all(_gone(pid) for pid in _read_pids(tmp_path)), "a hung rank survived"
    assert _gone(int((tmp_path / "child.pid").read_text())), "the hung rank's child survived"
    assert _live_descendants() == []


def test_env_is_set_in_every_rank():
    results = run_ranks(_read_env, 2, env={"ODB_TEST_MARKER": "x"}, timeout=60)
    assert results == [("x", "0"), ("x", "1")]


def _read_env(rank: int, world_size: int) -> tuple[str | None, str | None]:
    return os.environ.get("ODB_TEST_MARKER"), os.environ.get("RANK")


def test_pooled_ranks_are_reused_across_calls_and_world_sizes():
    with RankPool() as pool, use_pool(pool):
        [one] = run_ranks(_who, 1)
        two = run_ranks(_who, 2)
        again = run_ranks(_who, 2)
        assert pool.pids() == _pids(two)
    assert [r[1:] for r in two] == [r[1:] for r in again] == [(0, 2, 1), (1, 2, 1)]
    assert _pids(two)[0] == one[0] and _pids(two)[1] != one[0]  # a warm rank and a new one
    assert _pids(again) == _pids(two)
    assert pool.counts == {"reused": 3, "started": 2}
    assert all(_gone(pid) for pid in _pids(two)), "closing the pool leaves no rank"


def _leave_traces(rank: int, world_size: int, where: str) -> tuple[int, float]:
    first_draw = torch.rand(1).item()
    torch.rand(100)
    os.environ["ODB_SET_BY_FN"] = "y"
    os.chdir(where)
    sys.path.append(where)
    torch.set_num_threads(1)
    torch.multiprocessing.set_sharing_strategy("file_system")
    return os.getpid(), first_draw


def _traces(rank: int, world_size: int, where: str) -> tuple[int, float, tuple]:
    seen = (
        os.environ.get("ODB_TEST_MARKER"),
        os.environ.get("ODB_SET_BY_FN"),
        os.getcwd(),
        where in sys.path,
        torch.get_num_threads(),
        torch.multiprocessing.get_sharing_strategy(),
    )
    return os.getpid(), torch.rand(1).item(), seen


def test_a_pooled_call_leaves_nothing_to_the_next(tmp_path):
    """Neither run_ranks' env nor what fn changed carries over; torch draws start afresh."""
    with RankPool() as pool, use_pool(pool):
        before = run_ranks(_traces, 2, str(tmp_path))
        first = run_ranks(_leave_traces, 2, str(tmp_path), env={"ODB_TEST_MARKER": "x"})
        after = run_ranks(_traces, 2, str(tmp_path))
    assert _pids(after) == _pids(first) == _pids(before)  # the same processes each time
    assert [r[2] for r in after] == [r[2] for r in before]
    assert before[0][2][:4] == (None, None, os.getcwd(), False)
    assert [r[1] for r in after] == [r[1] for r in first]  # the same first draw


def _leave(rank: int, world_size: int, leftover: str, where: str) -> int:
    if rank == 1:
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        if leftover == "child":
            pid = subprocess.Popen(sleeper).pid
        elif leftover == "orphan":  # its parent is gone: no one's child, in the rank's group
            spawner = (
                "import subprocess; "
                f"print(subprocess.Popen({sleeper!r}, stdout=subprocess.DEVNULL).pid)"
            )
            pid = int(subprocess.check_output([sys.executable, "-c", spawner]))
        elif leftover == "thread":
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
            pid = None
        else:
            signal.signal(signal.SIGUSR2, lambda *_: None)
            pid = None
        Path(where, "leftover.pid").write_text(str(pid or ""))
    return os.getpid()


@pytest.mark.parametrize(
    ("leftover", "reason"),
    [
        ("child", "processes left running"),
        ("orphan", "processes left running"),
        ("thread", "threads left running"),
        ("signal handler", "changed handler of SIGUSR2"),
    ],
)
def test_a_rank_left_unclean_is_killed_not_reused(tmp_path, leftover, reason):
    with RankPool() as pool, use_pool(pool):
        first = run_ranks(_leave, 2, leftover, str(tmp_path))
        assert pool.pids() == first[:1]  # rank 0 came back clean, rank 1 did not
        assert _gone(first[1])
        second = run_ranks(_who, 2)
    assert _pids(second)[0] == first[0] and first[1] not in _pids(second)
    assert pool.counts[f"dropped: {reason}"] == 1
    left = (tmp_path / "leftover.pid").read_text()
    assert not left or _gone(int(left)), f"the {leftover} outlived its rank"


def test_fresh_ranks_are_the_calls_own():
    with RankPool() as pool, use_pool(pool):
        pooled = _pids(run_ranks(_who, 2))
        fresh = _pids(run_ranks(_who, 2, fresh=True))
        assert pool.pids() == pooled  # neither taken nor added to
    assert set(fresh).isdisjoint(pooled)
    assert all(_gone(pid) for pid in fresh + pooled)
    assert _live_descendants() == []


def test_the_session_pool_serves_unmarked_tests():
    assert _pids(run_ranks(_who, 1)) == _pids(run_ranks(_who, 1))


@pytest.mark.fresh_ranks
def test_the_fresh_ranks_marker_spawns_ranks_for_each_call():
    first, second = _pids(run_ranks(_who, 1)), _pids(run_ranks(_who, 1))
    assert first != second
    assert _gone(first[0]) and _gone(second[0])


def _abort_at_exit(rank: int, world_size: int) -> int:
    """Returns its result, then aborts while its interpreter ends (as a C++ terminate would)."""
    import atexit

    atexit.register(os.abort)
    return rank


def test_a_fresh_rank_that_aborts_after_returning_fails_the_call():
    with pytest.raises(AssertionError, match=r"rank 1 returned, then exited with code -6"):
        run_ranks(_abort_at_exit, 2, fresh=True, timeout=60)
    assert _live_descendants() == []


_TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item()}")
dist.destroy_process_group()
"""


_TORCHRUN_ABORT = "import os, signal\nos.kill(os.getpid(), signal.SIGABRT)\n"


def test_torchrun_rank_killed_by_a_fatal_signal_prints_its_stack(tmp_path):
    """PYTHONFAULTHANDLER: an abort (say, at exit) shows where each thread was."""
    script = tmp_path / "abort.py"
    script.write_text(_TORCHRUN_ABORT)
    code, _, err = run_torchrun(script, 1, timeout=120)
    assert code != 0
    assert "Fatal Python error: Aborted" in err and "abort.py" in err, err[-3000:]


def test_without_progress_bars_keeps_the_other_lines():
    err = (
        "start\n  0%|          | 0/6 [00:00<?, ?it/s]\r 50%|#####     | 3/6 [00:01<00:01, "
        "2.1it/s]\nterminate called without an active exception\n\n"
    )
    assert without_progress_bars(err) == "start\nterminate called without an active exception"


def test_torchrun_runs_script(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(_TORCHRUN_SCRIPT)
    code, out, err = run_torchrun(script, 2, timeout=120)
    assert code == 0, err
    assert "rank 0 sum 3" in out and "rank 1 sum 3" in out


def test_torchrun_timeout_kills_tree(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    with pytest.raises(AssertionError, match="still running after") as excinfo:
        run_torchrun(script, 2, timeout=10)
    assert _live_descendants() == []
    stacks = str(excinfo.value).split("--- the launcher's descendants (py-spy) ---")[1]
    assert stacks.count("<module> (hang.py:3)") == 2, stacks  # each worker, where it waits
