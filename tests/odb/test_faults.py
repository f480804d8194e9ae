"""Fault injection on real ranks: every fault ends in a clear error on every rank, in time.

Each test runs W real ranks (Gloo over TCP on 127.0.0.1) through
:func:`tests.odb.fault_harness.run_fault_ranks` and injects one fault on one rank (the
*victim*, see ``tests/odb/fault_ranks.py``). It then checks, per ``docs/reliability.md``:

- no rank hangs (hard wall-clock limit), and every surviving rank ends with the expected
  error: the victim with the original exception type and message, its peers with
  :class:`odb.AlignmentTimeoutError` naming ``align_timeout_s`` (and, when the victim
  raised, the victim's rank and error);
- every error is raised within ``align_timeout_s + 10 s`` of the fault;
- no process is left behind: the ranks' process groups are empty within 10 s of the
  ranks' exit (so a killed trainer's collate process and workers exit by themselves),
  and every surviving rank is back to its own baseline of child processes, open file
  descriptors and ``/dev/shm`` entries; nothing is left in ``/dev/shm`` after the run.

Timeouts are small (``align_timeout_s`` of 5-8 s) to keep the suite fast. To check for
flakiness, run it repeatedly: ``for i in $(seq 20); do pytest -q tests/odb/test_faults.py
|| break; done``.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch.distributed as dist

import odb
from harness.shm_audit import ShmAudit
from tests.odb.fault_harness import FaultRun, rank_server, run_fault_ranks
from tests.odb.fault_ranks import (
    FaultDataset,
    FaultPlan,
    UnpicklableCollate,
    fault_rank,
    fault_time,
    lengths_for,
    lifecycle_rank,
    loader_children,
    stranger_rank,
)

pytestmark = pytest.mark.dist

PEER = ("AlignmentTimeoutError",)
SLACK_S = 10.0  # the bound: configured timeout + 10 s
RUN_LIMIT_S = 90.0  # hard limit of one run (a hang fails the test, never the suite)


@pytest.fixture(scope="module", autouse=True)
def _ranks_from_one_server() -> Iterator[None]:
    """The module's ranks fork from one server that imported torch once (rank_server)."""
    with rank_server():
        yield


def _run(plan: FaultPlan, world_size: int, tmp_path: Path) -> tuple[FaultRun, FaultPlan]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = FaultPlan(**{**plan.__dict__, "stamp_dir": str(tmp_path)})
    with ShmAudit() as shm:
        run = run_fault_ranks(fault_rank, world_size, plan, timeout=RUN_LIMIT_S)
        leaked = shm.leaked()
    assert not run.hung, f"ranks {run.hung} hung\n{run.describe()}"
    assert not run.orphans, f"processes left behind: {run.orphans}\n{run.describe()}"
    assert not leaked, f"/dev/shm entries leaked: {leaked}"
    return run, plan


def _check(
    run: FaultRun,
    plan: FaultPlan,
    victim: tuple[str, ...],
    fragments: tuple[str, ...] = (),
    peer: tuple[str, ...] = PEER,
    peer_fragments: tuple[str, ...] = ("align_timeout_s",),
    victim_dies: bool = False,
) -> list[dict[str, Any]]:
    """Assert how every rank ended; returns the surviving ranks' reports."""
    text = run.describe()
    fault = fault_time(plan.stamp_dir)
    assert fault is not None, f"the fault was never injected\n{text}"
    reports = []
    for outcome in run.outcomes:
        if victim_dies and outcome.rank == plan.victim:
            assert outcome.exitcode is not None and outcome.exitcode < 0, text
            continue
        assert outcome.exitcode == 0 and outcome.value is not None, text
        report = outcome.value
        reports.append(report)
        expected = victim if outcome.rank == plan.victim else peer
        wanted = fragments if outcome.rank == plan.victim else peer_fragments
        assert report["error_type"] in expected, f"rank {outcome.rank}\n{text}"
        for fragment in wanted:
            assert fragment in (report["error"] or ""), f"{fragment!r}: rank {outcome.rank}\n{text}"
        if report["error_type"] is not None:
            late = report["error_time"] - fault
            assert late <= plan.align_timeout_s + SLACK_S, (
                f"rank {outcome.rank} raised {late:.1f} s after the fault\n{text}"
            )
        _check_resources(report, text)
    return reports


def _check_resources(report: dict[str, Any], text: str) -> None:
    rank = report["rank"]
    kept = report["children_kept"]
    assert len(kept) <= report["may_keep"], f"rank {rank} kept children {kept}\n{text}"
    assert report["children_left"] == [], f"rank {rank} kept children\n{text}"
    assert report["fds_after"] <= report["fds_before"], f"rank {rank} kept fds\n{text}"
    assert not report["shm_after"], f"rank {rank} kept /dev/shm entries\n{text}"


