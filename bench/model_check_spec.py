"""What the model checker checks: the bounds of one search and the guarantees as stated.

Each check restates a sentence of ``docs/protocol.md`` and raises :class:`Violation`
with the guarantee's name: ``P`` (the plan of "One round", step 3), ``B`` (no step
over the token budget unless it is one oversize sample), ``L`` (the loss normaliser,
"Exact token-level loss"), ``G1``-``G5``. The round-by-round checks (identity,
progress) live with the transition, :mod:`bench.model_check_world`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from odb.core.alignment import RankStatus, RoundPlan
from odb.core.config import ODBConfig
from odb.core.loss import AccumulationNormalizer


class Violation(Exception):
    """A guarantee that failed: ``rule`` names it, the message says how."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule
        self.message = message


@dataclass(frozen=True)
class Bounds:
    """One search: a world, a mode, and how small everything is.

    Attributes:
        world: Ranks (``W``).
        join: Join mode (identity coverage) or non-join (quota closure).
        policy: ``"balanced"`` or ``"paper"``.
        stream: Views of unknown size whose end is found by reading (no pacing);
            False: views of known size ``0..max_view`` per rank (pacing in join mode).
        ramp: ``initial_buffer_budgets < buffer_budgets`` (the buffer ramp) or equal.
        max_view: Most samples of one rank's view (a stream's too).
        lengths: The length alphabet: short, medium, over the budget.
        token_budget, buffer_size, queue_depth, age_limit: ``ODBConfig`` fields.
        early_stop: A rank may stop reading at any read count the caps allow (once
            its buffer holds a sample); False: it reads while ``wants_read()``.
    """

    world: int
    join: bool
    policy: str
    stream: bool
    ramp: bool
    max_view: int
    lengths: tuple[int, ...] = (3, 5, 11)
    token_budget: int = 10
    buffer_size: int = 3
    queue_depth: int = 2
    age_limit: int = 2
    early_stop: bool = True

    def config(self) -> ODBConfig:
        """The loader settings every rank of the search runs with."""
        return ODBConfig(
            token_budget=self.token_budget,
            policy=self.policy,
            join=self.join,
            buffer_budgets=2,
            initial_buffer_budgets=1 if self.ramp else 2,
            buffer_size=self.buffer_size,
            queue_depth=self.queue_depth,
            age_limit=self.age_limit,
        )

    def label(self) -> str:
        mode = "join" if self.join else "nonjoin"
        source = "stream" if self.stream else "map"
        ramp = "on" if self.ramp else "off"
        reads = "any" if self.early_stop else "caps"
        return (
            f"W={self.world} {mode} {self.policy} {source} ramp={ramp} N={self.max_view} "
            f"B={self.buffer_size} lengths={list(self.lengths)} reads={reads}"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def expected_plan(
    config: ODBConfig, statuses: Sequence[RankStatus], round_index: int
) -> tuple[bool, int, bool, int | None]:
    """``(end, T, split, read_limit)`` as ``docs/protocol.md`` ("One round", 3) states it."""
    active = [s for s in statuses if not (s.read_done and s.buffered == 0)]
    if any(s.failed for s in statuses):
        return True, 0, False, None
    if not active or (not config.join and len(active) < len(statuses)):
        return True, 0, False, None
    ready = [s.ready for s in active]
    if config.policy == "paper":
        target, split = max(ready), True
        for field in ([s.free_slots for s in active], [s.buffered for s in active]):
            if any(v > 0 for v in field):
                target = min(target, min(v for v in field if v > 0))
    elif all(s.read_done for s in active):
        target, split = max(ready), True
    else:
        target, split = min(ready), False
    if not config.join:
        target = min(target, min(s.buffered for s in active))
    k_round = min(config.buffer_budgets, config.initial_buffer_budgets * 2**round_index)
    growing = k_round < config.buffer_budgets and not all(s.read_done for s in statuses)
    cap = 1 if growing else config.round_step_cap
    limit = None if config.join else min(s.read_count for s in statuses) + config.buffer_size
    return False, max(1, min(target, cap)), split, limit


def check_plan(
    bounds: Bounds,
    config: ODBConfig,
    statuses: Sequence[RankStatus],
    plan: RoundPlan,
    round_index: int,
) -> None:
    """P: the plan every rank derived is the documented one; ``1 <= T <= Q`` unless end."""
    end, target, split, limit = expected_plan(config, statuses, round_index)
    got = (plan.end, plan.target, plan.split, plan.read_limit)
    want = (end, target, split, limit) if not end else (True, 0)
    if (got if not end else got[:2]) != want:
        raise Violation("P", f"plan (end, T, split, read_limit) = {got}, documented {want}")
    if not plan.end and not 1 <= plan.target <= config.queue_depth:
        raise Violation("P", f"T = {plan.target} outside 1..Q = {config.queue_depth}")


def check_budget(config: ODBConfig, rank: int, lengths: Sequence[int]) -> None:
    """B: a step of two or more samples fits the token budget (padded: ``max * n``)."""
    if len(lengths) > 1 and max(lengths) * len(lengths) > config.token_budget:
        raise Violation(
            "B", f"rank {rank} emitted a step of lengths {list(lengths)} over {config.token_budget}"
        )


def check_windows(
    world: int,
    held: Sequence[Sequence[tuple[int, int, int]]],
    first: int,
    expected: Sequence[int],
    reported: Sequence[int],
    windows: Sequence[int],
    *,
    end: bool,
) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """L: each window of ``G`` steps is released whole, with its real loss tokens.

    Pushes the round's steps (``first``, ``first + 1``, ...; ``expected`` global loss
    tokens counted from the samples, ``reported`` what collective 2 summed) into a real
    :class:`odb.core.loss.AccumulationNormalizer` per window size, after the steps it
    held; at the epoch's end flushes it. Every released step must carry its window's
    real loss tokens over all ranks and the normaliser ``max(tokens, 1) / W``.

    Returns:
        What each normaliser holds afterwards (part of the next state).
    """
    out = []
    for k, window in enumerate(windows):
        norm = AccumulationNormalizer(window, world)
        pending = list(held[k])
        for item in held[k]:
            if norm.push(item, item[2]):
                raise Violation("L", f"a window of {window} released early")
        released = []
        for j, (exp, rep) in enumerate(zip(expected, reported, strict=True)):
            item = (first + j, exp, rep)
            pending.append(item)
            released.extend(norm.push(item, rep))
        if end:
            released.extend(norm.flush())
        _check_released(world, window, released, end)
        done = {item[0] for item, _, _ in released}
        out.append(tuple(item for item in pending if item[0] not in done))
    return tuple(out)


def _check_released(world: int, window: int, released: list, end: bool) -> None:
    groups: dict[int, list] = {}
    for item, tokens, normalizer in released:
        groups.setdefault(item[0] // window, []).append((item, tokens, normalizer))
    for w, members in groups.items():
        steps = sorted(item[0] for item, _, _ in members)
        real = sum(item[1] for item, _, _ in members)
        if steps != list(range(w * window, w * window + len(steps))) or (
            len(steps) != window and not end
        ):
            raise Violation("L", f"window {w} of {window} steps released as steps {steps}")
        for item, tokens, normalizer in members:
            if tokens != real or normalizer != max(real, 1) / world:
                raise Violation(
                    "L",
                    f"step {item[0]}: window tokens {tokens}, normaliser {normalizer}; "
                    f"real loss tokens over all ranks {real}, so {max(real, 1) / world}",
                )


def check_end(bounds: Bounds, config: ODBConfig, state, ranks, statuses) -> list[list[int]]:
    """G1-G5 when the epoch ends; returns each rank's carry (view positions; non-join).

    G5: rounds ``<= max_r |V_r| + 1`` (``|V_r|`` as read so far for an unended stream).
    G3 (join): the epoch ends only when every rank is dry, so with the per-round
    conservation every index of every view was emitted exactly once. G4 (non-join):
    some rank is dry; ``emitted + carry = |view|``; ``carry_r <= 2B + (n_r - n_d)``.
    """
    rounds = state[0].rounds
    if len({s.rounds for s in state}) != 1 or len({s.steps for s in state}) != 1:
        raise Violation(
            "G1",
            f"ranks end after rounds {[s.rounds for s in state]}, steps {[s.steps for s in state]}",
        )
    sizes = [r.view_size if r.view_size is not None else r.read_count for r in ranks]
    if rounds + 1 > max(sizes) + 1:
        raise Violation("G5", f"the epoch took {rounds + 1} rounds, views of {sizes}")
    carries = []
    for r, (rr, s) in enumerate(zip(ranks, statuses, strict=True)):
        left = [payload[0] % 1000 for payload in rr.leftover()]
        emitted = rr.read_count - len(left)
        if config.join:
            if not s.dry or emitted != rr.view_size:
                raise Violation(
                    "G3",
                    f"join epoch ended with rank {r} holding {left}, "
                    f"{emitted} of {sizes[r]} emitted",
                )
            carries.append([])
            continue
        unread = [] if rr.view_size is None else list(range(rr.read_count, rr.view_size))
        carry = left + unread
        if rr.view_size is not None and emitted + len(carry) != rr.view_size:
            raise Violation(
                "G4", f"rank {r}: emitted {emitted} + carry {len(carry)} != view {rr.view_size}"
            )
        carries.append(carry)
    if not config.join:
        dry = [n for n, s in zip(sizes, statuses, strict=True) if s.dry]
        if not dry:
            raise Violation("G4", "the non-join epoch ended with no rank dry")
        if not bounds.stream:
            for r, carry in enumerate(carries):
                bound = 2 * config.buffer_size + max(0, sizes[r] - max(dry))
                if len(carry) > bound:
                    raise Violation(
                        "G4", f"rank {r} carries {len(carry)} > 2B + (n_r - n_d) = {bound}"
                    )
    return carries
