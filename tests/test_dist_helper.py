"""The distributed test helper reports results, rank errors and hangs, and leaves no process."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from tests.dist import run_ranks, run_torchrun

pytestmark = pytest.mark.dist


def _rank_sum(rank: int, world_size: int, offset: int) -> tuple[int, int, int]:
    t = torch.tensor([rank + offset])
    dist.all_reduce(t)
    return rank, world_size, int(t.item())


def _raise_on_rank_1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("bad value on purpose")
    dist.barrier()


def _hang_on_last_rank(rank: int, world_size: int, pid_file: str) -> None:
    if rank == world_size - 1:
        # A grandchild too, to prove the helper kills the whole tree.
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(pid_file).write_text(str(child.pid))
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
    results = run_ranks(_rank_sum, world_size, 10, timeout=60)
    total = sum(range(world_size)) + 10 * world_size
    assert results == [(rank, world_size, total) for rank in range(world_size)]
    assert _live_descendants() == []


def test_rank_error_names_rank_and_traceback():
    with pytest.raises(AssertionError) as excinfo:
        run_ranks(_raise_on_rank_1, 2, timeout=60)
    message = str(excinfo.value)
    assert "rank 1 raised" in message
    assert "ValueError: bad value on purpose" in message
    assert "_raise_on_rank_1" in message  # the full traceback, not just the message
    assert _live_descendants() == []


def test_hung_rank_is_reported_with_stack_and_killed(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    timeout = 8.0
    start = time.monotonic()
    with pytest.raises(AssertionError) as excinfo:
        run_ranks(_hang_on_last_rank, 2, str(pid_file), timeout=timeout)
    elapsed = time.monotonic() - start
    message = str(excinfo.value)
    assert "ranks [0, 1] hung" in message
    assert "timeout" in message
    assert "_hang_on_last_rank" in message  # both ranks' stacks point into the test fn
    assert elapsed < timeout + 10, f"took {elapsed:.1f} s for a {timeout} s timeout"
    assert _gone(int(pid_file.read_text())), "the hung rank's child survived"
    assert _live_descendants() == []


def test_env_is_set_in_every_rank():
    results = run_ranks(_read_env, 2, env={"ODB_TEST_MARKER": "x"}, timeout=60)
    assert results == [("x", "0"), ("x", "1")]


def _read_env(rank: int, world_size: int) -> tuple[str | None, str | None]:
    return os.environ.get("ODB_TEST_MARKER"), os.environ.get("RANK")


_TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {t.item()}")
dist.destroy_process_group()
"""


def test_torchrun_runs_script(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(_TORCHRUN_SCRIPT)
    code, out, err = run_torchrun(script, 2, timeout=120)
    assert code == 0, err
    assert "rank 0 sum 3" in out and "rank 1 sum 3" in out


def test_torchrun_timeout_kills_tree(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    with pytest.raises(AssertionError, match="still running after"):
        run_torchrun(script, 2, timeout=10)
    assert _live_descendants() == []