def _victim_report(reports: list[dict[str, Any]], plan: FaultPlan) -> dict[str, Any]:
    return next(r for r in reports if r["rank"] == plan.victim)


# --- the user's code raises ---------------------------------------------------------


@pytest.mark.parametrize(
    "world_size, mode, workers, position",
    [(2, "process", 1, 0), (2, "thread", 0, 0), (3, "process", 2, 9)],
    ids=["first-w2-process", "first-w2-thread", "mid-w3-process"],
)
def test_getitem_raises(
    world_size: int, mode: str, workers: int, position: int, tmp_path: Path
) -> None:
    plan = FaultPlan("getitem", mode=mode, num_workers=workers, fault_at=(position,))
    run, plan = _run(plan, world_size, tmp_path)
    reports = _check(
        run,
        plan,
        ("InjectedError",),
        ("exploded (marker 7319)",),
        peer_fragments=("align_timeout_s", "rank 1: InjectedError"),
    )
    if position:
        assert _victim_report(reports, plan)["steps"][0] > 0, "the fault was not mid-epoch"


def test_collate_fn_raises_in_collate_process(tmp_path: Path) -> None:
    plan = FaultPlan("collate", at_step=3)
    run, plan = _run(plan, 2, tmp_path)
    reports = _check(
        run,
        plan,
        ("InjectedError",),
        ("collate_fn exploded on call 3 (marker 8123)",),
        peer_fragments=("align_timeout_s", "rank 1: InjectedError", "marker 8123"),
    )
    victim = _victim_report(reports, plan)
    assert "fault_ranks.py" in victim["cause"], "the collate side's traceback is not attached"


def test_unpicklable_batch_is_an_error_not_a_hang() -> None:
    # Before: the queue's feeder thread dropped the batch with a printed traceback and
    # the trainer waited forever (world size 1 has no stall limit). Now the collate
    # process pickles each message itself and reports the failure.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    plan = FaultPlan("none")
    loader = odb.ODBLoader(
        FaultDataset(lengths_for(plan)),
        token_budget=plan.token_budget,
        collate_fn=UnpicklableCollate(),
        collate_mode="process",
    )
    started = time.monotonic()
    with pytest.raises((TypeError, AttributeError, pickle.PicklingError), match="pickle"):
        for batch in loader:
            odb.pop_step_info(batch)
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _new_children(before):
        time.sleep(0.1)
    assert not _new_children(before)


def _new_children(before: set[int]) -> list[int]:
    return [p.pid for p in loader_children() if p.pid not in before]


