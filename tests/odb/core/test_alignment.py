"""Unit tests of odb.core.alignment: the status wire format, plan_round and local_steps.

The expected targets are recomputed here from the spec's formulas (SPEC §2.3), not
from the code under test.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from odb.core.alignment import (
    PACE_FLOOR,
    STATUS_WIDTH,
    LocalSteps,
    Pace,
    RankStatus,
    RoundPlan,
    local_steps,
    plan_round,
)
from odb.core.budget import TokenBudget
from odb.core.grouping import Group, SizedSample, form_groups

EXAMPLES = settings(max_examples=300, deadline=None)
INT64 = st.integers(0, 2**63 - 1)


def status(ready=1, buffered=1, read_done=False, read_count=0, free_slots=4, failed=False):
    return RankStatus(ready, buffered, read_done, read_count, free_slots, failed)


@st.composite
def statuses(draw, min_size=1, max_size=5, failed=False, dry=True):
    """Consistent rank statuses: ready <= buffered, read_count >= buffered."""
    out = []
    for _ in range(draw(st.integers(min_size, max_size))):
        buffered = draw(st.integers(0, 12))
        ready = draw(st.integers(0, buffered))
        read_done = draw(st.booleans())
        if not dry and read_done and buffered == 0:
            buffered = ready = 1
        read_count = buffered + draw(st.integers(0, 30))
        out.append(RankStatus(ready, buffered, read_done, read_count, draw(st.integers(0, 8)),
                              draw(st.booleans()) if failed else False))
    return out


def plan(sts, policy="balanced", join=True, max_steps=8, buffer_size=16):
    return plan_round(sts, policy=policy, join=join, max_steps=max_steps,
                      buffer_size=buffer_size)


# ---------------------------------------------------------------- RankStatus


@EXAMPLES
@given(INT64, INT64, st.booleans(), INT64, INT64, st.booleans(), INT64, INT64,
       st.integers(-1, 2**63 - 1))
def test_status_row_round_trip(ready, buffered, read_done, read_count, free_slots, failed,
                               buffered_tokens, read_tokens, unread):
    s = RankStatus(ready, buffered, read_done, read_count, free_slots, failed,
                   buffered_tokens, read_tokens, unread)
    row = s.to_row()
    assert len(row) == STATUS_WIDTH == 8
    assert all(type(v) is int for v in row)
    assert RankStatus.from_row(row) == s
    wire = torch.tensor(row, dtype=torch.int64)
    assert wire.numel() * wire.element_size() == 64
    assert RankStatus.from_row(wire.tolist()) == s
    assert RankStatus.from_row(list(wire)) == s  # 0-d tensors decode too


def test_status_row_width_does_not_grow_with_the_buffer():
    small = status(ready=1, buffered=1).to_row()
    huge = status(ready=10**9, buffered=10**12, read_count=10**15).to_row()
    assert len(small) == len(huge) == STATUS_WIDTH


@pytest.mark.parametrize("width", [0, 6, 7, 9])
def test_status_from_row_rejects_other_widths(width):
    with pytest.raises(ValueError, match=f"{STATUS_WIDTH} fields, got {width}"):
        RankStatus.from_row([0] * width)


def test_status_dry():
    assert status(buffered=0, ready=0, read_done=True).dry
    assert not status(buffered=1, read_done=True).dry
    assert not status(buffered=0, ready=0, read_done=False).dry


# ---------------------------------------------------------------- plan_round: ending


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("policy", ["balanced", "paper"])
def test_failed_ranks_end_the_epoch(policy, join):
    sts = [status(), status(failed=True), status(), status(failed=True)]
    p = plan(sts, policy, join)
    assert p == RoundPlan(target=0, end=True, failed_ranks=(1, 3))


@pytest.mark.parametrize("policy", ["balanced", "paper"])
def test_join_ends_only_when_every_rank_is_dry(policy):
    dry = status(ready=0, buffered=0, read_done=True)
    assert plan([dry, dry, dry], policy, join=True) == RoundPlan(target=0, end=True)
    p = plan([dry, status(ready=2, buffered=3), dry], policy, join=True)
    assert not p.end and p.target >= 1 and p.read_limit is None


@pytest.mark.parametrize("policy", ["balanced", "paper"])
def test_non_join_ends_when_any_rank_is_dry(policy):
    dry = status(ready=0, buffered=0, read_done=True)
    busy = status(ready=5, buffered=9, read_count=20)
    assert plan([busy, dry, busy], policy, join=False) == RoundPlan(target=0, end=True)
    assert not plan([busy, busy], policy, join=False).end


@EXAMPLES
@given(statuses(), st.sampled_from(["balanced", "paper"]), st.booleans(),
       st.integers(1, 6), st.integers(1, 32))
def test_plan_bounds(sts, policy, join, max_steps, buffer_size):
    p = plan(sts, policy, join, max_steps, buffer_size)
    active = [s for s in sts if not s.dry]
    assert p.end == (not active or (not join and len(active) < len(sts)))
    if p.end:
        assert p.target == 0
        return
    assert 1 <= p.target <= max_steps
    if join:
        assert p.read_limit is None
    else:
        assert p.read_limit == min(s.read_count for s in sts) + buffer_size
        # No rank runs out of samples inside a round (unless one holds none at all).
        assert p.target <= max(1, min(s.buffered for s in sts))


# ---------------------------------------------------------------- plan_round: targets


def paper_formula(active):
    """SPEC §2.3: min(max ready, min positive free slots, min positive buffered)."""
    terms = [max(s.ready for s in active)]
    terms += [min(v) for v in ([s.free_slots for s in active if s.free_slots > 0],
                               [s.buffered for s in active if s.buffered > 0]) if v]
    return min(terms)


@EXAMPLES
@given(statuses(), st.integers(1, 6))
def test_paper_target_formula(sts, max_steps):
    p = plan(sts, "paper", True, max_steps)
    active = [s for s in sts if not s.dry]
    if not active:
        assert p.end
        return
    assert p.target == max(1, min(paper_formula(active), max_steps))
    assert p.split


def test_paper_target_examples():
    a = status(ready=3, buffered=10, free_slots=5)
    b = status(ready=7, buffered=9, free_slots=0)  # a full queue does not count
    assert plan([a, b], "paper").target == 5  # min(max ready 7, free 5, buffered 9)
    c = status(ready=0, buffered=2, free_slots=6)
    assert plan([a, b, c], "paper").target == 2  # the fewest buffered samples bound it
    empty = status(ready=0, buffered=0, read_done=False, free_slots=6)
    assert plan([a, b, empty], "paper").target == 5  # zero buffered is not "positive"
    assert plan([a, b], "paper", max_steps=3).target == 3  # the queue depth caps a round
    assert plan([status(ready=0, buffered=0, free_slots=0)], "paper").target == 1


@EXAMPLES
@given(statuses(dry=False), st.integers(1, 6))
def test_balanced_steady_state_takes_min_ready(sts, max_steps):
    sts = sts + [status(ready=3, buffered=4, read_done=False)]  # someone still reads
    p = plan(sts, "balanced", True, max_steps)
    assert p.target == max(1, min(min(s.ready for s in sts), max_steps))
    assert not p.split


@EXAMPLES
@given(statuses(), st.integers(1, 6))
def test_balanced_drain_takes_max_ready_with_split(sts, max_steps):
    sts = [RankStatus(s.ready, s.buffered, True, s.read_count, s.free_slots) for s in sts]
    p = plan(sts, "balanced", True, max_steps)
    active = [s for s in sts if s.buffered > 0]
    if not active:
        assert p.end
        return
    assert p.target == max(1, min(max(s.ready for s in active), max_steps))
    assert p.split


def test_balanced_ignores_dry_ranks():
    dry = status(ready=0, buffered=0, read_done=True)
    p = plan([dry, status(ready=4, buffered=6), status(ready=3, buffered=3)], "balanced")
    assert (p.target, p.split) == (3, False)
    done = [dry, status(ready=4, buffered=6, read_done=True),
            status(ready=2, buffered=2, read_done=True)]
    assert (plan(done, "balanced").target, plan(done, "balanced").split) == (4, True)


def test_non_join_target_is_capped_by_min_buffered():
    sts = [status(ready=2, buffered=2, read_done=True, read_count=5),
           status(ready=6, buffered=8, read_done=True, read_count=12)]
    p = plan(sts, "balanced", join=False, buffer_size=4)
    assert (p.target, p.split, p.read_limit) == (2, True, 5 + 4)
    p = plan(sts, "paper", join=False, buffer_size=4)
    assert (p.target, p.read_limit) == (2, 9)


def test_unknown_policy_raises():
    with pytest.raises(ValueError, match="'fair'"):
        plan([status()], "fair")


@EXAMPLES
@given(statuses(failed=True), st.sampled_from(["balanced", "paper"]), st.booleans(),
       st.integers(1, 6), st.integers(1, 32), st.randoms(use_true_random=False))
def test_plan_is_deterministic_and_order_free(sts, policy, join, max_steps, buffer_size, rnd):
    p = plan(sts, policy, join, max_steps, buffer_size)
    assert plan(list(sts), policy, join, max_steps, buffer_size) == p
    # Every rank decodes the same rows and so derives the same plan.
    rows = [s.to_row() for s in sts]
    assert plan([RankStatus.from_row(r) for r in rows], policy, join, max_steps, buffer_size) == p
    # The decision does not depend on rank order (only the failed ranks' ids do).
    shuffled = list(sts)
    rnd.shuffle(shuffled)
    q = plan(shuffled, policy, join, max_steps, buffer_size)
    assert (q.target, q.end, q.split, q.read_limit, len(q.failed_ranks)) == (
        p.target, p.end, p.split, p.read_limit, len(p.failed_ranks))


# ---------------------------------------------------------------- pacing


def known(ready, buffered_tokens, read_tokens, read_count, unread, buffered=None):
    """A join-mode status with a known view size (``unread >= 0``)."""
    buffered = ready if buffered is None else buffered
    return RankStatus(ready, buffered, unread == 0, read_count, 4, False,
                      buffered_tokens, read_tokens, unread)


def test_pace_only_in_join_mode_with_known_view_sizes():
    a = known(ready=10, buffered_tokens=1000, read_tokens=1500, read_count=15, unread=0)
    b = known(ready=8, buffered_tokens=800, read_tokens=500, read_count=5, unread=20)
    assert plan([a, b]).pace is not None
    assert plan([a, b], "paper").pace is not None
    assert plan([a, b], join=False).pace is None
    stream = RankStatus(3, 5, False, 5, 4, False, 300, 500, -1)  # a stream: size unknown
    assert plan([a, stream]).pace is None
    fresh = known(ready=0, buffered_tokens=0, read_tokens=0, read_count=0, unread=7)
    assert plan([a, fresh]).pace is None  # its unread tokens have no mean yet


def test_pace_estimates_remaining_steps():
    # Pooled tokens per ready group: (1000 + 800) / (10 + 8) = 100. Rank b reads samples
    # of 100 tokens on average (its own mean), 20 unread: 20 more steps.
    a = known(ready=10, buffered_tokens=1000, read_tokens=1500, read_count=15, unread=0)
    b = known(ready=8, buffered_tokens=800, read_tokens=500, read_count=5, unread=20)
    pace = plan([a, b]).pace
    assert pace.tokens_per_group == 100
    assert pace.remaining(a) == 10  # exact once the view is read
    assert pace.remaining(b) == 8 + 20
    assert pace.heaviest == 28


def test_pace_take_spreads_fewer_groups_over_the_round_only_once_read():
    pace = Pace(heaviest=Fraction(40), tokens_per_group=Fraction(100))

    def read(ready):
        return known(ready=ready, buffered_tokens=0, read_tokens=0, read_count=0, unread=0)

    assert pace.take(read(35), 8) == 7  # floor(8 * 35 / 40): one extra step this round
    assert pace.take(read(30), 8) == 6
    reading = known(ready=30, buffered_tokens=0, read_tokens=1, read_count=1, unread=3)
    assert pace.take(reading, 8) == 8  # still reading: its estimate is not exact
    assert pace.take(read(40), 8) == 8 and pace.take(read(41), 8) == 8  # not behind
    assert PACE_FLOOR * 40 == 30
    assert pace.take(read(29), 8) == 8  # too far behind: structural, no pacing
    assert pace.take(read(39), 1) == 1  # a step takes at least one group


@EXAMPLES
@given(st.integers(1, 200), st.integers(1, 200), st.integers(1, 8))
def test_pace_take_never_overtakes_the_heaviest_rank(g, e, target):
    """The heaviest rank has ``E >= T`` groups left (``T`` never exceeds its ready
    count) and takes ``T``; a paced rank takes ``k = floor(T g / E) < T`` of its ``g``:
    it is left with at most as many groups as the heaviest (G6), and it takes at
    least ``T g / E - 1``, so its remaining groups shrink in step with the heaviest's."""
    assume(e >= target)
    pace = Pace(heaviest=Fraction(e), tokens_per_group=Fraction(1))
    own = known(ready=g, buffered_tokens=0, read_tokens=0, read_count=0, unread=0)
    k = pace.take(own, target)
    assert 1 <= k <= target
    if k < target:  # paced
        assert PACE_FLOOR * e <= g < e and k <= g
        assert g - k <= e - target
        assert k > Fraction(target * g, e) - 1


