"""Grouping a buffer of samples into budget-sized steps, and choosing which to emit.

Each round a rank turns its buffered samples into groups (one group = one step) with
:func:`form_groups`, orders the ready groups with :func:`emission_order`, and, under
the ``paper`` alignment policy, splits groups to reach a common step count with
:func:`split_to_count`. These functions are pure and deterministic so that they can be
unit-tested without processes, and so that every rank computing them on the same input
gets the same answer.

Why sort-then-greedy: under the padded cost (``max_len * n``) taking, from the longest
sample down, as many adjacent samples as the budget admits gives the minimum number of
groups over *all* partitions of the buffer (an exchange argument: the group holding the
longest sample can hold at most ``budget // longest`` samples, and giving it the next
longest ones never hurts the rest). The tests check this against brute force.

Invariants shared by all functions here:

* Conservation: the multiset of item keys that goes in is the one that comes out.
* Every group of two or more items satisfies ``budget.fits``; only a lone oversize item
  may exceed the budget (it is never dropped).
* Determinism: results depend on the items' values, never on the input order
  (ties are broken by ``key``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from odb.core.budget import GroupMeasure, TokenBudget

__all__ = [
    "Group",
    "SizedSample",
    "emission_order",
    "form_groups",
    "split_lighter",
    "split_to_count",
]


@dataclass(frozen=True)
class SizedSample:
    """One buffered sample as the grouper sees it.

    Attributes:
        key: Opaque identity chosen by the caller, unique within one call (e.g. the
            sample index or a buffer slot). Also the deterministic tie-breaker.
        length: Length in tokens (>= 1; visual tokens included).
        patches: Visual patches (>= 0), priced by the optional patch budget.
        age: Rounds this item has already waited in the buffer (>= 0).

    Raises:
        ValueError: If ``length < 1``, or ``patches`` or ``age`` is negative.

    Example:
        >>> SizedSample(key=7, length=512, patches=64)
        SizedSample(key=7, length=512, patches=64, age=0)
    """

    key: int
    length: int
    patches: int = 0
    age: int = 0

    def __post_init__(self) -> None:
        # A zero-length sample would make an infinite padded group; reject it loudly
        # rather than drop it.
        if self.length < 1:
            raise ValueError(
                f"SizedSample {self.key}: length must be >= 1, got {self.length}; "
                "filter empty samples out of the dataset or fix length_fn"
            )
        if self.patches < 0 or self.age < 0:
            raise ValueError(
                f"SizedSample {self.key}: patches and age must be >= 0, "
                f"got patches={self.patches}, age={self.age}"
            )


@dataclass(frozen=True)
class Group:
    """A group of items that becomes one step.

    Attributes:
        items: The items, longest first when built by :func:`form_groups`.
        measure: The group's :class:`~odb.core.budget.GroupMeasure` (consistent with items).
        complete: True when the group is as full as it can be: the next item in sort
            order did not fit, or no item of any length could be added (this includes
            an oversize singleton). False for a tail group that could still take more
            if more samples arrived.

    Example:
        >>> g = Group.of((SizedSample(1, 6), SizedSample(2, 4)), complete=True)
        >>> g.keys, g.size, g.fill(TokenBudget(16))
        ((1, 2), 2, 0.75)
    """

    items: tuple[SizedSample, ...]
    measure: GroupMeasure
    complete: bool

    def __post_init__(self) -> None:
        if not self.items:
            raise ValueError("a Group needs at least one item, got none")

    @classmethod
    def of(cls, items: Iterable[SizedSample], complete: bool) -> Group:
        """Builds a group from items, computing its measure.

        Example:
            >>> Group.of([SizedSample(1, 5), SizedSample(2, 3)], complete=False).measure.sum_len
            8
        """
        items = tuple(items)
        return cls(items, _measure(items), complete)

    @property
    def keys(self) -> tuple[int, ...]:
        """The items' keys, in item order."""
        return tuple(item.key for item in self.items)

    @property
    def size(self) -> int:
        """Number of items in the group."""
        return len(self.items)

    def fill(self, budget: TokenBudget) -> float:
        """Returns the group's cost as a fraction of the budget (see ``TokenBudget.fill``)."""
        return budget.fill(self.measure)


