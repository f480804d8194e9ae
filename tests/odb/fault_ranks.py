"""What each rank of a fault test runs: a loader, a training loop and one injected fault.

:func:`fault_rank` is module-level so :func:`tests.odb.fault_harness.run_fault_ranks`
can spawn it. It never lets the loader's error escape: it returns a dict describing how
the loop ended (error type, message, when), how many steps it took, and what the rank
held before and after (child processes, open file descriptors), so the test can assert
on every rank, including the ones that failed as expected.

Faults (``FaultPlan.kind``), injected on rank ``victim`` only:

- ``getitem``: the dataset raises :class:`InjectedError` for every index in ``fault_at``
  (view positions, see :func:`view_index`);
- ``collate``: the collate function raises :class:`InjectedError` on call ``at_step``;
- ``stall_getitem``: the dataset sleeps ``stall_s`` at view position ``fault_at[0]``;
- ``stall_trainer``: the training loop sleeps ``stall_s`` at step ``at_step``;
- ``kill_worker``: the DataLoader worker SIGKILLs itself while reading view position
  ``fault_at[0]``, so the kill lands while the worker still owes that item;
- ``kill_collate``: SIGKILL the collate process at step ``at_step``;
- ``kill_trainer`` / ``sigterm``: SIGKILL / SIGTERM (default action) the rank itself;
- ``sigint``: SIGINT to the rank (KeyboardInterrupt in the loop);
- ``sigint_group``: SIGINT to the rank's whole process group, as Ctrl-C in a terminal;
- ``sigterm_raise``: SIGTERM with a handler that raises ``SystemExit`` (how launchers
  that turn signals into exceptions behave);
- ``break``: leave the loop early; ``raise``: raise :class:`TrainingLoopError` in it;
- ``late_start``: start iterating ``stall_s`` after the peers (an epoch boundary);
- ``none``: no fault (baseline for the stall comparisons).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

import odb
from harness.shm_audit import held_shm

LOOP_KINDS = (
    "kill_collate",
    "kill_trainer",
    "sigterm",
    "sigint",
    "sigint_group",
    "sigterm_raise",
    "break",
    "raise",
    "stall_trainer",
)


class InjectedError(RuntimeError):
    """Raised on purpose by the test's dataset or collate function."""


class TrainingLoopError(ValueError):
    """Raised on purpose by the test's training loop."""


@dataclass(frozen=True)
class FaultPlan:
    kind: str
    victim: int = 1
    mode: str = "process"
    num_workers: int = 1
    num_samples: int = 96
    token_budget: int = 48
    align_timeout_s: float = 8.0
    fault_at: tuple[int, ...] = ()  # view positions of the victim (getitem kinds)
    at_step: int = 2  # loop step (loop kinds) or collate call (collate)
    stall_s: float = 0.0
    stamp_dir: str = ""  # where the victim writes the time of the fault
    epochs: int = 1
    # The trainer's multiprocessing start method: "fork" is what a torchrun-launched
    # script has on Linux (the collate process starts its DataLoader workers the same way).
    start_method: str = "fork"
    options: dict[str, Any] = field(default_factory=dict)


def view_index(position: int, rank: int, world_size: int) -> int:
    """Dataset index at ``position`` of ``rank``'s view (``shuffle=False``: round-robin)."""
    return position * world_size + rank


def stamp(stamp_dir: str, what: str) -> None:
    """Record, once, when the fault happened (wall clock, shared by all processes)."""
    if not stamp_dir:
        return
    path = Path(stamp_dir, "fault_time")
    try:
        with open(path, "x") as f:
            f.write(f"{time.time()!r} {what}")
    except FileExistsError:
        pass


def fault_time(stamp_dir: str) -> float | None:
    path = Path(stamp_dir, "fault_time")
    return float(path.read_text().split()[0]) if path.exists() else None