@EXAMPLES
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5000), st.integers(1, 9000),
                          st.integers(1, 90), st.integers(0, 60)), min_size=1, max_size=6))
def test_pace_is_exact_and_only_read_ranks_behind_the_heaviest_are_paced(rows):
    sts = [known(*row) for row in rows]
    p = plan(sts)
    if p.end or p.pace is None:
        return
    # Exact rationals from the rows: a permutation of the ranks gives the same pace.
    assert plan(list(reversed(sts))).pace == p.pace
    assert plan([RankStatus.from_row(s.to_row()) for s in sts]).pace == p.pace
    active = [s for s in sts if not s.dry]
    assert p.pace.heaviest == max(p.pace.remaining(s) for s in active)
    assert p.target <= p.pace.heaviest
    for s in sts:
        take = p.pace.take(s, p.target)
        assert 1 <= take <= p.target
        if take < p.target:  # paced: read its view, behind the heaviest, not too far
            assert s.read_done and PACE_FLOOR * p.pace.heaviest <= s.ready < p.pace.heaviest


# ---------------------------------------------------------------- local_steps


@st.composite
def rank_groups(draw):
    """A rank's ready and waiting groups, formed from random items as the buffer does."""
    budget = TokenBudget(draw(st.integers(1, 40)), draw(st.sampled_from(["padded", "packed"])))
    b = budget.max_tokens
    lengths = draw(st.lists(st.integers(1, b) | st.integers(1, 2 * b), max_size=24))
    groups = form_groups([SizedSample(k, n) for k, n in enumerate(lengths)], budget)
    draw(st.randoms(use_true_random=False)).shuffle(groups)
    cut = draw(st.integers(0, len(groups)))
    return groups[:cut], groups[cut:], budget


