"""Settings a trainer commonly has before it builds a loader, and one rank's run under each.

Used by ``tests/odb/test_trainer_settings.py`` on ranks started by ``harness.ranks.run_ranks``
(spawned, as ``torch.multiprocessing.spawn`` starts them) and, as a script, under
``torchrun``:

    torchrun --nproc_per_node 2 tests/odb/trainer_settings_script.py OUT_DIR SETTING...

(each setting with a forked and a spawned collate process and a collate thread).

A run applies one or more settings in the rank, builds a loader with one way of running
the collate side (:data:`COLLATE`), runs it for one epoch and undoes the settings. It
reports the sample ids the rank yielded (a run's error ends the rank's runs, named); the
test checks that every sample arrived exactly once over the ranks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import odb
from harness.scenarios import LengthDataset

LENGTHS = [(i * 7) % 40 + 1 for i in range(24)]
COLLATE: dict[str, dict[str, Any]] = {
    "fork": {},  # the default on Linux: a forked collate process
    "spawn": {"collate_start_method": "spawn"},
    "forkserver": {"collate_start_method": "forkserver"},
    "thread": {"collate_mode": "thread"},
}
TORCHRUN_COLLATE = ("fork", "spawn", "thread")  # what the script runs under torchrun


@contextlib.contextmanager
def sharing_strategy(name: str) -> Iterator[dict[str, Any]]:
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(name)
    try:
        yield {}
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)


@contextlib.contextmanager
def start_method(name: str) -> Iterator[dict[str, Any]]:
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(name, force=True)
    try:
        yield {}
    finally:
        multiprocessing.set_start_method(previous, force=True)


@contextlib.contextmanager
def pinned() -> Iterator[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "pin_memory=True but CUDA is not available")
        yield {"pin_memory": True}


# Between two writes of a busy thread: thousands of writes a second, and the cores
# still free for the loader (a spawned interpreter's imports took 2-3 times as long
# next to threads that never paused).
_BUSY_PAUSE_S = 0.0005


@contextlib.contextmanager
def busy_threads(workdir: str) -> Iterator[dict[str, Any]]:
    """A thread logging to a file and a metrics writer, both busy while the loader forks."""
    stop = threading.Event()
    logger = logging.getLogger("odb-test-trainer")
    handler = logging.FileHandler(Path(workdir, f"trainer-{os.getpid()}.log"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def log() -> None:
        while not stop.wait(_BUSY_PAUSE_S):
            logger.info("step %d", time.monotonic_ns())

    def metrics() -> None:
        with open(Path(workdir, f"metrics-{os.getpid()}.jsonl"), "a") as out:
            while not stop.wait(_BUSY_PAUSE_S):
                value = float(torch.randn(64, 64).matmul(torch.randn(64, 64)).sum())
                out.write(json.dumps({"loss": value}) + "\n")

    threads = [threading.Thread(target=f, daemon=True) for f in (log, metrics)]
    for thread in threads:
        thread.start()
    try:
        yield {}
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        logger.removeHandler(handler)
        handler.close()


@contextlib.contextmanager
def thread_counts() -> Iterator[dict[str, Any]]:
    """``torch.set_num_threads`` and ``OMP_NUM_THREADS``, with the intra-op pool in use."""
    previous, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(2)
    os.environ["OMP_NUM_THREADS"] = "2"
    torch.ones(1 << 22).mul_(2).sum()  # the trainer's OpenMP pool is started at the fork
    try:
        yield {}
    finally:
        torch.set_num_threads(previous)
        if env is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = env


SETTINGS: dict[str, Callable[[str], contextlib.AbstractContextManager[dict[str, Any]]]] = {
    "sharing_file_system": lambda workdir: sharing_strategy("file_system"),
    "start_method_spawn": lambda workdir: start_method("spawn"),
    "start_method_forkserver": lambda workdir: start_method("forkserver"),
    "pin_memory": lambda workdir: pinned(),
    "busy_threads": busy_threads,
    "thread_counts": lambda workdir: thread_counts(),
}


def run_one(settings: list[str], collate: str, workdir: str) -> dict[str, Any]:
    """One epoch under every one of ``settings`` at once, collate side ``collate``.

    Returns the sample ids this rank yielded, or the error it raised (type and message).
    """
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        options: dict[str, Any] = {}
        for setting in settings:
            options.update(stack.enter_context(SETTINGS[setting](workdir)))
        try:
            loader = odb.ODBLoader(
                LengthDataset(LENGTHS),
                token_budget=64,
                num_workers=1,
                collate_fn=odb.PadCollate(),
                **options,
                **COLLATE[collate],
            )
            ids = [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]
            del loader  # its collate process ends here, before the settings are undone
        except Exception as exc:  # noqa: BLE001 - reported with the run's name
            return {"error": f"{type(exc).__name__}: {exc}"[:3000]}
    return {"ids": ids, "s": round(time.perf_counter() - started, 2)}


def run_settings(
    rank: int, world_size: int, runs: list[tuple[list[str], str]], workdir: str
) -> dict[str, dict[str, Any]]:
    """Rank body: each ``(settings, collate)`` run, keyed ``"setting+setting/collate"``.

    Raises at a run's error, naming the run: a rank that went on to the next run would
    leave its peers waiting for it in this one (``init_timeout_s``), and the error would
    surface only as their hang.
    """
    results = {}
    for settings, collate in runs:
        name = "+".join(settings) + "/" + collate
        results[name] = run_one(settings, collate, workdir)
        if "error" in results[name]:
            raise RuntimeError(f"rank {rank}, run {name}: {results[name]['error']}")
    return results


if __name__ == "__main__":
    import torch.distributed as dist

    out_dir, names = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    runs = [([name], collate) for name in names for collate in TORCHRUN_COLLATE]
    result = run_settings(dist.get_rank(), dist.get_world_size(), runs, out_dir)
    Path(out_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
