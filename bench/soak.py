"""Randomized soak: many seeded multi-rank scenarios, each under a hard wall-clock limit.

Every scenario is drawn from its seed (world size 1-4, collate thread or process, the
process forked, spawned or started by a forkserver, torch's ``file_descriptor`` or
``file_system`` sharing strategy set by the trainer, 0-2 DataLoader workers, fork or
spawn workers, budgets from
tiny to large, skewed and long-tail lengths with over-budget samples, empty shards,
join and non-join, 1-3 epochs, both alignment policies, gradient accumulation, small
and large buffers and queues; who shards: ODB dealing one dataset, a user's global sampler, per-rank
datasets, a pre-sharded stream, a stream that shards itself over workers; rank 0
alone taking its state piece mid-epoch) and run on real ranks (Gloo over TCP on
127.0.0.1) by ``harness.ranks.run_ranks``.
Zero-length samples are an error by design (``tests/odb/test_bad_input.py``), so no
scenario has them.

What is audited per scenario (``audit``), then summed:

- ``hangs``: a run still going at its hard limit (ranks killed, stacks kept);
- ``lost_ids`` / ``duplicated_ids``: join mode, every index of the dataset exactly once
  per epoch; non-join, a sample's identity is (origin epoch, index) (docs/protocol.md
  G4), so an index may occur twice in an epoch only as the last epoch's carried sample
  plus its own fresh copy; any further occurrence is a duplicate, and ``emitted +
  carried`` must equal the epoch's quota (a shortfall counts as lost);
- ``step_count_disagreements``: epochs in which the ranks yielded different numbers of
  steps;
- ``budget_violations``: multi-sample groups whose padded cost exceeds the budget;
- ``failures``: everything else (a rank raised, or another invariant of
  ``harness.scenarios.check_scenario`` broke), each with its seed.

Scenarios of the same world size run in batches of ``--batch`` on one set of ranks
(the hard limit is the sum of theirs); a batch that fails is re-run one scenario at
a time, each with its own limit, so every failure names its seed.

    python -m bench.soak --scenarios 500 --seed 0 --out results/bench/soak.json

Prints one JSON document; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.multiprocessing

from bench.early_stop import EarlyStop, draw_stop, early_stop_scenario, resume, stop_early
from bench.early_stop import audit as audit_early_stop
from harness.ranks import run_ranks
from harness.scenarios import SETUPS, Scenario, check_scenario, draw_lengths, run_scenario

BUDGETS = (4, 16, 64, 256, 1024, 8192)
STARTS = ("fork", "fork", "spawn", "forkserver")  # of a collate process; fork is Linux's default
LIMIT_S = 90.0  # hard wall-clock limit of one scenario
COUNTERS = (
    "hangs",
    "lost_ids",
    "duplicated_ids",
    "step_count_disagreements",
    "budget_violations",
    "abnormal_exits",
)


@dataclass(frozen=True)
class Draw:
    """One seed's scenario and what its ranks set before they build the loader."""

    scenario: Scenario
    worker_start: str  # the ranks' global start method (their DataLoader workers')
    sharing: str  # torch.multiprocessing's sharing strategy
    stop: EarlyStop | None = None  # the early-stop draw (bench/early_stop.py)


def draw(seed: int, quick: bool = False) -> Draw:
    """The scenario of ``seed``, its ranks' start method and sharing strategy, and
    whether it stops early (:mod:`bench.early_stop`).

    ``quick`` (the CI slice) draws the same space but cheaper: one or two epochs, at
    most 60 samples, a collate process in a third of the scenarios (each costs a
    process start per epoch) and forked workers only.
    """
    return _with_stop(_draw_quick(seed) if quick else _draw_full(seed), quick)