def keys_of(groups):
    return [k for g in groups for k in g.keys]


@EXAMPLES
@given(rank_groups(), st.integers(1, 30), st.booleans())
def test_local_steps(case, target, split):
    ready, waiting, budget = case
    steps = local_steps(ready, waiting, target, split, budget)
    assert isinstance(steps, LocalSteps)
    assert steps.count == target and steps.idle >= 0
    emitted = keys_of(steps.groups)
    # Conservation: only samples this rank holds, none twice.
    assert not [k for k, c in Counter(emitted).items() if c > 1]
    assert set(emitted) <= set(keys_of(ready) + keys_of(waiting))
    for g in steps.groups:
        if g.size > 1:
            assert budget.fits(g.measure), f"group {g.keys} exceeds the budget"
    if len(ready) >= target:
        # Enough ready groups: the first T, untouched, and no IDLE.
        assert list(steps.groups) == list(ready[:target]) and steps.idle == 0
    total = len(keys_of(ready) + keys_of(waiting))
    if steps.idle:
        # IDLE only when the rank is out of samples (every sample it holds is emitted).
        assert sorted(emitted) == sorted(keys_of(ready) + keys_of(waiting))
    if split or not ready:
        assert steps.idle == max(0, target - total)
    else:
        assert steps.idle == max(0, target - len(ready) - len(waiting))


