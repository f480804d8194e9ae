"""A pure multi-rank simulator of ODB's round protocol (no processes, no collectives).

What :func:`odb.plan` predicts with, and what the benchmarks in ``bench/`` simulate with:
one protocol, driven here and in the loader by the same code.

``W`` ranks run in lockstep over per-rank views of a list of sample lengths, driven by
:class:`odb.core.lockstep.LockstepWorld`: the round driver
:func:`odb._process.collate_epoch.run_epoch` runs on every rank
(:class:`odb.core.lockstep.LockstepRank`: read, report, decide), with the status
all-gather done in memory through the wire row. Each rank emits ``outcome.payloads`` as
real steps, then ``outcome.steps.idle`` IDLE steps.
The protocol itself (grouping, planning, splitting, recirculation, the round loop) is
never reimplemented here: this module only feeds lengths in and records what comes
out. What is not simulated: the trainer's pace (every round sees ``free_slots`` free
queue places, default ``queue_depth``: a trainer that keeps up) and the count
all-reduce (it changes no step).

Views: :func:`round_robin_views` deals a seeded shuffle round-robin with
:func:`odb.core.sharding.rank_view` itself (what the loader does); skew benchmarks pass
explicit views.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from odb.core.budget import GroupMeasure, TokenBudget
from odb.core.config import ODBConfig
from odb.core.grouping import SizedSample, form_groups
from odb.core.lockstep import LockstepRank, LockstepWorld, Pull, Reading
from odb.core.rounds import RankRounds, RoundOutcome
from odb.core.sharding import rank_view


@dataclass
class RankTrace:
    """What one rank emitted over the epoch."""

    groups: list[list[int]] = field(default_factory=list)  # lengths, one list per real step
    ids: list[list[int]] = field(default_factory=list)  # sample indices, one list per real step
    costs: list[int] = field(default_factory=list)  # every step's cost in tokens, IDLE = 0
    idle: int = 0
    recirculated: int = 0
    paced_rounds: int = 0
    max_age: int = 0
    peak_buffer_bytes: int = 0

    @property
    def steps(self) -> int:
        return len(self.groups) + self.idle

    def record(self, outcome: RoundOutcome, budget: TokenBudget) -> None:
        """One round's steps, in emission order: its groups (payloads ``(index, length)``),
        then IDLE; each step's cost under ``budget``'s cost model."""
        for payloads in outcome.payloads:
            self.ids.append([index for index, _ in payloads])
            self.groups.append([length for _, length in payloads])
            self.costs.append(budget.cost(GroupMeasure.of(self.groups[-1])))
        self.idle += outcome.steps.idle
        self.costs.extend([0] * outcome.steps.idle)


@dataclass
class SimResult:
    """The outcome of one simulated epoch."""

    config: ODBConfig
    ranks: list[RankTrace]
    rounds: int
    tail_rounds: int
    targets: list[int]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def steps(self) -> int:
        """Aligned steps per epoch (the same on every rank; checked)."""
        return self.ranks[0].steps


def round_robin_views(
    num_samples: int, world_size: int, seed: int = 0, epoch: int = 0, shuffle: bool = True
) -> list[list[int]]:
    """The loader's own per-rank views (seeded shuffle dealt round-robin)."""
    return [
        rank_view(num_samples, r, world_size, seed=seed, epoch=epoch, shuffle=shuffle)
        for r in range(world_size)
    ]