class FaultDataset:
    """Samples of ``lengths[i]`` tokens; raises or sleeps at chosen indices (picklable)."""

    def __init__(
        self,
        lengths: list[int],
        raise_at: frozenset[int] = frozenset(),
        stall_at: frozenset[int] = frozenset(),
        stall_s: float = 0.0,
        stamp_dir: str = "",
        kill_at: frozenset[int] = frozenset(),
    ) -> None:
        self.lengths = lengths
        self.raise_at = raise_at
        self.kill_at = kill_at
        self.stall_at = stall_at
        self.stall_s = stall_s
        self.stamp_dir = stamp_dir

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index in self.raise_at:
            stamp(self.stamp_dir, "getitem")
            raise InjectedError(f"dataset item {index} exploded (marker 7319)")
        if index in self.kill_at:
            if get_worker_info() is None:
                raise AssertionError(f"item {index} was read outside a DataLoader worker")
            stamp(self.stamp_dir, "kill_worker")
            os.kill(os.getpid(), signal.SIGKILL)
        if index in self.stall_at:
            stamp(self.stamp_dir, "stall")
            time.sleep(self.stall_s)
        ids = torch.arange(self.lengths[index], dtype=torch.long) % 97 + 3
        labels = ids.clone()
        labels[: len(labels) // 3] = -100
        return {"input_ids": ids, "labels": labels, "index": torch.tensor([index])}


class FaultCollate:
    """``PadCollate`` that raises on its ``fail_on``-th call (None: never)."""

    def __init__(self, fail_on: int | None = None, stamp_dir: str = "") -> None:
        self.fail_on = fail_on
        self.stamp_dir = stamp_dir
        self.calls = 0
        self.pad = odb.PadCollate()

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        if self.fail_on is not None and self.calls == self.fail_on:
            stamp(self.stamp_dir, "collate")
            raise InjectedError(f"collate_fn exploded on call {self.calls} (marker 8123)")
        self.calls += 1
        return self.pad(samples)


class UnpicklableCollate:
    """``PadCollate`` whose batches hold a lambda: they cannot cross a process boundary."""

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        batch = odb.PadCollate()(samples)
        batch["hook"] = lambda: None
        return batch


def lengths_for(plan: FaultPlan) -> list[int]:
    return [3 + (i * 7) % 29 for i in range(plan.num_samples)]


# --- what a rank holds --------------------------------------------------------------


def _is_tracker(proc: psutil.Process) -> bool:
    return "resource_tracker" in " ".join(proc.cmdline())


def loader_children() -> list[psutil.Process]:
    """Live descendants other than multiprocessing's resource tracker (one per program)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not _is_tracker(proc):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def children_settle(timeout_s: float = 10.0, keep: int = 0) -> list[int]:
    """Pids of the live children once at most ``keep`` are left (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = loader_children()
        if len(alive) <= keep or time.monotonic() > deadline:
            return [p.pid for p in alive]
        time.sleep(0.1)


def tree_shm() -> set[str]:
    """``/dev/shm`` entries this process and its descendants hold."""
    pids = [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]
    return held_shm(pids)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def victim_children_gone(stamp_dir: str, timeout_s: float = 20.0) -> float | None:
    """Seconds from the fault until the killed trainer's children were all gone.

    None when they were not gone ``timeout_s`` after the fault. Measured by a surviving
    peer, so it is known before the harness cleans anything up.
    """
    fault = fault_time(stamp_dir)
    pids = [int(p) for p in Path(stamp_dir, "victim_children").read_text().split()]
    assert fault is not None and pids, "the victim did not record its children"
    while time.time() - fault < timeout_s:
        if all(_gone(pid) for pid in pids):
            return time.time() - fault
        time.sleep(0.05)
    return None


def open_fds() -> int:
    return psutil.Process().num_fds()


def fd_targets() -> list[str]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:
            continue
    return sorted(out)


def fds_settle(baseline: int, timeout_s: float = 10.0) -> int:
    """FD count once it is back to ``baseline`` (or whatever it is at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = open_fds()
        if count <= baseline or time.monotonic() > deadline:
            return count
        time.sleep(0.1)


def collate_process() -> psutil.Process:
    """This rank's collate process: the Python child that is not the resource tracker.

    A collate process carries its rank's command line (forked) or multiprocessing's
    own (spawned): ``multiprocessing.forkserver`` or ``spawn_main`` either way, which
    torch's ``torch_shm_manager`` does not."""
    for proc in psutil.Process().children():
        try:
            command = " ".join(proc.cmdline())
            if ("spawn_main" in command or "forkserver" in command) and not _is_tracker(proc):
                return proc
        except psutil.NoSuchProcess:
            continue
    raise AssertionError("no collate process found")


# --- the rank ------------------------------------------------------------------------


def build_loader(rank: int, world_size: int, plan: FaultPlan) -> odb.ODBLoader:
    victim = rank == plan.victim
    positions = plan.fault_at if victim else ()
    indices = frozenset(view_index(p, rank, world_size) for p in positions)
    dataset = FaultDataset(
        lengths_for(plan),
        raise_at=indices if plan.kind == "getitem" else frozenset(),
        stall_at=indices if plan.kind == "stall_getitem" else frozenset(),
        stall_s=plan.stall_s,
        stamp_dir=plan.stamp_dir,
        kill_at=indices if plan.kind == "kill_worker" else frozenset(),
    )
    fail_on = plan.at_step if victim and plan.kind == "collate" else None
    options = dict(
        token_budget=plan.token_budget,
        collate_mode=plan.mode,
        num_workers=plan.num_workers,
        align_timeout_s=plan.align_timeout_s,
        init_timeout_s=30.0,
        shuffle=False,
        queue_depth=2,
        buffer_budgets=2,
    )
    options.update(plan.options)
    return odb.ODBLoader(dataset, collate_fn=FaultCollate(fail_on, plan.stamp_dir), **options)


def _inject(plan: FaultPlan) -> str | None:
    """Inject a loop fault; returns "break" or "raise" when the loop must do that."""
    kind = plan.kind
    if kind == "kill_collate":
        proc = collate_process()
        stamp(plan.stamp_dir, kind)
        proc.kill()
    elif kind in ("kill_trainer", "sigterm"):
        pids = [p.pid for p in loader_children()]
        Path(plan.stamp_dir, "victim_children").write_text(" ".join(map(str, pids)))
        stamp(plan.stamp_dir, kind)
        os.kill(os.getpid(), signal.SIGKILL if kind == "kill_trainer" else signal.SIGTERM)
        time.sleep(60)  # the signal ends the process before this returns
    elif kind == "sigint":
        stamp(plan.stamp_dir, kind)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # KeyboardInterrupt is raised here
    elif kind == "sigint_group":
        stamp(plan.stamp_dir, kind)
        os.killpg(os.getpgid(0), signal.SIGINT)
        time.sleep(5)
    elif kind == "sigterm_raise":
        stamp(plan.stamp_dir, kind)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    elif kind == "stall_trainer":
        stamp(plan.stamp_dir, kind)
        time.sleep(plan.stall_s)
    elif kind in ("break", "raise"):
        stamp(plan.stamp_dir, kind)
        return kind
    return None


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    sys.exit(128 + signum)


def _train(rank: int, plan: FaultPlan, loader: odb.ODBLoader, report: dict[str, Any]) -> None:
    for epoch in range(plan.epochs):
        loader.set_epoch(epoch)
        steps = 0
        ids: list[int] = []
        report["steps"].append(0)
        report["ids"].append(ids)
        for batch in loader:
            info = odb.pop_step_info(batch)
            ids.extend(info.sample_ids)
            if rank == plan.victim and steps == plan.at_step and plan.kind in LOOP_KINDS:
                action = _inject(plan)
                if action == "break":
                    break
                if action == "raise":
                    raise TrainingLoopError("training step exploded (marker 6607)")
            steps += 1
            report["steps"][-1] = steps


def fault_rank(rank: int, world_size: int, plan: FaultPlan) -> dict[str, Any]:
    """Iterate ``plan.epochs`` epochs, injecting the fault on the victim; report."""
    own_resource_tracker()
    multiprocessing.set_start_method(plan.start_method, force=True)
    if plan.kind == "sigterm_raise" and rank == plan.victim:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if plan.kind.startswith("sigint") and rank == plan.victim:
        # What an interactive trainer has; a shell's background job starts with SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = build_loader(rank, world_size, plan)
    fds_before = open_fds()
    targets_before = fd_targets()
    children_before = [p.pid for p in loader_children()]
    shm_before = tree_shm()
    report: dict[str, Any] = dict(rank=rank, steps=[], ids=[], error=None, error_type=None)
    started = time.time()
    if plan.kind == "late_start" and rank == plan.victim:
        stamp(plan.stamp_dir, plan.kind)
        time.sleep(plan.stall_s)  # e.g. rank 0 saving a checkpoint between epochs
    try:
        _train(rank, plan, loader, report)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/SystemExit are results
        report.update(
            error=str(exc),
            error_type=type(exc).__name__,
            error_module=type(exc).__module__,
            error_time=time.time(),
            cause=str(exc.__cause__ or ""),
        )
    if plan.kind in ("kill_trainer", "sigterm") and rank != plan.victim:
        report["victim_children_gone_s"] = victim_children_gone(plan.stamp_dir)
    report["started"] = started
    report["ended"] = time.time()
    wait_for_peer_reports(rank, world_size, plan)
    report["children_before"] = children_before
    # With the loader still alive: after an error or a break its collate side is gone;
    # after clean epochs only its idle collate process (process mode) is left.
    clean = report["error"] is None and not (rank == plan.victim and plan.kind == "break")
    report["may_keep"] = int(clean and plan.mode == "process")
    report["children_kept"] = children_settle(10.0, keep=report["may_keep"])
    report["stats"] = loader.stats()
    del loader  # and with the loader, everything goes
    report["children_left"] = children_settle(10.0)
    report["fds_before"] = fds_before
    report["fds_after"] = fds_settle(fds_before)
    after = fd_targets()
    for t in targets_before:
        if t in after:
            after.remove(t)
    report["fds_new"] = after
    report["shm_before"] = shm_before
    report["shm_after"] = shm_settle(shm_before)
    return report


def wait_for_peer_reports(
    rank: int, world_size: int, plan: FaultPlan, timeout_s: float = 20.0
) -> None:
    """Keep this rank's loader alive until every surviving rank has its error.

    Rank 0's loader hosts the store that holds the failure notes peers quote in their
    errors. In a real job rank 0 may exit first and a slow peer then reads "its collate
    side is gone" instead of the note (best effort by design); the tests check the note,
    so no rank tears its loader down before all have ended. A killed victim never ends.
    """
    if not plan.stamp_dir:
        return
    Path(plan.stamp_dir, f"ended.{rank}").touch()
    killed = plan.victim if plan.kind in ("kill_trainer", "sigterm") else None
    waiting = [r for r in range(world_size) if r != killed]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(Path(plan.stamp_dir, f"ended.{r}").exists() for r in waiting):
            return
        time.sleep(0.05)


def shm_settle(baseline: set[str], timeout_s: float = 10.0) -> set[str]:
    """What the process tree holds in ``/dev/shm`` beyond ``baseline``, once settled."""
    deadline = time.monotonic() + timeout_s
    while True:
        extra = tree_shm() - baseline
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def shm_count_settle(baseline: set[str], timeout_s: float = 10.0) -> None:
    """Wait until the process tree holds no more ``/dev/shm`` entries than ``baseline``.

    For an idle loader between epochs, whose entries' names may change: a consumer's
    last batch keeps its hand-off block, which one changes from epoch to epoch.
    """
    deadline = time.monotonic() + timeout_s
    while len(tree_shm()) > len(baseline) and time.monotonic() < deadline:
        time.sleep(0.1)


def _resources(
    base: dict[str, Any] | None = None, keep: int = 0, same_shm: bool = True
) -> dict[str, Any]:
    """Children, fds and /dev/shm entries once settled, measured while no rank iterates.

    Settles towards ``base`` (at most ``keep`` children: an idle collate process; its
    very ``/dev/shm`` entries, or with ``same_shm=False`` as many of them and its
    semaphores). The barriers keep a peer from starting its next epoch (and connecting
    to the rendezvous store that rank 0 hosts) while this rank still measures.
    """
    dist.barrier()
    children = children_settle(10.0, keep=keep)
    fds = open_fds() if base is None else fds_settle(base["fds"])
    if base is not None:
        (shm_settle if same_shm else shm_count_settle)(base["shm"])
    shm = tree_shm()
    out = dict(children=children, fds=fds, shm=shm, targets=fd_targets())
    if base is not None and fds > base["fds"]:
        extra = list(out["targets"])
        for t in base["targets"]:
            if t in extra:
                extra.remove(t)
        out["extra"] = extra
    dist.barrier()
    return out


def own_resource_tracker() -> None:
    """Give this rank its own multiprocessing resource tracker, as under torchrun.

    A rank spawned by the test harness inherits the test process's tracker, which
    unlinks what a killed process leaves in ``/dev/shm`` only when the *test* ends.
    Under torchrun every rank starts its own, which does so when the rank's processes
    are gone; the leak checks need that behaviour.
    """
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if tracker._fd is not None:
        os.close(tracker._fd)
        tracker._fd = None
        tracker._pid = None
    tracker.ensure_running()  # now, so that its pipe is part of the fd baselines


def lifecycle_rank(rank: int, world_size: int, plan: FaultPlan) -> dict[str, Any]:
    """Epochs, a break on every rank, more epochs, the loader dropped; resources after each.

    Returns the baseline (after the loader is built, before any iteration), the
    resources after the first epoch (the loader's idle collate side: the reference for
    later epochs), after every phase, and the ids each full epoch yielded.
    """
    own_resource_tracker()
    multiprocessing.set_start_method(plan.start_method, force=True)
    loader = build_loader(rank, world_size, plan)
    base = _resources()
    keep = int(plan.mode == "process")
    phases: list[tuple[str, dict[str, Any]]] = []
    ids: list[list[int]] = []

    _epoch(loader, 0, ids)
    idle = _resources(keep=keep)
    phases.append(("epoch 0", idle))
    for n in range(1, plan.epochs):
        _epoch(loader, n, ids)
        phases.append((f"epoch {n}", _resources(idle, keep=keep, same_shm=False)))
    _epoch(loader, plan.epochs, ids, stop_at=plan.at_step)  # every rank breaks at the same step
    phases.append(("break", _resources(base)))
    fresh = None  # after the break a new collate process: its first epoch is the reference
    for n in range(plan.epochs + 1, 2 * plan.epochs + 1):
        _epoch(loader, n, ids)
        now = _resources(fresh or idle, keep=keep, same_shm=False)
        fresh = fresh or now
        phases.append((f"epoch {n}", now))
    del loader
    phases.append(("loader dropped", _resources(base)))
    return dict(base=base, idle=idle, phases=phases, ids=ids)


def _epoch(loader: odb.ODBLoader, n: int, ids: list[list[int]], stop_at: int | None = None) -> None:
    """Epoch ``n``; its ids appended to ``ids`` unless it stops (break) at ``stop_at``."""
    loader.set_epoch(n)
    mine: list[int] = []
    for step, batch in enumerate(loader):
        mine.extend(odb.pop_step_info(batch).sample_ids)
        del batch
        if stop_at is not None and step == stop_at:
            break
    if stop_at is None:
        ids.append(mine)


# --- a stranger in the rendezvous store ---------------------------------------------


def stranger_rank(rank: int, world_size: int, plan: FaultPlan) -> dict[str, Any]:
    """``plan.epochs`` epochs while a stranger writes into the loader's rendezvous store.

    Rank 0 publishes the store's address in ``plan.stamp_dir`` (``store``); every rank
    starts iterating once the stranger has written (``stranger_wrote``). Returns the ids
    of each complete epoch, and the error that ended the loop (None if none did).
    """
    own_resource_tracker()
    multiprocessing.set_start_method(plan.start_method, force=True)
    loader = build_loader(rank, world_size, plan)
    rendezvous = loader._rendezvous
    assert rendezvous is not None
    if rank == 0:
        Path(plan.stamp_dir, "store").write_text(f"{rendezvous.host} {rendezvous.port}")
    wrote = Path(plan.stamp_dir, "stranger_wrote")
    deadline = time.monotonic() + 30.0
    while not wrote.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    ids: list[list[int]] = []
    error, started = None, time.monotonic()
    try:
        for n in range(plan.epochs):
            _epoch(loader, n, ids)
    except Exception as exc:  # noqa: BLE001 - the outcome is the test's to judge
        error = f"{type(exc).__name__}: {exc}"
    return dict(
        ids=ids,
        error=error,
        error_s=time.monotonic() - started,
        store=f"{rendezvous.host}:{rendezvous.port}",
    )