# --- processes die ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_dataloader_worker_killed(mode: str, tmp_path: Path) -> None:
    # The worker dies inside the read of an item it owes (not at a loop step: read-ahead
    # could let it finish its whole view first, and then no error is the right outcome).
    # Read-ahead also decides whether the trainer took a step before the error, so the
    # test does not ask.
    run, plan = _run(FaultPlan("kill_worker", mode=mode, fault_at=(12,)), 2, tmp_path)
    _check(
        run,
        plan,
        ("RuntimeError",),
        ("DataLoader worker",),  # "exited unexpectedly" or "is killed by signal"
        peer_fragments=("align_timeout_s", "rank 1: RuntimeError", "DataLoader worker"),
    )


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_collate_process_killed(start_method: str, tmp_path: Path) -> None:
    plan = FaultPlan("kill_collate", at_step=3, start_method=start_method)
    run, plan = _run(plan, 2, tmp_path)
    # The victim's trainer leaves the note its killed collate process cannot, so the peer
    # names it every time, whether Gloo first tells it the connection closed or (when
    # its send was already waiting, seen once in 7 runs of the fork case) its timeout.
    _check(
        run,
        plan,
        ("RuntimeError",),
        ("collate process of rank 1 exited unexpectedly", "SIGKILL"),
        peer_fragments=(
            "align_timeout_s",
            "a peer rank failed first (rank 1: the ODB collate process of rank 1 exited "
            "unexpectedly (killed by signal SIGKILL",
        ),
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_trainer_killed(world_size: int, tmp_path: Path) -> None:
    # The victim's collate process and workers must exit by themselves within 10 s (a
    # surviving peer times it), and _run's orphan check kills nothing before that.
    plan = FaultPlan("kill_trainer", victim=world_size - 1, at_step=3, num_workers=2)
    run, plan = _run(plan, world_size, tmp_path)
    reports = _check(run, plan, (), peer_fragments=("align_timeout_s", "gone"), victim_dies=True)
    _check_watchdog(reports)


def _check_watchdog(reports: list[dict[str, Any]]) -> None:
    """The killed trainer's collate process and workers were gone within 10 s."""
    for report in reports:
        gone = report["victim_children_gone_s"]
        assert gone is not None and gone <= 10.0, f"victim's children gone after {gone} s"


# --- slow ranks -----------------------------------------------------------------------


def test_stall_longer_than_align_timeout(tmp_path: Path) -> None:
    plan = FaultPlan("stall_getitem", fault_at=(8,), stall_s=60.0, align_timeout_s=5.0)
    run, plan = _run(plan, 2, tmp_path)
    _check(
        run,
        plan,
        ("AlignmentTimeoutError",),
        ("align_timeout_s=5.0", "stuck", "Processes under"),
        peer_fragments=("no answer from a peer rank within align_timeout_s=5.0",),
    )


@pytest.mark.parametrize("kind", ["stall_getitem", "stall_trainer"])
def test_stall_shorter_than_align_timeout(kind: str, tmp_path: Path) -> None:
    options = dict(fault_at=(8,), at_step=4, stall_s=3.0, align_timeout_s=8.0)
    base, _ = _run(FaultPlan("none", **options), 2, tmp_path / "base")
    slow, plan = _run(FaultPlan(kind, **options), 2, tmp_path)
    assert fault_time(plan.stamp_dir) is not None, "the stall was never injected"
    for fast, late in zip(base.outcomes, slow.outcomes, strict=True):
        assert late.value["error"] is None, slow.describe()
        _check_resources(late.value, slow.describe())
        # The same samples, each exactly once, and the same step count on every rank.
        assert sorted(late.value["ids"][0]) == sorted(fast.value["ids"][0])
    steps = {o.value["steps"][0] for o in slow.outcomes}
    assert len(steps) == 1, slow.describe()
    every = sorted(i for o in slow.outcomes for i in o.value["ids"][0])
    assert every == list(range(plan.num_samples))


def test_late_start_is_bounded_by_init_timeout_not_align_timeout(tmp_path: Path) -> None:
    # A rank that starts the epoch 6 s after its peers (align_timeout_s=3, init_timeout_s
    # 30): the rendezvous waits under init_timeout_s, so the epoch just runs.
    plan = FaultPlan("late_start", mode="thread", stall_s=6.0, align_timeout_s=3.0)
    run, plan = _run(plan, 2, tmp_path)
    for outcome in run.outcomes:
        assert outcome.value["error"] is None, run.describe()
        _check_resources(outcome.value, run.describe())
    every = sorted(i for o in run.outcomes for i in o.value["ids"][0])
    assert every == list(range(plan.num_samples))


# --- the training loop leaves early -------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_one_rank_breaks(world_size: int, tmp_path: Path) -> None:
    # Documented behaviour: the rank that breaks stops quietly; its peers, which still
    # iterate, raise at once (its collate side is gone), never hang.
    run, plan = _run(FaultPlan("break", at_step=3), world_size, tmp_path)
    reports = _check(run, plan, (None,), peer_fragments=("align_timeout_s", "left the loop early"))
    assert _victim_report(reports, plan)["steps"] == [3]


@pytest.mark.parametrize("world_size", [2, 3])
def test_training_loop_raises(world_size: int, tmp_path: Path) -> None:
    run, plan = _run(FaultPlan("raise", at_step=3), world_size, tmp_path)
    _check(
        run,
        plan,
        ("TrainingLoopError",),
        ("training step exploded (marker 6607)",),
        peer_fragments=("align_timeout_s", "collate side is gone"),
    )


# --- signals ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, victim_error",
    [
        ("sigint", ("KeyboardInterrupt",)),
        ("sigint_group", ("KeyboardInterrupt",)),  # Ctrl-C: the collate process too
        ("sigterm_raise", ("SystemExit",)),
    ],
)
def test_interrupt_shuts_down_cleanly(
    kind: str, victim_error: tuple[str, ...], tmp_path: Path
) -> None:
    run, plan = _run(FaultPlan(kind, at_step=3), 2, tmp_path)
    _check(run, plan, victim_error, peer_fragments=("align_timeout_s", "collate side is gone"))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_sigterm_kills_rank_cleanly(start_method: str, tmp_path: Path) -> None:
    # Default SIGTERM action: the trainer dies without cleanup; its collate process
    # (watchdog) and workers exit, and the resource tracker unlinks the semaphores.
    plan = FaultPlan("sigterm", victim=0, at_step=3, start_method=start_method)
    run, plan = _run(plan, 2, tmp_path)
    reports = _check(run, plan, (), peer_fragments=("align_timeout_s", "gone"), victim_dies=True)
    _check_watchdog(reports)


# --- lifecycle ----------------------------------------------------------------------