def simulate(
    lengths: Sequence[int],
    config: ODBConfig,
    *,
    world_size: int | None = None,
    views: Sequence[Sequence[int]] | None = None,
    epoch: int = 0,
    free_slots: int | None = None,
    max_rounds: int = 1_000_000,
    check: bool = True,
    sample_bytes: Sequence[int] | None = None,
    sample_patches: Sequence[int] | None = None,
) -> SimResult:
    """Run one epoch of ``W`` ranks in lockstep.

    Args:
        lengths: Length of every sample (index -> tokens).
        config: Loader settings (policy, budget, buffer, age limit, queue depth, join).
        world_size: Number of ranks when ``views`` is not given.
        views: Explicit per-rank views (indices into ``lengths``, in reading order).
        epoch: Epoch of the seeded shuffle (with ``config.seed``) when views are dealt.
        free_slots: Free output-queue places every rank reports; default
            ``config.queue_depth`` (the trainer keeps up).
        max_rounds: Safety net: more rounds than this is a livelock, and raises.
        check: Verify the protocol's guarantees on the result (equal step counts, every
            multi-sample group within budget, identity coverage in join mode).
        sample_bytes: Bytes of every sample's data (index -> bytes), for the buffer's
            byte cap (``config.buffer_bytes``); default 0 (a pure-length run).
        sample_patches: Visual patches of every sample, for ``config.max_patches``.
    """
    if views is None:
        if world_size is None:
            raise ValueError("give world_size or views")
        views = round_robin_views(len(lengths), world_size, config.seed, epoch, config.shuffle)
    views = [list(v) for v in views]
    free = [config.queue_depth if free_slots is None else free_slots] * len(views)
    readers = [_reader(v, lengths, sample_bytes, sample_patches) for v in views]
    world = LockstepWorld(
        [LockstepRank(RankRounds(config, len(v)), readers[r], r) for r, v in enumerate(views)]
    )
    traces = [RankTrace() for _ in views]
    targets: list[int] = []
    tail_rounds = 0
    for _ in range(max_rounds):
        statuses, outcomes = world.round(free)
        plan = outcomes[0].plan
        if plan.end:
            break
        if all(s.read_done for s in statuses):
            tail_rounds += 1
        targets.append(plan.target)
        for trace, outcome in zip(traces, outcomes, strict=True):
            trace.record(outcome, config.budget)
    else:
        raise RuntimeError(f"no end of epoch after {max_rounds} rounds (livelock?)")
    _finish(traces, world)
    result = SimResult(config, traces, len(targets), tail_rounds, targets)
    if check:
        _check(result, lengths, views)
    return result


def _finish(traces: Sequence[RankTrace], world: LockstepWorld) -> None:
    """Copy each rank's end-of-epoch counters into its trace."""
    for trace, rank in zip(traces, world.ranks, strict=True):
        trace.recirculated = rank.rounds.recirculated
        trace.paced_rounds = rank.rounds.paced_rounds
        trace.max_age = rank.max_age
        trace.peak_buffer_bytes = rank.rounds.buffer.peak_nbytes


def _reader(
    view: Sequence[int],
    lengths: Sequence[int],
    sample_bytes: Sequence[int] | None,
    sample_patches: Sequence[int] | None,
) -> Pull:
    """A rank's view as a :data:`odb.core.lockstep.Pull`: payloads ``(index, length)``."""
    indices = iter(view)

    def pull() -> Reading | None:
        index = next(indices, None)
        if index is None:
            return None
        length = int(lengths[index])
        nbytes = 0 if sample_bytes is None else int(sample_bytes[index])
        patches = 0 if sample_patches is None else int(sample_patches[index])
        return Reading(length, patches, (index, length), nbytes)

    return pull


def _check(result: SimResult, lengths: Sequence[int], views: Sequence[Sequence[int]]) -> None:
    counts = [t.steps for t in result.ranks]
    if len(set(counts)) != 1:
        raise AssertionError(f"ranks yielded different step counts: {counts}")
    budget = result.config.budget
    for trace, view in zip(result.ranks, views, strict=True):
        for group in trace.groups:
            if (
                len(group) > 1
                and max(group) * len(group) > budget.max_tokens
                and budget.cost_model == "padded"
            ):
                raise AssertionError(f"group {group} exceeds the budget {budget.max_tokens}")
        if result.config.join:
            emitted = sorted(i for ids in trace.ids for i in ids)
            if emitted != sorted(view):
                raise AssertionError("join mode: the view was not emitted exactly once")


# ----------------------------------------------------------------------------- metrics


class RankSummary(TypedDict):
    """One rank's epoch in :func:`summarize`."""

    steps: int
    real_steps: int
    idle: int
    padding_efficiency: float
    mean_fill: float
    recirculated: int
    paced_rounds: int
    max_age: int
    peak_buffer_bytes: int


