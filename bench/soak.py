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
- ``shm_leaks``: ``/dev/shm`` entries named for a process of the soak (torch's shared
  storages ``torch_<pid>_...``, multiprocessing's heap arenas) that no live process holds
  once the scenarios that made them ended (``harness.shm_audit``): a storage whose last
  user let go without its name going, left until ``torch_shm_manager`` exits, or for
  good when it is killed with its job;
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
import json
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch.multiprocessing

from bench.early_stop import audit as audit_early_stop
from bench.early_stop import resume, stop_early
from bench.soak_draws import Draw, coverage, draw
from harness.rank_handle import started_rank_pids
from harness.ranks import run_ranks
from harness.scenarios import Scenario, check_scenario, run_scenario
from harness.shm_audit import ShmAudit, creator

LIMIT_S = 90.0  # hard wall-clock limit of one scenario
COUNTERS = (
    "hangs",
    "lost_ids",
    "duplicated_ids",
    "step_count_disagreements",
    "budget_violations",
    "abnormal_exits",
    "shm_leaks",
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
    shm = ShmAudit(adopted=started_rank_pids)  # the pool's ranks are detached
    for world, chunk in chunks:
        if draw(chunk[0], quick).stop is not None:
            _run_early_stop(world, chunk[0], limit_s, quick, totals, failures)
        else:
            _run_chunk(world, chunk, limit_s, quick, totals, failures)
        _count_shm_leaks(shm, chunk, totals, failures)
        done += len(chunk)
        if not quiet:
            elapsed = time.perf_counter() - started
            print(
                f"[{elapsed:7.1f}s] {done}/{scenarios} scenarios, W={world}, "
                f"failures so far: {len(failures)}",
                file=sys.stderr,
                flush=True,
            )
    shm.close()
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
        **coverage([draw(s, quick) for s in seeds]),
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


def _count_shm_leaks(
    shm: ShmAudit, chunk: list[int], totals: Counter, failures: list[dict[str, Any]]
) -> None:
    """Count the named ``/dev/shm`` entries the soak's processes left unheld since the
    last count; the chunk that just ran is named with them, and who made each entry."""
    counted = set().union(*(f["names"] for f in failures if f["kind"] == "shm leak"))
    left = sorted({name for name in shm.leaked() if creator(name)} - counted)
    if left:
        totals["shm_leaks"] += len(left)
        roles = sorted({shm.role(name) for name in left})
        failures.append(dict(seeds=chunk, kind="shm leak", names=left, made_by=roles))


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