def form_groups(items: Sequence[SizedSample], budget: TokenBudget) -> list[Group]:
    """Groups items into as few budget-sized groups as sort-then-greedy allows.

    Items are sorted by length descending (ties by key), then, from the longest, each
    group takes as many adjacent items as ``budget.admits``. An item that does not fit
    alone forms a singleton. Under the padded cost model without a patch budget the
    number of groups is the minimum over all partitions.

    Invariants: items are conserved exactly; every multi-item group fits the budget;
    every group but possibly the last is ``complete``; the result depends only on the
    items' values, not their input order.

    Args:
        items: The buffered items; keys must be unique.
        budget: What a group may cost.

    Returns:
        The groups, longest first (items inside each group longest first too).

    Raises:
        ValueError: If two items share a key.

    Example:
        >>> samples = [SizedSample(0, 3), SizedSample(1, 9), SizedSample(2, 4), SizedSample(3, 2)]
        >>> groups = form_groups(samples, TokenBudget(max_tokens=12))
        >>> [(g.keys, g.complete) for g in groups]
        [((1,), True), ((2, 0, 3), True)]
    """
    _check_unique_keys(item.key for item in items)
    groups: list[Group] = []
    current: list[SizedSample] = []
    m = GroupMeasure()
    for item in _longest_first(items):
        if not budget.admits(m, item.length, item.patches):
            groups.append(Group(tuple(current), m, complete=True))
            current, m = [], GroupMeasure()
        current.append(item)
        m = m.plus(item.length, item.patches)
    if current:
        groups.append(Group(tuple(current), m, complete=_saturated(m, budget)))
    return groups


def split_lighter(
    groups: Sequence[Group], budget: TokenBudget, count: int, min_tokens: int
) -> list[Group]:
    """Splits each group on its own into lighter groups, at most ``count`` in all.

    Every group is regrouped by :func:`form_groups` under one common, smaller token
    budget: the smallest, down to ``min_tokens``, that keeps the total at most
    ``count`` (found by bisection). A group is split only into contiguous runs of its
    own length order, so no piece mixes lengths from different groups, and the pieces
    of a group together pad no more than the group did (each run's longest item is at
    most the group's).

    Args:
        groups: Groups that fit ``budget`` (e.g. from :func:`form_groups`).
        budget: Their budget; only its ``max_tokens`` is lowered.
        count: Most groups wanted.
        min_tokens: Lowest ``max_tokens`` to consider (``1 <= min_tokens``).

    Returns:
        The pieces, group by group in input order, each group's longest first. The
        input groups unchanged when no budget in range keeps the total at most
        ``count`` with fewer tokens, e.g. when ``count <= len(groups)``. Items are
        conserved and every multi-item piece fits ``budget``.

    Example:
        >>> g = Group.of([SizedSample(k, 4) for k in range(4)], complete=True)
        >>> [x.keys for x in split_lighter([g], TokenBudget(16), 2, 4)]
        [(0, 1), (2, 3)]
    """
    ordered = [_longest_first(g.items) for g in groups]

    def pieces(tokens: int) -> int:
        lighter = replace(budget, max_tokens=tokens)
        return sum(_count_groups(items, lighter) for items in ordered)

    lo, hi = min_tokens - 1, budget.max_tokens  # hi keeps the total <= count, or is full
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pieces(mid) <= count:
            hi = mid
        else:
            lo = mid
    if hi >= budget.max_tokens:
        return list(groups)
    lighter = replace(budget, max_tokens=hi)
    return [piece for g in groups for piece in form_groups(g.items, lighter)]


def emission_order(groups: Sequence[Group], budget: TokenBudget, age_limit: int) -> list[Group]:
    """Orders ready groups for emission: overdue first, then most real tokens first.

    Ranks, in order: groups holding an overdue item (``age >= age_limit``), oldest item
    first; then complete groups by real (unpadded) tokens descending; then incomplete
    groups likewise. Ties go to the group with the smallest key. Real tokens, not padded
    cost: a group of short samples always looks full by padded cost, so ordering by cost
    keeps emitting short groups while long samples wait until they are overdue and clog
    the buffer (the padding it costs: docs/benchmarks.md, "Emission order"). Emitting
    the first ``k`` groups each round bounds every item's wait: if at most ``k`` items
    arrive per round, no item waits more than ``age_limit`` rounds.

    Invariants: the result is a permutation of ``groups``, and it does not depend on the
    input order, so every rank computing it on the same groups gets the same order.

    Args:
        groups: Disjoint groups (keys unique across them).
        budget: The budget the groups were formed under (for fill).
        age_limit: Age in rounds (>= 0) at which an item becomes overdue.

    Returns:
        The same groups, in emission order.

    Raises:
        ValueError: If ``age_limit`` is negative or two groups share a key.

    Example:
        >>> budget = TokenBudget(10)
        >>> old = Group.of([SizedSample(0, 2, age=5)], complete=False)
        >>> full = Group.of([SizedSample(1, 5), SizedSample(2, 5)], complete=True)
        >>> [g.keys for g in emission_order([full, old], budget, age_limit=3)]
        [(0,), (1, 2)]
    """
    if isinstance(age_limit, bool) or not isinstance(age_limit, int) or age_limit < 0:
        raise ValueError(f"age_limit must be an int >= 0, got {age_limit!r}")
    _check_unique_keys(key for g in groups for key in g.keys)

    def rank(g: Group) -> tuple[int, int, int]:
        oldest = max(item.age for item in g.items)
        if oldest >= age_limit:
            return (0, -oldest, min(g.keys))
        # Exact integers, not float fill, so no rounding can make two ranks disagree.
        return (1 if g.complete else 2, -g.measure.sum_len, min(g.keys))

    return sorted(groups, key=rank)


