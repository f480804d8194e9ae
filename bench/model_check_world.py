"""One round of ``W`` real ODB ranks as a pure transition, with the guarantees checked.

The model checker's step (``bench/model_check.py``): a state is every rank's round
state between two rounds (:class:`RankState`, a tuple, so it is its own canonical key);
a move is what every rank reads before its status (each read's length from a small
alphabet, or a stream's end). :func:`step` rebuilds each rank's real
:class:`odb.core.rounds.RankRounds` from its state, applies the reads with the calls the
round driver makes (``wants_read`` / ``add`` / ``mark_exhausted``, then ``status``),
gathers the statuses through their wire row and decides on every rank
(:class:`odb.core.lockstep.LockstepWorld`), collates the steps with the real
:class:`odb.core.steps.StepBuilder`, sums the :class:`odb.core.lockstep.RoundCounts` rows
(the all-reduce) and releases them through each rank's real
:class:`odb.core.loss.AccumulationNormalizer`, for ``G = 1`` and ``G = 2`` at once. At the
epoch's end a non-join view's carry is dealt with the real
:func:`odb._process.collate_epoch.deal_carry`. Nothing of the protocol is restated here
except the oracle :func:`bench.model_check_spec.expected_plan` (the plan as
``docs/protocol.md`` states it) and the invariants, which raise :class:`Violation`
naming the guarantee (G1-G5 of ``docs/protocol.md``, ``P`` the plan, ``B`` the token
budget, ``L`` the loss normaliser).

Samples carry their view position as their index (rank ``r``'s ``i``-th is
``r * INDEX_STRIDE + i``), their length as their data; a collated batch's labels are
the samples' tokens, padded with ``ignore_index``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from bench.model_check_spec import (
    Bounds,
    Violation,
    check_budget,
    check_end,
    check_plan,
    check_windows,
)
from odb._process.collate_epoch import deal_carry
from odb.core.config import ODBConfig
from odb.core.lockstep import LockstepRank, LockstepWorld, RoundCounts
from odb.core.metrics import EpochMetrics
from odb.core.rounds import RankRounds
from odb.core.steps import SampleMeter, SampleReader, StepBuilder

END = "end"
"""The read that finds a stream's end (the pull returned None)."""
INDEX_STRIDE = 1000
IDLE_LENGTH = 3
"""The sample IDLE steps are collated from (on a real rank: the first one it read)."""
WINDOWS = (1, 2)
"""Gradient-accumulation windows checked on every path at once."""

Reads = tuple  # lengths read this round, then possibly END


class RankState(NamedTuple):
    """One rank between two rounds; with its peers' states, the canonical key.

    ``view``: its view size, None for a stream whose end was not found yet.
    ``buffer``: ``(position, length, age)`` per buffered sample, in buffer order.
    ``held``: per window of :data:`WINDOWS`, the steps the normaliser holds, each
    ``(step, expected global loss tokens, reported global loss tokens)``.
    """

    view: int | None
    read: int
    tokens: int
    limit: int | None
    rounds: int
    steps: int
    buffer: tuple[tuple[int, int, int], ...]
    held: tuple[tuple[tuple[int, int, int], ...], ...]


@dataclass
class Stats:
    """What a search saw: transitions, ends, and the behaviours it reached."""

    transitions: int = 0
    epoch_ends: int = 0
    paced: int = 0
    split: int = 0
    idle: int = 0
    carried: int = 0
    max_round: int = 0


def start_states(bounds: Bounds) -> list[tuple[tuple[int | None, ...], tuple[RankState, ...]]]:
    """Every epoch start: each view size ``0..max_view`` per rank (a stream: unknown)."""
    empty = tuple(() for _ in WINDOWS)
    if bounds.stream:
        sizes_list = [(None,) * bounds.world]
    else:
        sizes_list = _products(range(bounds.max_view + 1), bounds.world)
    return [
        (sizes, tuple(RankState(n, 0, 0, None, 0, 0, (), empty) for n in sizes))
        for sizes in sizes_list
    ]


