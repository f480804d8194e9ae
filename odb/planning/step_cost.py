"""A training step's time from the architecture, the GPU and the parallel strategy.

A step on one rank is a list of samples, each ``(length, patches per image)``. Its time:

    t = max over ranks of FLOPs(step) / (peak x PEAK_MFU)      compute
        + STEP_OVERHEAD_S                                       per-step fixed cost
        + communication(strategy, parameters, interconnect)     collectives, not overlapped
        + optimizer(bytes of its state / HBM bandwidth)

FLOPs (Kaplan et al. 2020, arXiv:2001.08361 Sec. 2.1: 2 N per token forward; backward
twice that; Narayanan et al. 2021, arXiv:2104.04473 Sec. 5.1: +1 forward when the
activations are recomputed): the decoder's matmuls ``2 x N_linear x tokens`` forward, a
padded row paying its padded length; causal attention ``2 x L^2 x heads x head_dim`` per
layer and row (its own segments in a packed row); the backward twice the forward (full
fine-tuning), once for the matmuls under LoRA (frozen weights get no weight gradient);
full gradient checkpointing adds a forward, selective (torchtitan's op-level) recomputes
no matmul. The vision tower: per image ``2 x N_vision x patches + 4 x depth x width x
patches^2`` forward (bidirectional attention over the image's own patches); frozen (the
default of LLaMA-Factory's ``freeze_vision_tower`` and of the artifact's runs) it runs
forward only. Communication and optimizer volumes: :mod:`odb.planning.hardware`.

Two constants are fitted, and only on the paper's UltraChat 8B pair (8x H20, ZeRO-2,
Standard 1.39 / ODB 0.78 s per sample per GPU; ``python -m bench.plan_heldout --fit``):
:data:`FITTED` = ``PEAK_MFU`` (the share of the dense peak the matmuls sustain) and
``STEP_OVERHEAD_S`` (seconds every step costs whatever it carries: launches, host work,
synchronisation). Together they are the achieved-throughput term: a step of ``F`` FLOPs
achieves ``F / (F / (peak x PEAK_MFU) + STEP_OVERHEAD_S)``, rising with the tokens it
carries towards ``PEAK_MFU`` (the Amdahl form of a fixed cost beside a sustained rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from odb.planning.hardware import OPTIMIZER_BYTES_PER_PARAM, Gpu, strategy
from odb.planning.models import Architecture

Sample = tuple[int, Sequence[int]]
"""``(length in tokens, vision patches of each image)``."""
Step = Sequence[Sample]
"""One rank's step; empty = an IDLE step (its collectives still run)."""
Schedule = Sequence[Sequence[Step]]
"""Every rank's steps, in order."""


@dataclass(frozen=True)
class Constants:
    """The model's only fitted numbers (see the module docstring)."""

    peak_mfu: float
    step_overhead_s: float

    def __post_init__(self) -> None:
        if not (0 < self.peak_mfu and self.step_overhead_s >= 0):
            raise ValueError(f"need peak_mfu > 0 and step_overhead_s >= 0, got {self}")


FITTED_NAMES = ("peak_mfu", "step_overhead_s")
# Made by `python -m bench.plan_heldout --fit` (the UltraChat proxy, 2,000 samples, seed 0);
# tests/bench/test_plan_heldout.py refits and checks these digits.
FITTED = Constants(peak_mfu=0.9872, step_overhead_s=0.1421)
FITTED_ON = (
    "the paper's UltraChat 200K, Qwen3-VL-8B full FT, 8x H20, ZeRO-2: Standard 1.39 "
    "and ODB (budget 12288) 0.78 s per sample per GPU, over the UltraChat proxy"
)


@dataclass(frozen=True)
class Setup:
    """What a run trains, on what, and how.

    Attributes:
        checkpointing: ``"full"`` (recompute every layer's forward: LLaMA-Factory's
            default), ``"selective"`` (no matmul recomputed) or ``"none"``.
        mode: ``"full"`` fine-tuning or ``"lora"`` (rank ``lora_rank`` on every matmul).
        packed: rows are packed (attention per segment, no padding).
    """

    arch: Architecture
    gpu: Gpu
    strategy: str = "zero2"
    world_size: int = 8
    gpus_per_node: int = 8
    mode: str = "full"
    checkpointing: str = "full"
    train_vision: bool = False
    lora_rank: int = 8
    packed: bool = False

    def __post_init__(self) -> None:
        strategy(self.strategy)
        if self.mode not in ("full", "lora"):
            raise ValueError(f"mode must be 'full' or 'lora', got {self.mode!r}")
        if self.checkpointing not in ("full", "selective", "none"):
            raise ValueError(
                f"checkpointing must be full, selective or none, got {self.checkpointing!r}"
            )
        if self.world_size < 1 or self.gpus_per_node < 1:
            raise ValueError(f"world_size and gpus_per_node must be >= 1, got {self}")

    def with_world(self, world_size: int) -> Setup:
        return replace(self, world_size=world_size)


def text_flops(setup: Setup, step: Step) -> float:
    """The decoder's training FLOPs for one rank's step."""
    arch = setup.arch
    if not step:
        return 0.0
    lengths = [n for n, _ in step]
    if setup.packed:
        tokens, square = sum(lengths), sum(n * n for n in lengths)
    else:
        tokens, square = max(lengths) * len(lengths), max(lengths) ** 2 * len(lengths)
    recompute = 1 if setup.checkpointing == "full" else 0
    linear_passes = (3 if setup.mode == "full" else 2) + recompute
    attention_passes = 3 + recompute
    linear = 2.0 * arch.text_linear_params * tokens
    attention = 2.0 * arch.layers * arch.heads * arch.head_dim * square
    return linear * linear_passes + attention * attention_passes


