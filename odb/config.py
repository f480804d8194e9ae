"""The one typed, validated configuration object of an ODB loader.

Every knob of the loader is a field here, checked when the object is built, so a bad
setting fails at construction with a message that names the value and says what to
change. Nothing is read from the environment. Pure: imports neither torch.distributed
nor multiprocessing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from odb.budget import CostModel, TokenBudget

Policy = Literal["balanced", "paper"]
CollateMode = Literal["process", "thread"]
OversizeRule = Literal["singleton", "error"]
Shard = Literal["auto", "odb", "rank", "worker", "rank_worker"]
StartMethod = Literal["fork", "spawn", "forkserver"]

POLICIES: tuple[str, ...] = ("balanced", "paper")
COLLATE_MODES: tuple[str, ...] = ("process", "thread")
OVERSIZE_RULES: tuple[str, ...] = ("singleton", "error")
SHARD_CHOICES: tuple[str, ...] = ("auto", "odb", "rank", "worker", "rank_worker")
START_METHODS: tuple[str, ...] = ("fork", "spawn", "forkserver")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_positive_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


@dataclass(frozen=True)
class ODBConfig:
    """Settings of one ODB loader.

    Attributes:
        token_budget: Maximum cost of a multi-sample group, in tokens (see ``cost_model``).
        cost_model: ``"padded"`` (``max_len * n``, what a padded batch costs) or
            ``"packed"`` (``sum(len)``, for a varlen/packed model path).
        max_patches: Optional second budget on visual patches per group.
        policy: Target rule of the alignment protocol: ``"balanced"`` or ``"paper"``.
        join: True: every rank takes part until every rank is exhausted (identity
            coverage). False: the epoch ends when the first rank runs dry; what is left
            is carried into the next epoch (quota closure).
        grad_accum_steps: Micro-steps per optimizer step; the loss normalizer covers the
            global loss tokens of this whole window.
        seed: Seed of the per-epoch shuffle of the sampler views.
        shuffle: Shuffle the dataset each epoch (seeded with ``seed + epoch``).
        num_workers: DataLoader worker processes that run the dataset (0: in the
            collate side itself).
        prefetch_factor: Samples each worker keeps in flight (DataLoader semantics;
            None keeps PyTorch's default). Outstanding depth D = workers * factor.
        window_budgets: Size of the grouping window, in budgets' worth of tokens: the
            collate side keeps reading until its buffer holds this many budgets of tokens.
        buffer_size: Hard cap on buffered samples per rank (memory bound).
        queue_depth: Aligned steps that may wait for the trainer, and the most steps one
            alignment round may emit.
        age_limit: Rounds after which a waiting sample is emitted before fuller groups.
        oversize: What a sample longer than the budget does: ``"singleton"`` (own group,
            counted in the metrics) or ``"error"`` (raise).
        length_key: Sample field whose length is the sample's length (when the loader is
            given no ``length_fn``).
        label_key: Field of the collated batch that holds the labels.
        ignore_index: Label value that carries no loss.
        shift_labels: Count loss tokens after the causal shift (``labels[..., 1:]``).
        collate_mode: ``"process"`` (a dedicated collate process per rank) or
            ``"thread"`` (a thread in the trainer process; for debugging).
        align_timeout_s: Longest wait of one alignment collective. A peer that is gone
            or slower than this makes every rank raise instead of hanging.
        init_timeout_s: Longest wait for the alignment group's rendezvous.
        rendezvous_host: Address of rank 0 that peers can reach; None means rank 0's
            host name.
        shard: Who decides which samples a rank reads. ``"odb"``: every rank holds the
            same dataset (or global sampler) and ODB deals it. ``"rank"``: each rank's
            dataset or sampler is already its own (pre-sharded data, a
            ``DistributedSampler``); a stream is still split over workers by ODB.
            ``"worker"`` / ``"rank_worker"`` (streams): the stream splits itself over
            DataLoader workers / over ranks and workers. ``"auto"``: what the data
            declares, else ``"odb"`` for a map-style dataset without a sampler (sizes
            and orders are compared across ranks), else an error that asks.
        worker_start_method: How DataLoader workers start (``multiprocessing_context``);
            None: forked from a collate process where the platform can, else the
            trainer's start method.
        worker_timeout_s: DataLoader ``timeout`` for one sample from a worker; 0: none
            (the alignment timeouts still bound a stuck worker with more than one rank).
        pin_memory: Copy each batch into page-locked memory in the trainer before it is
            yielded (DataLoader semantics; a warning and no pinning without CUDA).
        start_timeout_s: Longest wait for a collate process to start and take its
            work (the start-up handshake); past it the loader raises instead of hanging.

    Example:
        >>> ODBConfig(token_budget=8192, policy="balanced").token_budget
        8192
    """

    token_budget: int
    cost_model: CostModel = "padded"
    max_patches: int | None = None
    policy: Policy = "balanced"
    join: bool = True
    grad_accum_steps: int = 1
    seed: int = 0
    shuffle: bool = True
    num_workers: int = 0
    prefetch_factor: int | None = None
    window_budgets: int = 64
    buffer_size: int = 4096
    queue_depth: int = 8
    age_limit: int = 16
    oversize: OversizeRule = "singleton"
    length_key: str = "input_ids"
    label_key: str = "labels"
    ignore_index: int = -100
    shift_labels: bool = True
    collate_mode: CollateMode = "process"
    align_timeout_s: float = 1800.0
    init_timeout_s: float = 300.0
    rendezvous_host: str | None = None
    shard: Shard = "auto"
    worker_start_method: StartMethod | None = None
    worker_timeout_s: float = 0.0
    pin_memory: bool = False
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        _check_int("token_budget", self.token_budget, 1)
        _ = self.budget  # validates cost_model and max_patches through TokenBudget
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("collate_mode", self.collate_mode, COLLATE_MODES)
        _check_choice("oversize", self.oversize, OVERSIZE_RULES)
        _check_choice("shard", self.shard, SHARD_CHOICES)
        if self.worker_start_method is not None:
            _check_choice("worker_start_method", self.worker_start_method, START_METHODS)
        if (
            isinstance(self.worker_timeout_s, bool)
            or not isinstance(self.worker_timeout_s, (int, float))
            or not self.worker_timeout_s >= 0
        ):
            raise ValueError(
                f"worker_timeout_s must be a number of seconds >= 0, got {self.worker_timeout_s!r}"
            )
        _check_positive_seconds("start_timeout_s", self.start_timeout_s)
        for name in ("join", "shuffle", "shift_labels", "pin_memory"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _check_int("grad_accum_steps", self.grad_accum_steps, 1)
        _check_int("seed", self.seed, 0)
        _check_int("num_workers", self.num_workers, 0)
        if self.prefetch_factor is not None:
            _check_int("prefetch_factor", self.prefetch_factor, 1)
            if self.num_workers == 0:
                raise ValueError(
                    "prefetch_factor needs num_workers > 0 (DataLoader semantics); "
                    "set num_workers or leave prefetch_factor=None"
                )
        _check_int("window_budgets", self.window_budgets, 1)
        _check_int("buffer_size", self.buffer_size, 1)
        _check_int("queue_depth", self.queue_depth, 1)
        _check_int("age_limit", self.age_limit, 1)
        _check_int("ignore_index", self.ignore_index, -(2**62))
        _check_positive_seconds("align_timeout_s", self.align_timeout_s)
        _check_positive_seconds("init_timeout_s", self.init_timeout_s)
        for name in ("length_key", "label_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty str, got {getattr(self, name)!r}")

    @property
    def budget(self) -> TokenBudget:
        """The group-cost budget every group of this loader must satisfy."""
        return TokenBudget(self.token_budget, self.cost_model, self.max_patches)

    @property
    def window_tokens(self) -> int:
        """Tokens the grouping window aims to hold before groups are formed."""
        return self.window_budgets * self.token_budget