def _products(values: range, count: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for _ in range(count):
        out = [p + (v,) for p in out for v in values]
    return out


def rebuild(config: ODBConfig, rank: int, state: RankState, reads: Reads = ()) -> RankRounds:
    """The rank's real round state from ``state``, then ``reads`` applied.

    Raises:
        Violation: A read the rank would not make (its ``wants_read`` is False).
    """
    rounds = RankRounds.partway(
        config,
        state.view,
        read_count=state.read,
        read_tokens=state.tokens,
        read_limit=state.limit,
        rounds=state.rounds,
    )
    for pos, length, age in state.buffer:
        rounds.buffer.add(length, 0, _payload(rank, pos, length), age=age)
    for item in reads:
        if not rounds.wants_read():
            raise Violation("schedule", f"rank {rank} reads past what wants_read allows")
        if item == END:
            rounds.mark_exhausted()
            break
        rounds.add(item, 0, _payload(rank, rounds.read_count, item))
    return rounds


def _payload(rank: int, pos: int, length: int) -> tuple[int, int, int]:
    """What StepBuilder collates: ``(index, sample, length)``; the sample is its length."""
    return (rank * INDEX_STRIDE + pos, length, length)


def read_options(bounds: Bounds, config: ODBConfig, rank: int, state: RankState) -> list[Reads]:
    """Every read sequence the caps allow this round, shortest first.

    A rank reads while ``wants_read()``; it may stop earlier (any read count the caps
    allow) once its buffer holds a sample, never with an empty buffer it could fill
    (``docs/protocol.md``, G5: an empty buffer always reads). A stream of at most
    ``max_view`` samples may end at any read.
    """
    out: list[Reads] = []

    def walk(reads: Reads) -> None:
        rounds = rebuild(config, rank, state, reads)
        wants = rounds.wants_read()
        if not wants or (bounds.early_stop and len(rounds.buffer) > 0):
            out.append(reads)
        if not wants or (reads and reads[-1] == END):
            return
        if not bounds.stream or rounds.read_count < bounds.max_view:
            for length in bounds.lengths:
                walk(reads + (length,))
        if bounds.stream:
            out.append(reads + (END,))

    walk(())
    return out


class Outcome(NamedTuple):
    """A move's result: the next state (None at the epoch's end) and what it did."""

    state: tuple[RankState, ...] | None
    paced: bool
    split: bool
    idle: bool
    carried: bool


def step(
    bounds: Bounds, config: ODBConfig, state: Sequence[RankState], move: Sequence[Reads]
) -> Outcome:
    """One round of every rank: reads, status, gather, plan, steps, counts, windows.

    Raises:
        Violation: A guarantee fails in this round (or at the epoch's end it reaches).
    """
    try:
        return _step(bounds, config, state, move)
    except Violation:
        raise
    except Exception as exc:  # noqa: BLE001 - a crash of the core is a finding too
        raise Violation("crash", f"{type(exc).__name__}: {exc}") from exc


def _step(
    bounds: Bounds, config: ODBConfig, state: Sequence[RankState], move: Sequence[Reads]
) -> Outcome:
    world = len(state)
    ranks = [rebuild(config, r, s, m) for r, (s, m) in enumerate(zip(state, move, strict=True))]
    known = [_known(r, s, m) for r, (s, m) in enumerate(zip(state, move, strict=True))]
    statuses = [rr.status(config.queue_depth) for rr in ranks]
    lockstep = LockstepWorld([LockstepRank(rr, _no_pull, r) for r, rr in enumerate(ranks)])
    try:
        outcomes = lockstep.decide(statuses)
    except AssertionError as exc:
        raise Violation("G2", f"the ranks derived different plans: {exc}") from exc
    plan = outcomes[0].plan
    check_plan(bounds, config, statuses, plan, state[0].rounds)
    if plan.end:
        if any(o.steps.count or o.payloads for o in outcomes):
            raise Violation("G1", "a rank emitted steps in the round that ended the epoch")
        return _end(bounds, config, state, ranks, statuses)
    _check_pacing(config, plan, state, move, statuses, outcomes, ranks)
    built = [
        _builder(config, r, s, world).build(o)
        for r, (s, o) in enumerate(zip(state, outcomes, strict=True))
    ]
    counts = [len(b) for b in built]
    if set(counts) != {plan.target} or len({rr.rounds for rr in ranks}) != 1:
        raise Violation("G1", f"steps per rank {counts} with T = {plan.target}")
    expected = [0] * plan.target
    left = []
    for r, (rr, o, steps, s) in enumerate(zip(ranks, outcomes, built, statuses, strict=True)):
        left.append(rr.buffer.drain())
        after = {payload[0] for *_, payload in left[-1]}
        _check_steps(config, r, steps, o, set(known[r]), after, s, state[r])
        for j, st in enumerate(steps):
            expected[j] += sum(max(0, known[r][i] - 1) for i in st.info.sample_ids)
    rows = [
        RoundCounts(tuple(x.counts for x in steps), rr.read_count, rr.read_tokens).to_row()
        for rr, steps in zip(ranks, built, strict=True)
    ]
    if len({len(row) for row in rows}) != 1 or len(rows[0]) != 3 * plan.target + 2:
        raise Violation("G2", f"count rows of sizes {[len(x) for x in rows]}, T = {plan.target}")
    totals = RoundCounts.from_row([sum(col) for col in zip(*rows, strict=True)])
    reported = [t.loss_tokens for t in totals.steps]
    nxt = tuple(
        _next_state(
            state[r],
            ranks[r],
            left[r],
            plan.read_limit,
            plan.target,
            check_windows(
                world, state[r].held, state[r].steps, expected, reported, WINDOWS, end=False
            ),
        )
        for r in range(world)
    )
    return _outcome(nxt, plan, ranks, statuses, outcomes)


def _outcome(nxt, plan, ranks, statuses, outcomes) -> Outcome:
    """The next state, and whether the round paced, split or idled somewhere."""
    paced = any(rr.paced_rounds for rr in ranks)
    split = plan.split and any(
        len(o.steps.groups) > s.ready for o, s in zip(outcomes, statuses, strict=True)
    )
    idle = any(o.steps.idle for o in outcomes)
    return Outcome(nxt, paced, split, idle, False)


def _check_pacing(config, plan, state, move, statuses, outcomes, ranks) -> None:
    """Pacing ("One round", 4): only a rank that has read its view paces (join mode), and
    it emits every sample of the first ``k = Pace.take(...)`` ready groups it spreads
    (all of its first ``T`` when it is not paced)."""
    for r, (s, o, rr) in enumerate(zip(statuses, outcomes, ranks, strict=True)):
        if rr.paced_rounds and not (config.join and s.read_done and plan.pace is not None):
            raise Violation("G5", f"rank {r} paced itself before reading its view ({s})")
        if plan.pace is None or not s.read_done:
            continue
        k = min(plan.pace.take(s, plan.target), plan.target)
        again = rebuild(config, r, state[r], move[r])
        keys = [pos for pos, _, _ in state[r].buffer]
        keys += [state[r].read + i for i, x in enumerate(move[r]) if x != END]
        ready, _ = again.buffer.plan(False)  # read_done: every group is ready
        owed = {keys[item.key] for group in ready[:k] for item in group.items}
        sent = {p[0] % INDEX_STRIDE for p in _payloads(o)}
        if not owed <= sent:
            raise Violation(
                "G5", f"rank {r} spread its first {k} groups but kept {sorted(owed - sent)}"
            )


def _payloads(outcome) -> list:
    return [payload for group in outcome.payloads for payload in group]


def _no_pull() -> None:
    return None


def _builder(config: ODBConfig, rank: int, state: RankState, world: int) -> StepBuilder:
    metrics = EpochMetrics()
    reader = SampleReader(config, iter(()), SampleMeter(config), lambda: IDLE_LENGTH, metrics)
    builder = StepBuilder(config, collate, reader, metrics, epoch=0, rank=rank, world=world)
    builder.round, builder.step = state.rounds, state.steps
    return builder


_LABELS: dict[tuple[int, ...], torch.Tensor] = {}


def collate(samples: list[int]) -> dict[str, torch.Tensor]:
    """A padded batch's labels: one row of ``length`` real labels per sample."""
    key = tuple(samples)
    if key not in _LABELS:
        width = max(samples)
        rows = [[1] * n + [-100] * (width - n) for n in samples]
        _LABELS[key] = torch.tensor(rows, dtype=torch.int64)
    return {"labels": _LABELS[key]}


def _known(rank: int, state: RankState, reads: Reads) -> dict[int, int]:
    """Index -> length of every sample the rank holds once it has read ``reads``."""
    known = {rank * INDEX_STRIDE + pos: length for pos, length, _ in state.buffer}
    for i, item in enumerate(x for x in reads if x != END):
        known[rank * INDEX_STRIDE + state.read + i] = item
    return known


def _check_steps(config, rank, steps, outcome, before, after, status, state) -> None:
    """G3/G4 (identity), G5 (progress), B (budget) on one rank's steps of a round."""
    real = len(outcome.steps.groups)
    ids: list[int] = []
    for j, st in enumerate(steps):
        if j >= real:
            if st.info.sample_ids or not st.info.idle or st.counts.loss_tokens:
                raise Violation(
                    "G3",
                    f"rank {rank}'s IDLE step {st.info.step} carries ids "
                    f"{st.info.sample_ids} or loss tokens {st.counts.loss_tokens}",
                )
            continue
        if not st.info.sample_ids or st.info.idle:
            raise Violation("G3", f"rank {rank}'s real step {st.info.step} carries no ids")
        ids.extend(st.info.sample_ids)
    if len(set(ids)) != len(ids) or not set(ids) <= before:
        raise Violation(
            "G3", f"rank {rank} emitted {ids}: twice, or not buffered ({sorted(before)})"
        )
    if after != before - set(ids):
        lost = sorted(before - set(ids) - after)
        raise Violation("G3", f"rank {rank} lost samples {lost} (neither emitted nor buffered)")
    for group in outcome.steps.groups:
        check_budget(config, rank, [item.length for item in group.items])
    if outcome.steps.idle and after:
        raise Violation("G5", f"rank {rank} idles while holding samples {sorted(after)}")
    if not status.dry and not ids:
        held_back = not config.join and status.buffered == 0 and status.read_count == state.limit
        if not held_back:
            raise Violation("G5", f"active rank {rank} emitted no real sample (status {status})")


def _next_state(
    state: RankState, rounds: RankRounds, left: list, limit: int | None, target: int, held
) -> RankState:
    buffer = tuple((payload[0] % INDEX_STRIDE, length, age) for length, _, age, payload in left)
    return RankState(
        rounds.view_size,
        rounds.read_count,
        rounds.read_tokens,
        limit,
        rounds.rounds,
        state.steps + target,
        buffer,
        held,
    )


def _end(bounds: Bounds, config: ODBConfig, state, ranks, statuses) -> Outcome:
    """The epoch's end: G1-G5 at the end, the last windows, the carry and its deal."""
    world = len(state)
    for s in state:
        check_windows(world, s.held, s.steps, [], [], WINDOWS, end=True)
    carries = check_end(bounds, config, state, ranks, statuses)
    carried = any(carries)
    if carries is not None and not bounds.stream and not config.join and world > 1:
        gathered = [[r * INDEX_STRIDE + pos for pos in c] for r, c in enumerate(carries)]
        dealt = [deal_carry(gathered, r) for r in range(world)]
        if sorted(i for d in dealt for i in d) != sorted(i for g in gathered for i in g):
            raise Violation(
                "G4", f"the deal lost or repeated carried samples: {gathered} -> {dealt}"
            )
        sizes = [len(d) for d in dealt]
        if max(sizes) - min(sizes) > 1:
            raise Violation("G4", f"dealt carries of sizes {sizes} (views would differ by > 2)")
    return Outcome(None, False, False, False, carried)
