"""The typed, validated configuration objects of the loaders.

Every knob of a loader is a field of a frozen dataclass, checked when the object is
built, so a bad setting fails at construction with a message that names the value and
says what to change. Nothing is read from the environment.

:class:`~odb.kit.LoaderConfig` holds the fields every loader of this project shares (ODB's and
the baselines' in ``baselines/``: budget, accumulation window, seed, workers, label
accounting, the private group's timeouts), validated once, here. :class:`~odb.ODBConfig`
adds what only ODB has. :meth:`LoaderConfig.from_options` builds any of them from a
loader's keyword options and names an unknown option by comparing it with the
fields. Pure: imports neither torch.distributed nor multiprocessing.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Literal, TypeVar

from odb.core.budget import CostModel, TokenBudget
from odb.core.checks import check_int, refuse_renamed

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

C = TypeVar("C", bound="LoaderConfig")


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_positive_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _check_bools(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise TypeError(f"{name} must be a bool, got {getattr(config, name)!r}")


@dataclass(frozen=True)
class LoaderConfig:
    """The fields every loader shares: ODB's (:class:`~odb.ODBConfig`) and the baselines'.

    Subclasses add their own fields and extend ``__post_init__``; the shared fields are
    declared and validated here only.

    Attributes:
        token_budget: Most tokens one step may cost (see the subclass's ``cost_model``).
        max_patches: Optional second budget on the visual patches of one step.
        grad_accum_steps: Micro-steps per optimizer step; the loss normalizer covers the
            global loss tokens of this whole gradient-accumulation window.
        seed: Seed of every per-epoch shuffle (``seed + epoch``).
        shuffle: Shuffle the dataset each epoch (seeded with ``seed + epoch``).
        num_workers: DataLoader worker processes that run the dataset.
        prefetch_factor: Items each worker keeps in flight (DataLoader semantics: single
            samples for ODB, batches for the baselines); None keeps PyTorch's default.
        length_key: Sample field whose length is the sample's length (when the loader is
            given no ``length_fn``).
        label_key: Field of the collated batch that holds the labels.
        ignore_index: Label value that carries no loss.
        shift_labels: Count loss tokens after the causal shift (``labels[..., 1:]``).
        align_timeout_s: Longest wait of one collective of the loader's private Gloo
            group. A peer that is gone or slower than this makes every rank raise
            instead of hanging.
        init_timeout_s: Longest wait for the private group's rendezvous.
        rendezvous_host: Address of rank 0 that peers can reach; None means rank 0's
            host name, or 127.0.0.1 when every rank runs on this host (the store then
            listens on loopback only; ``docs/reliability.md``).

    ``RENAMED_FIELDS`` (a class attribute) maps a field's former name to ``(new name,
    why)``. A former name is refused, whether given to the class or to a loader, with a
    message that names the new one; it is never accepted as an alias.

    Example:
        >>> LoaderConfig(token_budget=8192, grad_accum_steps=2).grad_accum_steps
        2
    """

    RENAMED_FIELDS: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({})

    token_budget: int
    max_patches: int | None = None
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

    def __new__(cls, *args: Any, **kwargs: Any) -> LoaderConfig:
        # The generated __init__ would refuse a former field name with Python's bare
        # "unexpected keyword argument"; checked first here, so the message names the
        # new field.
        _refuse_renamed(cls, kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        check_int("token_budget", self.token_budget, 1)
        # TokenBudget checks max_patches with its own message (the cost model is the
        # subclass's, checked there).
        TokenBudget(self.token_budget, "padded", self.max_patches)
        _check_bools(self, ("shuffle", "shift_labels"))
        check_int("grad_accum_steps", self.grad_accum_steps, 1)
        check_int("seed", self.seed, 0)
        check_int("num_workers", self.num_workers, 0)
        if self.prefetch_factor is not None:
            check_int("prefetch_factor", self.prefetch_factor, 1)
            if self.num_workers == 0:
                raise ValueError(
                    "prefetch_factor needs num_workers > 0 (DataLoader semantics); "
                    "set num_workers or leave prefetch_factor=None"
                )
        check_int("ignore_index", self.ignore_index, -(2**62))
        _check_positive_seconds("align_timeout_s", self.align_timeout_s)
        _check_positive_seconds("init_timeout_s", self.init_timeout_s)
        for name in ("length_key", "label_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty str, got {getattr(self, name)!r}")

    @classmethod
    def from_options(
        cls: type[C],
        token_budget: int | None = None,
        config: C | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> C:
        """The config of a loader built from ``config=`` or from ``token_budget`` + options.

        A loader takes either a whole config or the budget and any other fields as
        keyword options; this is the one place that turns either into a config.
        Unknown options are found by comparing their names with the fields (closest
        field suggested), never by reading an exception's text.

        Args:
            token_budget: The budget, when no ``config`` is given.
            config: A whole config of this class.
            options: Other fields of this class, when no ``config`` is given.

        Raises:
            ValueError: Both or neither of ``config`` and ``token_budget`` given, or
                ``token_budget`` also among the options.
            TypeError: ``config`` is not a ``cls``, an option is a field's former name
                (the message names the new one, see ``RENAMED_FIELDS``), or an option
                is not a field of ``cls`` (the message names it and the closest field).

        Example:
            >>> ODBConfig.from_options(8192, options={"grad_accum_steps": 2}).grad_accum_steps
            2
            >>> ODBConfig.from_options(8192, options={"grad_acum_steps": 2})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            TypeError: unknown option 'grad_acum_steps' (did you mean 'grad_accum_steps'?); ...
        """
        options = dict(options or {})
        name = _public_name(cls)
        if config is not None:
            if token_budget is not None or options:
                raise ValueError(
                    f"give either config={cls.__name__}(...) or token_budget and options, not both"
                )
            if not isinstance(config, cls):
                raise TypeError(
                    f"config must be an instance of {name}, got {type(config).__name__}"
                )
            return config
        if token_budget is None:
            raise ValueError(
                "token_budget is required (the most tokens one step may cost), "
                "e.g. token_budget=8192"
            )
        if "token_budget" in options:
            raise ValueError("token_budget is given twice; pass it once, as token_budget=")
        _refuse_renamed(cls, options)
        fields = [f.name for f in dataclasses.fields(cls) if f.init]
        unknown = [key for key in options if key not in fields]
        if unknown:
            raise TypeError(_unknown_options(unknown, fields, name))
        return cls(token_budget=token_budget, **options)


def _public_name(cls: type) -> str:
    """``odb.ODBConfig``, ``baselines.BaselineConfig``: where users import it from."""
    return f"{cls.__module__.split('.')[0]}.{cls.__qualname__}"


def _refuse_renamed(cls: type[LoaderConfig], options: Mapping[str, Any]) -> None:
    """Raise for an option under a field's former name, naming the new name."""
    refuse_renamed(options, cls.RENAMED_FIELDS, "pass {new}={value!r} instead", error=TypeError)


