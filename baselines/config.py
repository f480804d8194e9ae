"""The one typed, validated configuration object shared by every baseline loader.

One dataclass for all five methods keeps the train entry point method-agnostic: a recipe
passes the same options to any method, and a method refuses the options that mean
nothing to it (``batch_size`` for a token-budgeted method) instead of ignoring them.
The fields every loader shares (budget, accumulation window, seed, workers, label
accounting, timeouts) are :class:`odb.kit.LoaderConfig`'s, declared and validated there
once.
Pure: imports neither torch.distributed nor multiprocessing.
"""

from __future__ import annotations

from dataclasses import dataclass

import odb
import odb.kit

__all__ = ["BaselineConfig"]


@dataclass(frozen=True)
class BaselineConfig(odb.kit.LoaderConfig):
    """Settings of one baseline loader: the shared :class:`odb.kit.LoaderConfig` fields and these.

    Attributes:
        cost_model: ``"padded"`` (``max_len * n``) or ``"packed"`` (``sum(len)``); None
            takes the method's own (``"packed"`` for Packing, ``"padded"`` otherwise).
            Token-budgeted methods (GMT, BMT, Packing) form groups within
            ``token_budget`` priced by it; fixed-batch methods (Standard, Sorted) derive
            their default batch size from the budget and count the steps that exceed it.
        batch_size: Fixed per-rank batch size of Standard and Sorted; None takes
            ``token_budget // cutoff_len``, the largest that never exceeds the budget at
            the cutoff length. Refused by the token-budgeted methods.
        cutoff_len: Longest sample the pipeline can produce (its cutoff); needed by
            Standard and Sorted when ``batch_size`` is None.

    The baselines exchange their step counts once per gradient-accumulation window;
    ``align_timeout_s`` bounds that exchange.

    Example:
        >>> BaselineConfig(token_budget=8192, cutoff_len=2048).token_budget
        8192
    """

    cost_model: odb.CostModel | None = None
    batch_size: int | None = None
    cutoff_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cost_model is not None:
            self.budget(self.cost_model)  # TokenBudget checks the cost model
        for name in ("batch_size", "cutoff_len"):
            if getattr(self, name) is not None:
                odb.kit.check_int(name, getattr(self, name), 1)

    def budget(self, default_cost_model: odb.CostModel) -> odb.TokenBudget:
        """The step budget, with ``default_cost_model`` when ``cost_model`` is None.

        Example:
            >>> BaselineConfig(token_budget=64).budget("packed").cost_model
            'packed'
        """
        return odb.TokenBudget(
            self.token_budget, self.cost_model or default_cost_model, self.max_patches
        )

    def fixed_batch_size(self) -> int:
        """Standard/Sorted batch size: ``batch_size``, else ``token_budget // cutoff_len``.

        Raises:
            ValueError: Neither is usable (no cutoff, or a cutoff above the budget).

        Example:
            >>> BaselineConfig(token_budget=8192, cutoff_len=2048).fixed_batch_size()
            4
        """
        if self.batch_size is not None:
            return self.batch_size
        if self.cutoff_len is None:
            raise ValueError(
                "a fixed-batch method needs batch_size, or cutoff_len to derive the "
                "largest batch that never exceeds token_budget at the cutoff; set one"
            )
        size = self.token_budget // self.cutoff_len
        if size < 1:
            raise ValueError(
                f"token_budget={self.token_budget} < cutoff_len={self.cutoff_len}: not even "
                "one sample at the cutoff fits; raise token_budget or set batch_size"
            )
        return size