def _semaphores(shm: set[str]) -> set[str]:
    return {name for name in shm if name.startswith("sem.")}


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_resources_return_to_baseline(mode: str, tmp_path: Path) -> None:
    # Three epochs, a break on every rank, three more epochs, the loader dropped. Between
    # epochs a rank holds its idle collate process (process mode), the same one each
    # epoch, and the same descriptors and /dev/shm entries as after the first epoch; after
    # the break (its collate side stopped) and once the loader is gone, the baseline.
    plan = FaultPlan("none", mode=mode, epochs=3, at_step=2, num_samples=48)
    with ShmAudit() as shm:
        run = run_fault_ranks(lifecycle_rank, 2, plan, timeout=RUN_LIMIT_S)
        assert not run.hung and not run.orphans, run.describe()
        assert not shm.leaked()
    for outcome in run.outcomes:
        assert outcome.exitcode == 0 and outcome.value is not None, run.describe()
        base, idle = outcome.value["base"], outcome.value["idle"]
        phases = dict(outcome.value["phases"])
        assert len(idle["children"]) == (mode == "process"), idle
        # After the break a new collate process runs: its semaphores have new names.
        fresh = phases["epoch 4"]
        assert len(fresh["children"]) == len(idle["children"]), fresh
        assert fresh["fds"] <= idle["fds"] and len(fresh["shm"]) <= len(idle["shm"]), fresh
        refs = {"break": base, "loader dropped": base, "epoch 5": fresh, "epoch 6": fresh}
        for phase, now in phases.items():
            ref = refs.get(phase, idle if phase != "epoch 4" else fresh)
            where = f"rank {outcome.rank} after {phase}: {now} vs {ref}"
            assert now["children"] == ref["children"], where  # the same process, reused
            assert now["fds"] <= ref["fds"], where
            # The same semaphores; as many shared-memory mappings at most (the consumer's
            # last batch keeps its hand-off block, which one changes from epoch to epoch).
            assert _semaphores(now["shm"]) <= _semaphores(ref["shm"]), where
            assert len(now["shm"]) <= len(ref["shm"]), where
    every = [sorted(i for o in run.outcomes for i in o.value["ids"][e]) for e in range(6)]
    assert every == [list(range(plan.num_samples))] * 6


# --- a stranger in the rendezvous store -------------------------------------------------


def _stranger(stamp_dir: Path, epochs: int, world_size: int, stop: threading.Event) -> None:
    """Another program on the store's port: garbage under every key Gloo and the failure
    notes use in the coming iterations, before the ranks start, then every key it can
    list overwritten again and again until ``stop``."""
    address = Path(stamp_dir, "store")
    while not address.exists() and not stop.is_set():
        time.sleep(0.05)
    if stop.is_set():
        return
    host, port = address.read_text().split()
    client = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
    for n in range(1, epochs + 2):
        epoch = dist.PrefixStore(f"odb/iter{n}/", client)
        for rank in range(world_size):
            epoch.set(f"0/{rank}", b"\x00stranger" * 8)
            epoch.set(f"odb_failed/{rank}", "rank 0 is a forged note")
    Path(stamp_dir, "stranger_wrote").touch()
    while not stop.is_set():
        with contextlib.suppress(Exception):  # the store host ends with the ranks
            for key in client.list_keys():
                client.set(key.lstrip("/"), b"forged counts 7 7 7")
        time.sleep(0.01)


def test_a_stranger_writing_into_the_store_is_refused_or_ignored(tmp_path: Path) -> None:
    # Rank 0's store listens on every interface across nodes (torch's own store does),
    # so another program may reach it. Its values carry no valid tag: a rank that reads
    # one stops with an error naming the store; its peers' rendezvous then ends within
    # init_timeout_s, naming the store's address. Either the stranger is caught or the
    # run ignores it; no rank emits a sample twice, and none hangs.
    epochs, world_size = 3, 2
    plan = FaultPlan(
        "none",
        epochs=epochs,
        num_samples=24,
        stamp_dir=str(tmp_path),
        options=dict(init_timeout_s=10.0),
    )
    stop = threading.Event()
    stranger = threading.Thread(target=_stranger, args=(tmp_path, epochs, world_size, stop))
    stranger.start()
    try:
        run = run_fault_ranks(stranger_rank, world_size, plan, timeout=RUN_LIMIT_S)
    finally:
        stop.set()
        stranger.join()
    text = run.describe()
    assert not run.hung and not run.orphans, text
    values = [o.value for o in run.outcomes]
    assert all(o.exitcode == 0 and o.value is not None for o in run.outcomes), text
    complete = min(len(v["ids"]) for v in values)
    for epoch in range(complete):
        seen = [i for v in values for i in v["ids"][epoch]]
        assert sorted(seen) == list(range(plan.num_samples)), f"epoch {epoch}\n{text}"
    for v in values:
        if v["error"] is not None:
            assert v["store"] in v["error"], text  # names the store
            assert v["error_s"] <= 10.0 + SLACK_S + 10.0, text
    errors = [v["error"] for v in values if v["error"]]
    assert not errors or any("StoreForgeryError" in e for e in errors), text