def _unknown_options(unknown: list[str], fields: list[str], owner: str) -> str:
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, fields, n=1)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    noun = "option" if len(unknown) == 1 else "options"
    return (
        f"unknown {noun} {', '.join(named)}; valid options are the fields of {owner}: "
        f"{sorted(fields)}"
    )


@dataclass(frozen=True)
class ODBConfig(LoaderConfig):
    """Settings of one ODB loader: the shared :class:`~odb.kit.LoaderConfig` fields and these.

    What each field bounds is stated here; why the defaults are what they are, with
    the measurements, is in ``docs/benchmarks.md`` (grouping, "The buffer ramp", "The
    byte cap") and ``docs/reliability.md`` (start methods, timeouts); the symbols of
    ``docs/protocol.md`` are given in brackets.

    Attributes:
        cost_model: ``"padded"`` (``max_len * n``, what a padded batch costs) or
            ``"packed"`` (``sum(len)``, for a varlen/packed model path).
        policy: Target rule of the alignment protocol: ``"balanced"`` or ``"paper"``.
        join: True: every rank takes part until every rank is exhausted (identity
            coverage). False: the epoch ends when the first rank runs dry; what is left
            is carried into the next epoch (quota closure).
        buffer_budgets: Size of the grouping buffer in budgets' worth of tokens
            (``K``): the collate side reads until its buffer holds this many.
        initial_buffer_budgets: The buffer's size in an epoch's first round (``K0``);
            round ``k`` reads up to ``min(buffer_budgets, initial_buffer_budgets *
            2**k)`` budgets, and while the buffer grows each round emits one step.
            Equal to ``buffer_budgets``: the whole buffer is read before the first
            round.
        buffer_bytes: Most bytes of sample data (tensors and arrays) the buffer and the
            batches the trainer has not freed yet hold together (``M``); at the cap the
            buffer reads one sample at a time, so it holds at most this plus one
            sample. The DataLoader workers' prefetched samples are not counted. Lower
            it on hosts with many ranks and little RAM.
        buffer_size: Most samples the buffer holds per rank, samples read ahead
            included (``B``).
        queue_depth: Aligned steps that may wait for the trainer (the output queue,
            ``Q``).
        max_round_steps: The most steps one alignment round may emit (``T <= this``);
            None: ``queue_depth``. At most ``queue_depth``.
        age_limit: Rounds after which a waiting sample is emitted before fuller groups.
        oversize: What a sample longer than the budget does: ``"singleton"`` (own group,
            counted in the metrics) or ``"error"`` (raise).
        collate_mode: ``"process"`` (a dedicated collate process per rank) or
            ``"thread"`` (a thread in the trainer process; for debugging).
        collate_start_method: How a collate process starts; None: ``"fork"`` on Linux,
            ``"spawn"`` elsewhere (:attr:`collate_start`). ``"fork"``: it inherits the
            trainer's imports and collate spec, lets go of the trainer's sockets and signal
            handlers, runs torch on one thread, is retried if the interpreter deadlocks
            the fork (:mod:`odb._process.forking`), and must not use CUDA (what it keeps
            and resets: ``docs/reliability.md``).
            ``"spawn"`` / ``"forkserver"``: the dataset, ``collate_fn`` and
            ``length_fn`` must be picklable and the training script needs an
            ``if __name__ == "__main__":`` guard.
        shard: Who decides which samples a rank reads. ``"odb"``: every rank holds the
            same dataset (or global sampler) and ODB deals it. ``"rank"``: each rank's
            dataset or sampler is already its own (pre-sharded data, a
            ``DistributedSampler``); a stream is still split over workers by ODB.
            ``"worker"`` / ``"rank_worker"`` (streams): the stream splits itself over
            DataLoader workers / over ranks and workers. ``"auto"``: what the data
            declares, else ``"odb"`` for a map-style dataset without a sampler (sizes
            and orders are compared across ranks), else an error that asks
            (``docs/resume.md``, "Who shards").
        worker_start_method: How DataLoader workers start (``multiprocessing_context``);
            None: forked from a collate process where the platform can, else the
            trainer's start method.
        worker_timeout_s: DataLoader ``timeout`` for one sample from a worker; 0: none
            (the alignment timeouts still bound a stuck worker with more than one rank).
        pin_memory: Copy each batch into page-locked memory in the trainer before it is
            yielded (DataLoader semantics; a warning and no pinning without CUDA).
        start_timeout_s: Longest wait for a collate process to start and take its
            work (the start-up handshake); past it the loader raises instead of hanging.

    ODB's workers run in the collate side (``num_workers=0``: the collate side reads
    the dataset itself), and its ``align_timeout_s`` bounds one alignment collective.

    Example:
        >>> ODBConfig(token_budget=8192, policy="balanced").token_budget
        8192
    """

    RENAMED_FIELDS: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType(
        {
            old: (new, "the grouping buffer; 'window' names only the gradient-accumulation "
                  "window")
            for old, new in (
                ("window_budgets", "buffer_budgets"),
                ("initial_window_budgets", "initial_buffer_budgets"),
                ("window_bytes", "buffer_bytes"),
            )
        }
    )

    cost_model: CostModel = "padded"
    policy: Policy = "balanced"
    join: bool = True
    buffer_budgets: int = 64
    initial_buffer_budgets: int = 4
    buffer_bytes: int = 4 * 2**30
    buffer_size: int = 4096
    queue_depth: int = 8
    max_round_steps: int | None = None
    age_limit: int = 16
    oversize: OversizeRule = "singleton"
    collate_mode: CollateMode = "process"
    collate_start_method: StartMethod | None = None
    shard: Shard = "auto"
    worker_start_method: StartMethod | None = None
    worker_timeout_s: float = 0.0
    pin_memory: bool = False
    start_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _ = self.budget  # validates cost_model through TokenBudget
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("collate_mode", self.collate_mode, COLLATE_MODES)
        _check_choice("oversize", self.oversize, OVERSIZE_RULES)
        _check_choice("shard", self.shard, SHARD_CHOICES)
        for field in ("collate_start_method", "worker_start_method"):
            if getattr(self, field) is not None:
                _check_choice(field, getattr(self, field), START_METHODS)
        if (
            isinstance(self.worker_timeout_s, bool)
            or not isinstance(self.worker_timeout_s, (int, float))
            or not self.worker_timeout_s >= 0
        ):
            raise ValueError(
                f"worker_timeout_s must be a number of seconds >= 0, got {self.worker_timeout_s!r}"
            )
        _check_positive_seconds("start_timeout_s", self.start_timeout_s)
        _check_bools(self, ("join", "pin_memory"))
        check_int("buffer_budgets", self.buffer_budgets, 1)
        check_int("initial_buffer_budgets", self.initial_buffer_budgets, 1)
        check_int("buffer_bytes", self.buffer_bytes, 1)
        check_int("buffer_size", self.buffer_size, 1)
        check_int("queue_depth", self.queue_depth, 1)
        if self.max_round_steps is not None:
            check_int("max_round_steps", self.max_round_steps, 1)
            if self.max_round_steps > self.queue_depth:
                raise ValueError(
                    f"max_round_steps={self.max_round_steps} exceeds queue_depth="
                    f"{self.queue_depth}: a round's steps must fit the output queue; raise "
                    "queue_depth or lower max_round_steps"
                )
        check_int("age_limit", self.age_limit, 1)

    @property
    def collate_start(self) -> str:
        """How a collate process starts, ``collate_start_method`` or else fork on Linux.

        Elsewhere the platform's own default, spawn (macOS's system libraries are not
        fork-safe). Why fork is the default on Linux: ``docs/reliability.md``, "Soak".
        """
        if self.collate_start_method is not None:
            return self.collate_start_method
        return "fork" if sys.platform.startswith("linux") else "spawn"

    @property
    def round_step_cap(self) -> int:
        """The most steps one round may emit, ``max_round_steps`` or else ``queue_depth``."""
        return self.queue_depth if self.max_round_steps is None else self.max_round_steps

    @property
    def budget(self) -> TokenBudget:
        """The group-cost budget every group of this loader must satisfy."""
        return TokenBudget(self.token_budget, self.cost_model, self.max_patches)

    @property
    def buffer_tokens(self) -> int:
        """Tokens the grouping buffer aims to hold before groups are formed."""
        return self.buffer_budgets * self.token_budget