def _draw_quick(seed: int) -> Draw:
    scenario = _draw_full(seed).scenario
    rng = random.Random(seed * 7919 + 1)
    mode = "process" if rng.random() < 1 / 3 else "thread"
    options = dict(scenario.options, collate_mode=mode)
    options.pop("collate_start_method", None)
    lengths = scenario.lengths[:60]
    epochs = min(scenario.epochs, 2)
    quick_scenario = Scenario(seed, scenario.world_size, lengths, options, epochs=epochs)
    quick_scenario, sharing = _with_processes(quick_scenario, rotate=True)
    return Draw(_with_setup(quick_scenario, rotate=True), "fork", sharing)


def _draw_full(seed: int) -> Draw:
    rng = random.Random(seed)
    world_size = rng.randint(1, 4)
    mode = rng.choice(["thread", "process"])
    budget = rng.choice(BUDGETS)
    n = rng.choice([0, 1, world_size - 1, rng.randint(world_size, 40), rng.randint(40, 160)])
    skewed = rng.random() < 0.5
    lengths = draw_lengths(rng, max(n, 0), budget, world_size, skewed)
    # A few samples over the budget whatever the profile (singleton groups).
    lengths = [
        rng.randint(budget + 1, 2 * budget + 1) if rng.random() < 0.05 else length
        for length in lengths
    ]
    workers = rng.choice([0, 1, 2])
    options = dict(
        token_budget=budget,
        policy=rng.choice(["balanced", "paper"]),
        join=rng.random() < 0.6,
        grad_accum_steps=rng.choice([1, 1, 2, 3]),
        buffer_budgets=rng.choice([1, 2, 8, 64]),
        buffer_size=rng.choice([1, 4, 16, 256]),
        queue_depth=rng.choice([1, 2, 8]),
        age_limit=rng.choice([1, 4, 16]),
        shuffle=not skewed,
        seed=rng.randint(0, 1000),
        collate_mode=mode,
        num_workers=workers,
        prefetch_factor=rng.choice([1, 2, 4]) if workers else None,
        align_timeout_s=60.0,
        init_timeout_s=60.0,
    )
    start_method = "spawn" if rng.random() < 0.2 else "fork"
    scenario = Scenario(seed, world_size, lengths, options, epochs=rng.choice([1, 2, 3]))
    scenario, sharing = _with_processes(scenario)
    return Draw(_with_setup(scenario), start_method, sharing)


def _with_stop(drawn: Draw, quick: bool) -> Draw:
    """Draw whether the scenario stops early (:func:`bench.early_stop.draw_stop`); if so
    it becomes an early-stop scenario, run on fresh ranks of its own."""
    stop = draw_stop(drawn.scenario.seed, quick)
    if stop is None:
        return drawn
    scenario = early_stop_scenario(drawn.scenario)
    if quick:  # two launches of fresh ranks each: the CI slice keeps them small
        scenario = dataclasses.replace(
            scenario, world_size=min(scenario.world_size, 2), work=min(scenario.work, 4)
        )
    return dataclasses.replace(drawn, scenario=scenario, stop=stop)


