"""The one typed, validated configuration object shared by every baseline loader.

One dataclass for all five methods keeps the train entry point method-agnostic: a recipe
passes the same options to any method, and a method refuses the options that mean
nothing to it (``batch_size`` for a token-budgeted method) instead of ignoring them.
Pure: imports neither torch.distributed nor multiprocessing.
"""

from __future__ import annotations

from dataclasses import dataclass

from odb.budget import CostModel, TokenBudget

__all__ = ["BaselineConfig"]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class BaselineConfig:
    """Settings of one baseline loader.

    Attributes:
        token_budget: The memory budget of one step, in tokens, priced by ``cost_model``.
            Token-budgeted methods (GMT, BMT, Packing) form groups within it;
            fixed-batch methods (Standard, Sorted) derive their default batch size from
            it and count the steps that exceed it.
        cost_model: ``"padded"`` (``max_len * n``) or ``"packed"`` (``sum(len)``); None
            takes the method's own (``"packed"`` for Packing, ``"padded"`` otherwise).
        max_patches: Optional second budget on visual patches per group.
        batch_size: Fixed per-rank batch size of Standard and Sorted; None takes
            ``token_budget // cutoff_len``, the largest that never exceeds the budget at
            the cutoff length. Refused by the token-budgeted methods.
        cutoff_len: Longest sample the pipeline can produce (its cutoff); needed by
            Standard and Sorted when ``batch_size`` is None.
        grad_accum_steps: Micro-steps per optimizer step; the loss normalizer covers the
            global loss tokens of this whole window.
        seed: Seed of every per-epoch shuffle (``seed + epoch``).
        shuffle: Shuffle each epoch. False gives a fixed order (Sorted: longest first).
        num_workers: DataLoader worker processes that run the dataset.
        prefetch_factor: Batches each worker keeps in flight (DataLoader semantics; None
            keeps PyTorch's default).
        length_key: Sample field whose length is the sample's realised length.
        label_key: Field of the collated batch that holds the labels.
        ignore_index: Label value that carries no loss.
        shift_labels: Count loss tokens after the causal shift (``labels[..., 1:]``).
        align_timeout_s: Longest wait of one count exchange between the ranks; a peer
            that is gone or slower makes every rank raise instead of hanging.
        init_timeout_s: Longest wait for the count group's rendezvous.
        rendezvous_host: Address of rank 0 that peers can reach; None: rank 0's host name.

    Example:
        >>> BaselineConfig(token_budget=8192, cutoff_len=2048).token_budget
        8192
    """

    token_budget: int
    cost_model: CostModel | None = None
    max_patches: int | None = None
    batch_size: int | None = None
    cutoff_len: int | None = None
    grad_accum_steps: int = 1
    seed: int = 0
    shuffle: bool = True
    num_workers: int = 0
    prefetch_factor: int | None = None
    length_key: str = "input_ids"
    label_key: str = "labels"
    ignore_index: int = -100
    shift_labels: bool = True
    align_timeout_s: float = 1800.0
    init_timeout_s: float = 300.0
    rendezvous_host: str | None = None

    def __post_init__(self) -> None:
        _check_int("token_budget", self.token_budget, 1)
        # TokenBudget validates cost_model and max_patches with its own messages.
        TokenBudget(self.token_budget, self.cost_model or "padded", self.max_patches)
        for name in ("batch_size", "cutoff_len", "prefetch_factor"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        _check_int("grad_accum_steps", self.grad_accum_steps, 1)
        _check_int("seed", self.seed, 0)
        _check_int("num_workers", self.num_workers, 0)
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError(
                "prefetch_factor needs num_workers > 0 (DataLoader semantics); "
                "set num_workers or leave prefetch_factor=None"
            )
        _check_int("ignore_index", self.ignore_index, -(2**62))
        for name in ("shuffle", "shift_labels"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("align_timeout_s", "init_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        for name in ("length_key", "label_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty str, got {getattr(self, name)!r}")

    def budget(self, default_cost_model: CostModel) -> TokenBudget:
        """The step budget, with ``default_cost_model`` when ``cost_model`` is None.

        Example:
            >>> BaselineConfig(token_budget=64).budget("packed").cost_model
            'packed'
        """
        return TokenBudget(
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