def test_local_steps_splits_largest_groups_within_budget():
    budget = TokenBudget(12)
    g = Group.of([SizedSample(0, 4), SizedSample(1, 3), SizedSample(2, 2)], complete=True)
    steps = local_steps([g], [], 3, True, budget)
    assert [x.keys for x in steps.groups] == [(0,), (2,), (1,)] and steps.idle == 0


def test_local_steps_without_split_keeps_groups_whole():
    budget = TokenBudget(12)
    full = Group.of([SizedSample(0, 4), SizedSample(1, 4), SizedSample(2, 4)], complete=True)
    tail = Group.of([SizedSample(3, 2), SizedSample(4, 2)], complete=False)
    steps = local_steps([full], [tail], 3, False, budget)
    # No split: both whole groups, then one IDLE step (out of groups, not of samples
    # it could emit whole).
    assert [x.keys for x in steps.groups] == [(0, 1, 2), (3, 4)] and steps.idle == 1
    steps = local_steps([], [tail], 1, False, budget)
    assert [x.keys for x in steps.groups] == [(3, 4)] and steps.idle == 0


def test_local_steps_idles_a_dry_rank():
    steps = local_steps([], [], 4, True, TokenBudget(8))
    assert steps == LocalSteps((), 4) and steps.count == 4
    assert local_steps([], [], 2, False, TokenBudget(8)).idle == 2