def split_to_count(groups: Sequence[Group], target: int, budget: TokenBudget) -> list[Group]:
    """Splits groups until there are ``target`` of them (the ``paper`` policy's split).

    While there are fewer than ``target`` groups and some group has more than one item,
    peel the shortest item (ties: the largest key) off the largest group (most items;
    ties: the earliest) into a singleton appended at the end. Stops early when every
    group is a singleton, so the result has ``min(target, total items)`` groups when
    ``target >= len(groups)``, and the input groups unchanged otherwise.

    Invariants: items are conserved exactly; a subset of a fitting group fits, so every
    multi-item group still fits; group order is kept (new singletons go last). A group
    that lost an item is ``complete`` only if it still cannot take any item.

    Args:
        groups: Groups to split, e.g. from :func:`form_groups`.
        target: Wanted number of groups (>= 0).
        budget: The budget the groups were formed under (for ``complete``).

    Returns:
        A new list of groups.

    Raises:
        ValueError: If ``target`` is negative.

    Example:
        >>> g = Group.of([SizedSample(0, 4), SizedSample(1, 3), SizedSample(2, 2)], complete=True)
        >>> [x.keys for x in split_to_count([g], 3, TokenBudget(12))]
        [(0,), (2,), (1,)]
    """
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise ValueError(f"target must be an int >= 0, got {target!r}")
    result = list(groups)
    while len(result) < target:
        # max() returns the first maximal element, so ties go to the earliest group.
        j = max(range(len(result)), key=lambda i: result[i].size, default=None)
        if j is None or result[j].size == 1:
            break
        result[j], peeled = _peel_shortest(result[j], budget)
        result.append(peeled)
    return result


def _longest_first(items: Iterable[SizedSample]) -> list[SizedSample]:
    """The order :func:`form_groups` fills groups in: longest first, ties by key."""
    return sorted(items, key=lambda i: (-i.length, i.key))


def _count_groups(ordered: Sequence[SizedSample], budget: TokenBudget) -> int:
    """``len(form_groups(ordered, budget))`` for items already in ``_longest_first``
    order."""
    count, m = 0, GroupMeasure()
    for item in ordered:
        if not budget.admits(m, item.length, item.patches):
            count, m = count + 1, GroupMeasure()
        m = m.plus(item.length, item.patches)
    return count + (m.n > 0)


def _peel_shortest(group: Group, budget: TokenBudget) -> tuple[Group, Group]:
    shortest = min(group.items, key=lambda i: (i.length, -i.key))
    rest = tuple(item for item in group.items if item.key != shortest.key)
    rest_m = _measure(rest)
    single_m = GroupMeasure().plus(shortest.length, shortest.patches)
    return (
        Group(rest, rest_m, complete=_saturated(rest_m, budget)),
        Group((shortest,), single_m, complete=_saturated(single_m, budget)),
    )


def _saturated(m: GroupMeasure, budget: TokenBudget) -> bool:
    # Cost is monotone in length and patches, so if the cheapest possible item
    # (length 1, no patches) is refused, every item is: the group is as full as it gets.
    return not budget.admits(m, 1)


def _measure(items: Iterable[SizedSample]) -> GroupMeasure:
    m = GroupMeasure()
    for item in items:
        m = m.plus(item.length, item.patches)
    return m


def _check_unique_keys(keys: Iterable[int]) -> None:
    seen: set[int] = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"item keys must be unique within one call; key {key} repeats")
        seen.add(key)
