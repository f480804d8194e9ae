"""What a batch is: the token budget, the one seam shared by ODB and every baseline.

A group of samples becomes one training step. Whether a group is allowed is decided
here and nowhere else, so that ODB, every baseline and the metrics agree on what "fits"
means (compare lhotse's ``SamplingConstraint``). Two cost models are offered:

* ``"padded"`` (default): the collated batch is padded to its longest sample, so a
  group costs ``max_len * n`` tokens of memory and compute.
* ``"packed"``: samples are concatenated without padding, so a group costs
  ``sum_len`` tokens.

An optional second budget caps the visual patches per group, because for multimodal
models the vision encoder's memory grows with patches, not with text tokens.

A sample that does not fit on its own (*oversize*) is never dropped: an empty group
admits anything, so it forms a singleton group. Callers count or reject oversize
samples with :meth:`TokenBudget.is_oversize`.

Everything here is pure and immutable, so it can be used in any process and hashed
into deterministic decisions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["CostModel", "GroupMeasure", "TokenBudget"]

# How a step's tokens are counted: "padded" (longest length x samples) or "packed" (sum).
CostModel = Literal["padded", "packed"]
_COST_MODELS: tuple[str, ...] = get_args(CostModel)


@dataclass(frozen=True)
class GroupMeasure:
    """Running size of a group: sample count, longest length, summed length and patches.

    The measure is all a :class:`~odb.TokenBudget` needs to price a group, so a group can be
    grown one sample at a time without keeping its samples around.

    Attributes:
        n: Number of samples in the group.
        max_len: Length of the longest sample (0 for an empty group).
        sum_len: Sum of the samples' lengths.
        patches: Sum of the samples' visual patches.

    Example:
        >>> GroupMeasure().plus(5).plus(3, patches=2)
        GroupMeasure(n=2, max_len=5, sum_len=8, patches=2)
    """

    n: int = 0
    max_len: int = 0
    sum_len: int = 0
    patches: int = 0

    @classmethod
    def of(cls, lengths: Iterable[int]) -> GroupMeasure:
        """Returns the measure of a group of samples of these lengths (no patches).

        Example:
            >>> GroupMeasure.of([4, 6, 2])
            GroupMeasure(n=3, max_len=6, sum_len=12, patches=0)
        """
        measure = cls()
        for length in lengths:
            measure = measure.plus(length)
        return measure

    def plus(self, length: int, patches: int = 0) -> GroupMeasure:
        """Returns the measure of this group with one more sample.

        Args:
            length: Length of the added sample in tokens.
            patches: Visual patches of the added sample.

        Returns:
            A new measure; ``self`` is unchanged.

        Example:
            >>> GroupMeasure(n=1, max_len=4, sum_len=4).plus(6).max_len
            6
        """
        return GroupMeasure(
            n=self.n + 1,
            max_len=max(self.max_len, length),
            sum_len=self.sum_len + length,
            patches=self.patches + patches,
        )


def _check_positive_int(name: str, value: object, hint: str) -> None:
    # bool is an int subclass; True as a budget is always a bug, never "1 token".
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}); {hint}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}; {hint}")


@dataclass(frozen=True)
class TokenBudget:
    """The memory budget of one step, and the rule that says whether a group fits it.

    Invariants: cost is monotone (adding a sample never lowers it), so every subset of
    a group that fits also fits; and an empty group admits any sample, so no sample is
    ever refused a group (an oversize one becomes a singleton).

    Attributes:
        max_tokens: Largest allowed group cost in tokens (> 0).
        cost_model: ``"padded"`` prices a group at ``max_len * n``; ``"packed"`` at
            ``sum_len``.
        max_patches: Optional cap on the summed visual patches of a group (> 0), or
            ``None`` for no patch budget.

    Raises:
        TypeError: If ``max_tokens`` or ``max_patches`` is not an int (bools included).
        ValueError: If a budget is not positive or ``cost_model`` is unknown.

    Example:
        >>> budget = TokenBudget(max_tokens=14)
        >>> m = GroupMeasure().plus(5).plus(3)
        >>> budget.cost(m), budget.fits(m), budget.admits(m, 4)
        (10, True, False)
        >>> TokenBudget(14, cost_model="packed").admits(m, 4)
        True
    """

    max_tokens: int
    cost_model: CostModel = "padded"
    max_patches: int | None = None

    def __post_init__(self) -> None:
        _check_positive_int(
            "max_tokens", self.max_tokens, "set the token budget to a positive token count"
        )
        if self.cost_model not in _COST_MODELS:
            raise ValueError(
                f"cost_model must be one of {list(_COST_MODELS)}, got {self.cost_model!r}"
            )
        if self.max_patches is not None:
            _check_positive_int(
                "max_patches",
                self.max_patches,
                "set a positive patch count, or None for no patch budget",
            )

    def cost(self, m: GroupMeasure) -> int:
        """Returns the cost of a group in tokens under this budget's cost model.

        Example:
            >>> TokenBudget(100).cost(GroupMeasure(n=3, max_len=7, sum_len=15))
            21
        """
        if self.cost_model == "padded":
            return m.max_len * m.n
        return m.sum_len

    def fits(self, m: GroupMeasure) -> bool:
        """Returns whether a group is within the token budget and the patch budget.

        Example:
            >>> TokenBudget(20, max_patches=4).fits(GroupMeasure(2, 5, 9, patches=5))
            False
        """
        if self.cost(m) > self.max_tokens:
            return False
        return self.max_patches is None or m.patches <= self.max_patches

    def admits(self, m: GroupMeasure, length: int, patches: int = 0) -> bool:
        """Returns whether a group may take one more sample.

        An empty group admits anything: this is the oversize rule, so a sample that
        does not fit alone still forms a singleton group instead of being dropped.

        Example:
            >>> budget = TokenBudget(8)
            >>> budget.admits(GroupMeasure(), 50), budget.admits(GroupMeasure().plus(4), 5)
            (True, False)
        """
        return m.n == 0 or self.fits(m.plus(length, patches))

    def fill(self, m: GroupMeasure) -> float:
        """Returns cost / max_tokens: 1.0 is a full group; above 1 only when oversize.

        Example:
            >>> TokenBudget(8).fill(GroupMeasure().plus(3))
            0.375
        """
        return self.cost(m) / self.max_tokens

    def is_oversize(self, length: int, patches: int = 0) -> bool:
        """Returns whether a lone sample exceeds the budget (it will be a singleton).

        Example:
            >>> TokenBudget(8).is_oversize(9), TokenBudget(8).is_oversize(8)
            (True, False)
        """
        return not self.fits(GroupMeasure().plus(length, patches))