def _with_processes(scenario: Scenario, rotate: bool = False) -> tuple[Scenario, str]:
    """Draw the collate process's start and the trainer's sharing strategy (issue 31).

    From a stream of their own, so every earlier draw of a seed stays as it was. Half
    the collate processes fork (Linux's default), the others spawn or use a forkserver;
    a third of the scenarios share tensors through ``file_system`` (torch_shm_manager),
    as many training scripts set. ``rotate`` (the quick draw) takes them in turn by
    seed instead: half the scenarios ``file_system``, the starts in turn.
    """
    rng = random.Random(scenario.seed * 7919 + 3)
    sharing = "file_system" if rng.random() < 1 / 3 else "file_descriptor"
    start = rng.choice(STARTS)
    if rotate:
        sharing = ("file_descriptor", "file_system")[scenario.seed % 2]
        start = STARTS[scenario.seed // 2 % len(STARTS)]
    if scenario.options["collate_mode"] != "process":
        return scenario, sharing
    options = dict(scenario.options, collate_start_method=start)
    return dataclasses.replace(scenario, options=options), sharing


def _with_setup(scenario: Scenario, rotate: bool = False) -> Scenario:
    """Draw who shards (``SETUPS``) and rank 0's lone save, from a stream of their own.

    A separate generator keeps every earlier draw of a seed as it was. Per-rank data and
    streams are drawn for join scenarios only (non-join is for one global dataset, and a
    non-join stream's carry is not bounded across epochs) and need a sample on every
    rank (an IDLE step is built from one of the rank's own samples). ``rotate`` (the
    quick draw) takes the set-ups in turn by seed, so a short slice covers them all.
    """
    rng = random.Random(scenario.seed * 7919 + 2)
    setup = rng.choice(SETUPS if scenario.options["join"] else SETUPS[:2])
    if rotate and scenario.options["join"]:  # the CI slice: every set-up in a short run
        setup = SETUPS[scenario.seed % len(SETUPS)]
    if setup not in SETUPS[:2] and len(scenario.lengths) < scenario.world_size:
        setup = "global"
    save_step = rng.choice([0, 1, 3])
    return Scenario(
        scenario.seed,
        scenario.world_size,
        scenario.lengths,
        scenario.options,
        scenario.epochs,
        setup=setup,
        save_step=save_step,
    )


def _run_batch(rank: int, world_size: int, seeds: list[int], quick: bool) -> list[Any]:
    """Rank body: run each scenario; an exception is a result, not the end of the batch."""
    out: list[Any] = []
    for seed in seeds:
        drawn = draw(seed, quick)
        multiprocessing.set_start_method(drawn.worker_start, force=True)
        torch.multiprocessing.set_sharing_strategy(drawn.sharing)
        try:
            out.append(("ok", run_scenario(drawn.scenario)))
        except Exception as exc:  # noqa: BLE001 - reported with its seed
            out.append(("error", f"{type(exc).__name__}: {exc}"[:2000]))
    return out


def audit(scenario: Scenario, per_rank: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Count invariant violations on what the ranks yielded; never raises."""
    counts = Counter({key: 0 for key in COUNTERS})
    opts, lengths = scenario.options, scenario.lengths
    budget = opts["token_budget"]
    carried_before = 0
    carry_in: list[int] = []
    for epoch in range(scenario.epochs):
        epochs = [records[epoch] for records in per_rank]
        steps = [len(e["steps"]) for e in epochs]
        if len(set(steps)) > 1:
            counts["step_count_disagreements"] += 1
        emitted = []
        for e in epochs:
            for s in e["steps"]:
                emitted.extend(s["ids"])
                if len(s["ids"]) > 1:
                    cost = max(lengths[i] for i in s["ids"]) * len(s["ids"])
                    counts["budget_violations"] += cost > budget
        carried = sum(e["stats"]["carried"] for e in epochs)
        owed = Counter(range(len(lengths))) + Counter(carry_in)
        counts["duplicated_ids"] += sum((Counter(emitted) - owed).values())
        if opts["join"]:
            counts["lost_ids"] += len(set(range(len(lengths))) - set(emitted))
        else:
            gap = len(lengths) + carried_before - (len(emitted) + carried)
            counts["lost_ids"] += max(gap, 0)
            counts["duplicated_ids"] += max(-gap, 0)
            carried_before = carried
            carry_in = [i for e in epochs for i in e["carry_next"]]  # one share per rank
    result: dict[str, Any] = dict(counts)
    try:
        check_scenario(scenario, per_rank)
    except AssertionError as exc:
        result["invariant"] = str(exc)[:500] or "check_scenario failed"
    return result


def _record(
    totals: Counter, failures: list[dict[str, Any]], seed: int, outcome: Any, quick: bool
) -> None:
    scenario = draw(seed, quick).scenario
    per_rank = [rank_results for rank_results in outcome]
    errors = [value for status, value in per_rank if status == "error"]
    if errors:
        failures.append(dict(seed=seed, kind="error", message=errors[0]))
        return
    found = audit(scenario, [value for _, value in per_rank])
    for key in COUNTERS:
        totals[key] += found[key]
    bad = {k: found[k] for k in COUNTERS if found[k]}
    if bad or "invariant" in found:
        failures.append(
            dict(seed=seed, kind="invariant", counts=bad, message=found.get("invariant"))
        )


def _batch(world: int, seeds: list[int], limit_s: float, quick: bool) -> list[list[Any]] | str:
    """Per-scenario outcomes ``[scenario][rank]``, or the harness's failure text."""
    try:
        ranks = run_ranks(_run_batch, world, seeds, quick, timeout=limit_s * len(seeds))
    except AssertionError as exc:
        return str(exc)
    return [[ranks[r][k] for r in range(world)] for k in range(len(seeds))]


def run_soak(
    scenarios: int,
    seed: int = 0,
    batch: int = 6,
    limit_s: float = LIMIT_S,
    quick: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run ``scenarios`` seeded scenarios (seeds ``seed .. seed + scenarios - 1``)."""
    started = time.perf_counter()
    seeds = list(range(seed, seed + scenarios))
    chunks: list[tuple[int, list[int]]] = []  # (world size, seeds run on one set of ranks)
    by_world: dict[int, list[int]] = {}
    for s in seeds:
        drawn = draw(s, quick)
        if drawn.stop is not None:  # its exit code is the verdict: ranks of its own
            chunks.append((drawn.scenario.world_size, [s]))
        else:
            by_world.setdefault(drawn.scenario.world_size, []).append(s)
    for world, group in sorted(by_world.items()):
        chunks += [(world, group[at : at + batch]) for at in range(0, len(group), batch)]
    totals: Counter = Counter({key: 0 for key in COUNTERS})
    failures: list[dict[str, Any]] = []
    done = 0
    for world, chunk in chunks:
        if draw(chunk[0], quick).stop is not None:
            _run_early_stop(world, chunk[0], limit_s, quick, totals, failures)
        else:
            _run_chunk(world, chunk, limit_s, quick, totals, failures)
        done += len(chunk)
        if not quiet:
            elapsed = time.perf_counter() - started
            print(
                f"[{elapsed:7.1f}s] {done}/{scenarios} scenarios, W={world}, "
                f"failures so far: {len(failures)}",
                file=sys.stderr,
                flush=True,
            )
    quick_flag = " --quick" if quick else ""
    return dict(
        command=f"python -m bench.soak --scenarios {scenarios} --seed {seed}{quick_flag}",
        scenarios_run=scenarios,
        seeds=[seed, seed + scenarios - 1],
        **{key: totals[key] for key in COUNTERS},
        failures=len(failures),
        failure_details=failures,
        by_world_size=dict(
            sorted(Counter(draw(s, quick).scenario.world_size for s in seeds).items())
        ),
        **_coverage([draw(s, quick) for s in seeds]),
        limit_s_per_scenario=limit_s,
        wall_s=round(time.perf_counter() - started, 1),
        machine=dict(
            cpus=os.cpu_count(), platform=platform.platform(), python=platform.python_version()
        ),
    )


def _run_chunk(
    world: int,
    chunk: list[int],
    limit_s: float,
    quick: bool,
    totals: Counter,
    failures: list[dict[str, Any]],
) -> None:
    """Run the seeds of ``chunk`` (one world size) on one set of ranks; add what they
    found to ``totals`` and ``failures``.

    A batch that fails as a whole (a hang or a crash) is re-run one scenario at a time,
    each with its own limit, so every failure names its seed; when none of them fails
    alone, the batch's own failure is kept as ``batch-only``.
    """
    outcome = _batch(world, chunk, limit_s, quick)
    if not isinstance(outcome, str):
        for s, per_scenario in zip(chunk, outcome, strict=True):
            _record(totals, failures, s, per_scenario, quick)
        return
    for s in chunk:
        single = _batch(world, [s], limit_s, quick)
        if isinstance(single, str):
            hung = "hung" in single
            totals["hangs"] += hung
            failures.append(dict(seed=s, kind="hang" if hung else "crash", message=single[-2000:]))
        else:
            _record(totals, failures, s, single[0], quick)
    if not any(f.get("seed") in chunk for f in failures):  # batch-only entries have seeds
        failures.append(dict(seeds=chunk, kind="batch-only", message=outcome[-2000:]))


def _run_early_stop(
    world: int,
    seed: int,
    limit_s: float,
    quick: bool,
    totals: Counter,
    failures: list[dict[str, Any]],
) -> None:
    """Run the early-stop scenario of ``seed`` on fresh ranks; add what it found."""
    drawn = draw(seed, quick)
    try:
        stopped = run_ranks(_run_stopping, world, drawn, timeout=limit_s, fresh=True)
        pieces = [r["piece"] for r in stopped]
        resumed = [[] for _ in range(world)]
        if all(r["stopped"] for r in stopped):  # else the pieces start the next epoch
            resumed = run_ranks(_run_resuming, world, drawn, pieces, timeout=limit_s, fresh=True)
    except AssertionError as exc:
        text = str(exc)
        kind = (
            "hang" if "hung" in text else "abnormal exit" if "returned, then" in text else "crash"
        )
        totals["hangs"] += kind == "hang"
        totals["abnormal_exits"] += kind == "abnormal exit"
        failures.append(dict(seed=seed, kind=kind, message=text[-2000:]))
        return
    found = audit_early_stop(drawn.scenario, stopped, resumed)
    for key in COUNTERS:
        totals[key] += found.get(key, 0)
    bad = {k: found[k] for k in COUNTERS if found.get(k)}
    if bad or "invariant" in found:
        failures.append(
            dict(seed=seed, kind="invariant", counts=bad, message=found.get("invariant"))
        )


def _set_up(drawn: Draw) -> None:
    multiprocessing.set_start_method(drawn.worker_start, force=True)
    torch.multiprocessing.set_sharing_strategy(drawn.sharing)


def _run_stopping(rank: int, world_size: int, drawn: Draw) -> dict[str, Any]:
    """Rank body of an early-stop scenario's first launch (:func:`bench.early_stop.stop_early`)."""
    assert drawn.stop is not None
    _set_up(drawn)
    return stop_early(drawn.scenario, drawn.stop)


def _run_resuming(
    rank: int, world_size: int, drawn: Draw, pieces: list[dict[str, Any]]
) -> list[list[int]]:
    """Rank body of its second launch (:func:`bench.early_stop.resume`)."""
    _set_up(drawn)
    return resume(drawn.scenario, pieces)


def _coverage(draws: list[Draw]) -> dict[str, Any]:
    """How the drawn scenarios cover the space: counts by collate mode and start, sharing
    strategy, workers, termination and set-up, and the number of rank-0-only saves."""
    drawn = [d.scenario for d in draws]
    starts = Counter(
        d.options["collate_start_method"] for d in drawn if d.options["collate_mode"] == "process"
    )
    return dict(
        by_collate_mode=dict(Counter(d.options["collate_mode"] for d in drawn)),
        by_collate_start=dict(sorted(starts.items())),
        by_sharing_strategy=dict(sorted(Counter(d.sharing for d in draws).items())),
        by_num_workers=dict(sorted(Counter(d.options["num_workers"] for d in drawn).items())),
        by_termination=dict(Counter("join" if d.options["join"] else "non-join" for d in drawn)),
        by_setup=dict(sorted(Counter(d.setup for d in drawn).items())),
        rank0_only_saves=sum(1 for d in drawn if d.save_step),
        by_early_stop=dict(sorted(Counter(d.stop.kind for d in draws if d.stop).items())),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=50, help="number of scenarios")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--batch", type=int, default=6, help="scenarios per set of ranks")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help="hard limit per scenario")
    parser.add_argument("--quick", action="store_true", help="the cheaper CI draw")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    result = run_soak(args.scenarios, args.seed, args.batch, args.limit, args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    clean = result["failures"] == 0 and all(result[key] == 0 for key in COUNTERS)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