class EpochSummary(TypedDict):
    """:func:`summarize`'s epoch metrics: over all ranks, then each rank's."""

    steps: int
    rounds: int
    tail_rounds: int
    mean_target: float
    padding_efficiency: float
    mean_fill: float
    mean_group_size: float
    idle_steps: int
    idle_fraction: float
    max_age: int
    recirculated: int
    per_rank: list[RankSummary]


def group_stats(groups: Sequence[Sequence[int]], budget: int) -> dict[str, float]:
    """Padding efficiency and mean budget fill of real (non-IDLE) steps."""
    real = sum(sum(g) for g in groups)
    padded = sum(max(g) * len(g) for g in groups)
    fills = [max(g) * len(g) / budget for g in groups]
    return {
        "padding_efficiency": real / padded if padded else 1.0,
        "mean_fill": sum(fills) / len(fills) if fills else 0.0,
        "real_steps": len(groups),
        "mean_group_size": sum(len(g) for g in groups) / len(groups) if groups else 0.0,
    }


def summarize(result: SimResult) -> EpochSummary:
    """Epoch metrics of a simulation, over all ranks and per rank."""
    budget = result.config.token_budget
    everything = [g for t in result.ranks for g in t.groups]
    overall = group_stats(everything, budget)
    idle = sum(t.idle for t in result.ranks)
    rank_steps = result.steps * result.world_size
    per_rank: list[RankSummary] = []
    for t in result.ranks:
        s = group_stats(t.groups, budget)
        per_rank.append(
            {
                "steps": t.steps,
                "real_steps": int(s["real_steps"]),
                "idle": t.idle,
                "padding_efficiency": round(s["padding_efficiency"], 4),
                "mean_fill": round(s["mean_fill"], 4),
                "recirculated": t.recirculated,
                "paced_rounds": t.paced_rounds,
                "max_age": t.max_age,
                "peak_buffer_bytes": t.peak_buffer_bytes,
            }
        )
    return {
        "steps": result.steps,
        "rounds": result.rounds,
        "tail_rounds": result.tail_rounds,
        "mean_target": round(sum(result.targets) / len(result.targets), 2) if result.targets else 0,
        "padding_efficiency": round(overall["padding_efficiency"], 4),
        "mean_fill": round(overall["mean_fill"], 4),
        "mean_group_size": round(overall["mean_group_size"], 2),
        "idle_steps": idle,
        "idle_fraction": round(idle / rank_steps, 4) if rank_steps else 0.0,
        "max_age": max(t.max_age for t in result.ranks),
        "recirculated": sum(t.recirculated for t in result.ranks),
        "per_rank": per_rank,
    }


def oracle(lengths: Sequence[int], budget: int, world_size: int) -> dict[str, float]:
    """Offline oracle: global sort + greedy token-budget groups over all samples, dealt
    to ``world_size`` ranks (steps = ceil(groups / W))."""
    items = [SizedSample(i, int(n)) for i, n in enumerate(lengths)]
    groups = [[it.length for it in g.items] for g in form_groups(items, TokenBudget(budget))]
    s = group_stats(groups, budget)
    steps = -(-len(groups) // world_size)
    return {
        "groups": len(groups),
        "steps": steps,
        "padding_efficiency": round(s["padding_efficiency"], 4),
        "mean_fill": round(s["mean_fill"], 4),
        "idle_steps": steps * world_size - len(groups),
    }


def standard(
    lengths: Sequence[int], budget: int, world_size: int, cutoff: int, seed: int = 0
) -> dict[str, float]:
    """Fixed-batch Standard: batch size ``budget // cutoff`` over the shuffled views."""
    bs = max(1, budget // cutoff)
    views = round_robin_views(len(lengths), world_size, seed)
    groups = [[int(lengths[i]) for i in v[k : k + bs]] for v in views for k in range(0, len(v), bs)]
    s = group_stats(groups, budget)
    steps = max(-(-len(v) // bs) for v in views)
    return {
        "batch_size": bs,
        "steps": steps,
        "padding_efficiency": round(s["padding_efficiency"], 4),
        "mean_fill": round(s["mean_fill"], 4),
    }