def vision_flops(setup: Setup, step: Step) -> float:
    """The vision tower's FLOPs for one rank's step (forward only when frozen)."""
    arch = setup.arch
    if arch.vision_depth == 0:
        return 0.0
    forward = 0.0
    for _, images in step:
        for p in images:
            forward += 2.0 * arch.vision_linear_params * p
            forward += 4.0 * arch.vision_depth * arch.vision_hidden * p * p
    if not setup.train_vision:
        return forward
    return forward * (3 + (1 if setup.checkpointing == "full" else 0))


def step_flops(setup: Setup, step: Step) -> float:
    return text_flops(setup, step) + vision_flops(setup, step)


def trainable_params(setup: Setup) -> int:
    arch = setup.arch
    if setup.mode == "lora":
        return arch.lora_params(setup.lora_rank)
    return arch.params if setup.train_vision else arch.text_params


def communication_seconds(setup: Setup) -> float:
    """One step's collectives (bf16), ring volumes, over NVLink within a node and the
    per-GPU network link across nodes; 0 on one GPU."""
    w = setup.world_size
    if w == 1:
        return 0.0
    passes = strategy(setup.strategy)
    trained = trainable_params(setup)
    gathered = setup.arch.params if passes["param_passes"] > 1 else trained
    volume = 2.0 * (passes["grad_passes"] * trained + passes["param_passes"] * gathered)
    link = setup.gpu.nvlink_gbps if w <= setup.gpus_per_node else setup.gpu.internode_gbps
    return volume * (w - 1) / w / (link * 1e9)


def optimizer_seconds(setup: Setup) -> float:
    """AdamW's update: its state read and written once at HBM bandwidth, on the rank's
    shard (ZeRO-2, FSDP) or the whole (DDP)."""
    shard = setup.world_size if strategy(setup.strategy)["optimizer_shard"] else 1
    return OPTIMIZER_BYTES_PER_PARAM * trainable_params(setup) / shard / (setup.gpu.hbm_gbps * 1e9)


@dataclass(frozen=True)
class Terms:
    """An epoch's time split into what the constants multiply: ``seconds = peak_s /
    peak_mfu + steps x step_overhead_s + physical_s``."""

    peak_s: float
    steps: int
    physical_s: float

    def seconds(self, constants: Constants) -> float:
        return (
            self.peak_s / constants.peak_mfu
            + self.steps * constants.step_overhead_s
            + self.physical_s
        )


def schedule_terms(setup: Setup, schedule: Schedule) -> Terms:
    """The :class:`Terms` of a schedule (ranks step together: a step lasts as long as its
    costliest rank's)."""
    steps = max((len(r) for r in schedule), default=0)
    peak = setup.gpu.bf16_tflops * 1e12
    compute = 0.0
    for k in range(steps):
        compute += max(step_flops(setup, r[k]) if k < len(r) else 0.0 for r in schedule)
    fixed = communication_seconds(setup) + optimizer_seconds(setup)
    return Terms(compute / peak, steps, steps * fixed)


@dataclass(frozen=True)
class StepModel:
    """The cost model of one setup: seconds per schedule, samples per second."""

    setup: Setup
    constants: Constants = FITTED

    def epoch_seconds(self, schedule: Schedule) -> float:
        return schedule_terms(self.setup, schedule).seconds(self.constants)

    def samples_per_s(self, schedule: Schedule) -> float:
        samples = sum(len(step) for rank in schedule for step in rank)
        return samples / self.epoch_seconds(schedule)

    def describe(self) -> str:
        s = self.setup
        return (
            f"{s.arch.name} {s.mode} on {s.world_size}x {s.gpu.name} ({s.strategy}, "
            f"checkpointing {s.checkpointing}); peak_mfu {self.constants.peak_mfu:g}, "
            f"step_overhead_s {self.constants.step_overhead_s:g}"
        )


def fit_constants(observations: Sequence[tuple[Terms, float]]) -> Constants:
    """Least squares for the two constants from ``(terms, measured seconds)`` pairs:
    ``measured - physical_s = peak_s x u + steps x o`` with ``u = 1 / peak_mfu``. With a
    negative overhead the fit is redone with ``o = 0``."""
    if len(observations) < 2:
        raise ValueError(
            f"need at least 2 timed observations to fit 2 constants, got {len(observations)}"
        )
    xs = [(t.peak_s, float(t.steps), y - t.physical_s) for t, y in observations]
    sxx = sum(a * a for a, _, _ in xs)
    sxs = sum(a * s for a, s, _ in xs)
    sss = sum(s * s for _, s, _ in xs)
    sxy = sum(a * y for a, _, y in xs)
    ssy = sum(s * y for _, s, y in xs)
    det = sxx * sss - sxs * sxs
    if det <= 1e-12 * max(sxx * sss, 1e-300):
        raise ValueError(
            "the observations do not separate compute from per-step cost: "
            "time steps of different sizes"
        )
    u = (sxy * sss - sxs * ssy) / det
    o = (sxx * ssy - sxs * sxy) / det
    if o < 0:
        u, o = sxy / sxx, 0.0
    if u <= 0:
        raise ValueError(
            f"the fit gives a non-positive compute term ({u}); the timings do not grow with FLOPs"
        )
    return Constants(peak_mfu=1.0 / u, step_overhead_s=o)