def test_local_steps_splits_to_singletons_then_idles():
    budget = TokenBudget(100)
    g = Group.of([SizedSample(k, 5) for k in range(3)], complete=False)
    steps = local_steps([g], [], 5, True, budget)
    assert sorted(keys_of(steps.groups)) == [0, 1, 2]
    assert all(x.size == 1 for x in steps.groups) and steps.idle == 2


def test_local_steps_random_protocol_rounds_are_exact():
    """Seeded rounds through plan_round + local_steps: every rank yields exactly T."""
    rng = random.Random(7)
    budget = TokenBudget(32)
    for _ in range(200):
        world = rng.randint(1, 4)
        per_rank = []
        for _ in range(world):
            items = [SizedSample(k, rng.randint(1, 40)) for k in range(rng.randint(0, 10))]
            groups = form_groups(items, budget)
            cut = rng.randint(0, len(groups))
            per_rank.append((groups[:cut], groups[cut:], len(items)))
        sts = [RankStatus(len(r), n, rng.random() < 0.5, n, rng.randint(0, 4))
               for r, _, n in per_rank]
        for policy in ("balanced", "paper"):
            p = plan(sts, policy, join=True, max_steps=6)
            if p.end:
                continue
            for ready, waiting, n in per_rank:
                steps = local_steps(ready, waiting, p.target, p.split, budget)
                assert steps.count == p.target
                if steps.idle:
                    assert len(keys_of(steps.groups)) == n
