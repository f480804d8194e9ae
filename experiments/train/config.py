"""The train entry point's configuration: one frozen, validated object, section by section.

Every key is a typed field of a section dataclass below; an unknown key or a bad value
fails before any rank starts, naming the key and what to change. Pure: no torch, no I/O.
The YAML layers that compose one are read by `experiments.train.config_files`.

Example:
    >>> TrainConfig.from_dict({"run": {"out_dir": "r"}, "model": {"path": "m"},
    ...     "data": {"dataset": "ultrachat", "source": "d", "processor": "p"},
    ...     "validation": {"enabled": False}}).mode
    'full'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from experiments.data.records import DataConfig
from experiments.train.config_build import ConfigError, build, plain
from odb.kit import refuse_renamed

__all__ = [
    "LoraConfig",
    "MethodConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "StrategyConfig",
    "TrainConfig",
    "ValidationConfig",
]

FIXED_BATCH = ("standard", "sorted")  # the methods whose batch size derives from cutoff_len
MULTIMODAL = ("llava", "sharegpt4o", "mmmix")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class RunConfig:
    """Where a run writes and how it reports.

    Attributes:
        out_dir: Run folder: ``result.json``, ``final/``, ``checkpoints/``, logs.
        run_id: Name of the run in result files; None takes ``out_dir``'s name.
        seed: Seeds model init (random weights), the loaders' shuffles and torch.
        log_every: Optimizer steps between log lines (and loss-curve points' exchange).
        save_every: Optimizer steps between checkpoints; 0 saves only the final model.
        keep_checkpoints: Newest checkpoints kept; older ones are deleted.
        record_sample_ids: Write every step's sample ids per rank to
            ``samples_rank{r}.jsonl`` (exactly-once checks; small runs only).
        scale: Label of the scale the numbers are made at (``CPU-proxy``, ``paper``, ...).
    """

    out_dir: str
    run_id: str | None = None
    seed: int = 0
    log_every: int = 10
    save_every: int = 0
    keep_checkpoints: int = 2
    record_sample_ids: bool = False
    scale: str = "CPU-proxy"

    def __post_init__(self) -> None:
        _require(bool(self.out_dir), "run.out_dir must be set: the folder the run writes to")
        _require(self.seed >= 0, f"run.seed must be >= 0, got {self.seed}")
        _require(self.log_every >= 1, f"run.log_every must be >= 1, got {self.log_every}")
        _require(self.save_every >= 0, f"run.save_every must be >= 0 (0 = final only), "
                 f"got {self.save_every}")
        _require(self.keep_checkpoints >= 1,
                 f"run.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")

    @property
    def name(self) -> str:
        return self.run_id or Path(self.out_dir).name


@dataclass(frozen=True)
class ModelConfig:
    """Which Qwen3-VL to train.

    Attributes:
        init: ``pretrained`` loads ``path`` (a local folder such as the tiny CPU model in
            ``results/data/assets/model``, or a hub id such as
            ``Qwen/Qwen3-VL-2B-Instruct``); ``random`` builds ``architecture`` from its
            config with seeded random weights (no download: for throughput runs, whose
            speed does not depend on the weights' values).
        path: Folder or hub id (``init: pretrained``).
        architecture: ``qwen3-vl-2b``, ``qwen3-vl-8b`` (the real configs) or
            ``cpu-bench`` (a CPU-sized config whose step cost is per-token compute).
        dtype: Parameter and compute dtype: ``float32`` (CPU) or ``bfloat16`` (GPU).
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2`` (GPU).
        train_vision: Train the vision tower and merger too (full: their weights; LoRA:
            adapters on their linear layers). False freezes them, as LLaMA-Factory does
            by default.
        gradient_checkpointing: Recompute activations in backward to save memory.
    """

    init: Literal["pretrained", "random"] = "pretrained"
    path: str | None = None
    architecture: Literal["qwen3-vl-2b", "qwen3-vl-8b", "cpu-bench"] | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    train_vision: bool = False
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.init == "pretrained":
            _require(bool(self.path), "model.init=pretrained needs model.path (a folder or "
                     "hub id); or set model.init=random with model.architecture")
        else:
            _require(self.architecture is not None, "model.init=random needs "
                     "model.architecture (qwen3-vl-2b, qwen3-vl-8b or cpu-bench)")

    @property
    def name(self) -> str:
        if self.init == "random":
            return f"{self.architecture} (random init)"
        return str(self.path)


@dataclass(frozen=True)
class LoraConfig:
    """LoRA settings (``mode: lora``), passed to ``peft.LoraConfig``.

    Attributes:
        r: Adapter rank.
        alpha: Scaling numerator (``alpha / r``).
        dropout: Dropout on the adapter input.
        target_modules: Linear layer names of the language model that get adapters.
        vision_target_modules: Linear layer names of the vision tower and merger that get
            adapters when ``model.train_vision`` is true.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj")
    vision_target_modules: tuple[str, ...] = ("qkv", "proj", "linear_fc1", "linear_fc2")

    def __post_init__(self) -> None:
        _require(self.r >= 1, f"lora.r must be >= 1, got {self.r}")
        _require(self.alpha >= 1, f"lora.alpha must be >= 1, got {self.alpha}")
        _require(0.0 <= self.dropout < 1.0, f"lora.dropout must be in [0, 1), got {self.dropout}")
        _require(len(self.target_modules) > 0, "lora.target_modules must name at least one "
                 "linear layer (e.g. q_proj)")


@dataclass(frozen=True)
class MethodConfig:
    """The batching method and its loader settings.

    Attributes:
        name: ``standard``, ``sorted``, ``gmt``, ``bmt``, ``packing`` or ``odb``.
        token_budget: Tokens per step and rank (padded ``max_len * n`` except packing).
        length_cache: Length-cache file for the methods that plan from lengths (sorted,
            gmt, bmt, packing); None builds it in this run, timed and reported.
        num_workers: DataLoader worker processes running the preprocessing.
        odb: Further ``odb.ODBConfig`` fields (``policy``, ``join``, ``buffer_size``, ...),
            used when ``name`` is ``odb``.
        baseline: Further ``baselines.BaselineConfig`` fields (``batch_size``, ...), used
            by the other methods. Two sections, so that a layer switching the method
            does not inherit the previous method's settings.

    ``grad_accum_steps``, ``seed`` and ``cutoff_len`` come from the train, run and data
    sections and may not be set here.
    """

    name: Literal["standard", "sorted", "gmt", "bmt", "packing", "odb"] = "odb"
    token_budget: int = 8192
    length_cache: str | None = None
    num_workers: int = 0
    odb: Mapping[str, Any] = field(default_factory=dict)
    baseline: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from baselines.config import BaselineConfig
        from odb import ODBConfig

        _require(self.token_budget >= 1,
                 f"method.token_budget must be >= 1, got {self.token_budget}")
        _require(self.num_workers >= 0, f"method.num_workers must be >= 0, got "
                 f"{self.num_workers}")
        owned = {"grad_accum_steps": "optim.grad_accum_steps", "seed": "run.seed",
                 "cutoff_len": "data.cutoff_len", "token_budget": "method.token_budget",
                 "num_workers": "method.num_workers"}
        for section, cls in (("odb", ODBConfig), ("baseline", BaselineConfig)):
            known = {f.name for f in dataclasses.fields(cls)} - set(owned)
            for key in getattr(self, section):
                refuse_renamed([key], cls.RENAMED_FIELDS, "set that instead", error=ConfigError,
                               prefix=f"method.{section}.")  # fmt: skip
                _require(key not in owned, f"method.{section}.{key} is set by {owned.get(key)}; "
                         "set it there")
                _require(key in known, f"unknown key 'method.{section}.{key}'; "
                         f"{cls.__name__} fields: {sorted(known)}")
        _require(self.name in FIXED_BATCH or "batch_size" not in self.baseline,
                 f"method.baseline.batch_size means nothing to {self.name}, whose steps are "
                 "sized by method.token_budget; remove it")

    def loader_options(self, grad_accum_steps: int, seed: int, cutoff_len: int
                       ) -> dict[str, Any]:
        """Keyword options of ``baselines.build_loader`` for this method."""
        common = {"num_workers": self.num_workers, "grad_accum_steps": grad_accum_steps,
                  "seed": seed}
        if self.name == "odb":
            return {**self.odb, **common}
        if self.name in FIXED_BATCH:
            common["cutoff_len"] = cutoff_len  # batch size = token_budget // cutoff_len
        return {**self.baseline, **common}


@dataclass(frozen=True)
class StrategyConfig:
    """How ranks train together: the training strategy (``experiments/train/strategy.py``).

    Attributes:
        name: ``ddp`` (``DistributedDataParallel``), ``deepspeed`` (ZeRO) or ``fsdp``
            (torch FSDP2, ``fully_shard`` on every transformer block).
        zero_stage: DeepSpeed ZeRO stage (0-2; the paper used 2).
        backend: Process-group backend; ``auto`` takes NCCL on GPU, Gloo on CPU.
        device: ``cuda``: the run needs a GPU per local rank and refuses to start
            without (`experiments.train.hardware`); ``auto``: GPUs when visible, else CPU.
        find_unused_parameters: Force DDP's unused-parameter search. It is on anyway
            when the vision tower trains (a text-only batch leaves it unused).
        timeout_s: Trainer process-group timeout.

    Example:
        >>> StrategyConfig(name="deepspeed").zero_stage
        2
    """

    name: Literal["ddp", "deepspeed", "fsdp"] = "ddp"
    zero_stage: int = 2
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    device: Literal["auto", "cuda"] = "auto"
    find_unused_parameters: bool = False
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        _require(self.zero_stage in (0, 1, 2), f"strategy.zero_stage must be 0, 1 or 2, got "
                 f"{self.zero_stage} (stage 3 shards weights; its saving path is not here)")
        _require(self.timeout_s > 0, f"strategy.timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class OptimConfig:
    """Optimisation and schedule.

    Attributes:
        epochs: Passes over the training split.
        max_steps: Stop after this many optimizer steps (0: run every epoch). The
            schedule still spans ``epochs``.
        optimizer: ``adamw`` or ``sgd`` (plain; its update is ``-lr * grad``).
        lr: Peak learning rate.
        weight_decay: Decoupled weight decay (AdamW) / L2 (SGD).
        betas: AdamW betas.
        schedule: ``cosine``, ``linear`` (to ``min_lr_ratio``) or ``constant``.
        warmup_ratio: Fraction of training spent in linear warm-up.
        min_lr_ratio: Final learning rate over the peak.
        grad_accum_steps: Micro-steps per optimizer step.
        max_grad_norm: Gradient clipping norm; 0 disables clipping.
    """

    epochs: int = 1
    max_steps: int = 0
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.0
    grad_accum_steps: int = 1
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        _require(self.epochs >= 1, f"optim.epochs must be >= 1, got {self.epochs}")
        _require(self.max_steps >= 0, f"optim.max_steps must be >= 0, got {self.max_steps}")
        _require(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        _require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got "
                 f"{self.weight_decay}")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                 f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        _require(0 <= self.warmup_ratio < 1, f"optim.warmup_ratio must be in [0, 1), got "
                 f"{self.warmup_ratio}")
        _require(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got "
                 f"{self.min_lr_ratio}")
        _require(self.grad_accum_steps >= 1, f"optim.grad_accum_steps must be >= 1, got "
                 f"{self.grad_accum_steps}")
        _require(self.max_grad_norm >= 0, f"optim.max_grad_norm must be >= 0 (0 = off), got "
                 f"{self.max_grad_norm}")


@dataclass(frozen=True)
class ValidationConfig:
    """Validation loss at the end of training, on the held-out split.

    Attributes:
        enabled: Compute it (needs ``data.holdout_samples > 0``).
        token_budget: Tokens per validation batch; None takes ``method.token_budget``.
            The batching is the same for every method.
    """

    enabled: bool = True
    token_budget: int | None = None


@dataclass(frozen=True)
class TrainConfig:
    """One training run: every section validated, cross-section rules checked.

    ``RENAMED_SECTIONS`` (a class attribute) maps a section's former name to ``(new name,
    why)``. A former name is refused, in a YAML layer, an override or a mapping, with a
    message that names the new one; it is never accepted as an alias.

    Example:
        >>> TrainConfig.from_dict({"run": {"out_dir": "r"},
        ...     "model": {"path": "m"},
        ...     "data": {"dataset": "ultrachat", "source": "d", "processor": "p"},
        ...     "validation": {"enabled": False}}).method.name
        'odb'
    """

    RENAMED_SECTIONS: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({
        "engine": ("strategy", "how the model trains across processes, DDP or DeepSpeed; "
                   "'engine' now means only DeepSpeed's engine object"),
        "train": ("optim", "the optimiser and its schedule; 'train' names the package, the "
                  "whole run and the workflow's section"),
    })

    run: RunConfig
    model: ModelConfig
    data: DataConfig
    method: MethodConfig = field(default_factory=MethodConfig)
    mode: Literal["full", "lora"] = "full"
    lora: LoraConfig = field(default_factory=LoraConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)

    def __post_init__(self) -> None:
        if self.method.name == "packing":
            _require(self.data.dataset not in MULTIMODAL, f"method packing is text-only (as in "
                     f"the paper); data.dataset={self.data.dataset} has images: use ultrachat "
                     "or another method")
        if self.validation.enabled:
            _require(self.data.holdout_samples > 0, "validation.enabled needs a held-out "
                     "split: set data.holdout_samples > 0, or validation.enabled=false")
        _require(not self.data.holdout, "data.holdout=true would train on the held-out split; "
                 "leave it false (validation reads the held-out split itself)")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build from a nested mapping; unknown keys and bad types raise `ConfigError`."""
        if isinstance(data, Mapping):
            refuse_renamed_sections(data, "rename the key '{old}' to '{new}'")
        return build(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (JSON/YAML-safe), the form result files record."""
        return plain(dataclasses.asdict(self))


def refuse_renamed_sections(sections: Iterable[str], fix: str, **values: Any) -> None:
    """Raise for a section under its former name (``TrainConfig.RENAMED_SECTIONS``).

    ``fix`` says what to change where the name was found; it is formatted with ``old``,
    ``new`` and ``values``.
    """
    refuse_renamed(list(sections), TrainConfig.RENAMED_SECTIONS, fix, error=ConfigError,
                   **values)  # fmt: skip
