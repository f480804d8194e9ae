""":func:`plan`: before training, what ODB gives on a dataset and which budget to choose."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from odb.core.checks import check_callables, check_int
from odb.core.config import ODBConfig
from odb.core.steps import SampleMeter
from odb.planning.advice import recommend, uniform_verdict, warnings_for
from odb.planning.forecast import StepCost, forecast_row, length_stats
from odb.planning.hardware import gpu as gpu_named
from odb.planning.measure import Measured, check_factory_result, measure, sample_indices
from odb.planning.model_forecast import probe_constants
from odb.planning.models import architecture
from odb.planning.probe import NO_CUDA, MemoryProbe, fit_step_cost
from odb.planning.report import PlanReport
from odb.planning.step_cost import FITTED_ON, Setup, StepModel

DEFAULT_WORLD_SIZES = (1, 2, 4, 8)
DEFAULT_SHORT_THRESHOLD = 256  # f_s: under 256 tokens, as the artifact's proxies count it


def plan(  # fmt: skip
    dataset: Any, *, budgets: Sequence[int] | None = None,
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES, cutoff: int | None = None,
    num_samples: int | None = 2000, num_workers: int = 0, time_limit_s: float = 300.0,
    step_cost: StepCost | None = None, short_threshold: int = DEFAULT_SHORT_THRESHOLD,
    length_fn: Callable[[Any], int] | None = None, patches_fn: Callable[[Any], int] | None = None,
    probe: MemoryProbe | Callable[[Any], Any] | None = None, progress: bool = True,
    config: ODBConfig | None = None, model: str | Path | None = None, gpu: str | None = None,
    strategy: str = "ddp", **options: Any,
) -> PlanReport:
    """Measure a seeded sample of ``dataset`` as the loader would, and forecast ODB.

    Every figure comes from the loader's own round protocol over the measured lengths:
    with the whole dataset measured, a row's steps and padding are the loader's, same
    seed. Speed-ups are estimates, their cost stated in the report's ``assumptions``.
    Arguments are checked before anything is read.

    Args:
        dataset: Map-style dataset; items as the loader reads them (model-ready dicts).
        budgets: Candidate token budgets; default powers of two from the cutoff up, x16.
        world_sizes: Numbers of ranks to forecast.
        cutoff: The longest a sample may be (the fixed-batch Standard's batch is
            ``budget // cutoff``); default the longest measured sample.
        num_samples: How many samples to measure (a seeded subset); None = all.
        num_workers: time_limit_s: DataLoader workers reading; reading stops after this.
        step_cost: ``t(step) = a + b * tokens`` (:class:`odb.planning.forecast.StepCost`).
        short_threshold: Length under which a sample counts as short (f_s).
        length_fn, patches_fn, config, options: As for :class:`odb.ODBLoader`
            (``token_budget`` is replaced by each candidate budget).
        probe: Your training step (``step(batch)``) or a :class:`~odb.planning.MemoryProbe`: on CUDA
            the largest budget whose worst batches fit memory is searched.
        progress: A progress line on stderr while reading.
        model: gpu: strategy: Time steps with :class:`~odb.planning.StepModel`: ``model`` a
            table name (``qwen3-vl-2b``, ``qwen3-vl-8b``, ``llama-3.1-8b``) or an HF
            ``config.json`` path; ``gpu`` ``a100``, ``h100``, ``h200`` or ``h20``;
            ``strategy`` ``ddp``, ``zero2`` or ``fsdp``. Both or neither of ``model`` and
            ``gpu``; without them the speed-up assumes a generic cost.
    """
    _check_args(world_sizes, num_samples, time_limit_s, short_threshold, cutoff, budgets)
    check_callables(length_fn=length_fn, patches_fn=patches_fn)
    memory_probe = MemoryProbe.of(probe)
    check_factory_result(dataset, "the dataset")
    setup = _setup(model, gpu, strategy)
    base = _base_config(config, options)
    indices = sample_indices(len(dataset), num_samples, base.seed)
    measured = measure(dataset, SampleMeter(base, length_fn, patches_fn), indices,
                       num_workers=num_workers, time_limit_s=time_limit_s,
                       progress=sys.stderr if progress else None)  # fmt: skip
    cutoff = max(measured.lengths) if cutoff is None else cutoff
    budgets = _budgets(budgets, cutoff)
    probed, fitted = _probe(dataset, measured, memory_probe, max(budgets))
    cost, source = _cost(step_cost, fitted, setup, probed, measured)
    rows = _rows(measured, base, budgets, world_sizes, cutoff, cost)
    return _report(measured, rows, short_threshold, cutoff, base, cost, source, probed)


def _setup(model: str | Path | None, gpu: str | None, strategy: str) -> Setup | None:
    if (model is None) != (gpu is None):
        raise ValueError(
            f"give model and gpu together (got model={model!r}, gpu={gpu!r}): "
            "the step-cost model needs both"
        )
    if model is None or gpu is None:
        return None
    return Setup(architecture(model), gpu_named(gpu), strategy)


def _cost(
    given: StepCost | None,
    fitted: StepCost | None,
    setup: Setup | None,
    probed: dict[str, Any] | None,
    measured: Measured,
) -> tuple[StepCost | StepModel, str]:
    """The step cost the forecast uses and where it comes from: the one given, else the
    step-cost model when a model and GPU are named (its constants refitted by the probe
    on CUDA), else the probe's linear fit, else the generic cost."""
    if given is None and setup is not None:
        return _model_cost(setup, probed, measured)
    return given or fitted or StepCost(), _cost_source(given, fitted)


def _model_cost(
    setup: Setup, probed: dict[str, Any] | None, measured: Measured
) -> tuple[StepModel, str]:
    """The architecture-based cost; its constants refitted from the probe's timings."""
    if probed is not None and probed.get("ran"):
        fitted = probe_constants(probed["tries"], max(measured.lengths), min(measured.lengths),
                                 setup)  # fmt: skip
        if fitted is not None:
            return StepModel(setup, fitted), "the step-cost model, constants fitted by the probe"
    return StepModel(setup), f"the step-cost model, constants fitted on {FITTED_ON}"


def _rows(
    measured: Measured,
    base: ODBConfig,
    budgets: Sequence[int],
    world_sizes: Sequence[int],
    cutoff: int,
    cost: StepCost | StepModel,
) -> list[dict[str, Any]]:
    return [
        forecast_row(measured.lengths, replace(base, token_budget=b), w, cutoff=cutoff,
                     step_cost=cost, nbytes=measured.nbytes, patches=measured.patches)
        for b in budgets
        for w in world_sizes
    ]  # fmt: skip


def _report(measured, rows, short_threshold, cutoff, base, cost, source, probed) -> PlanReport:
    stats = length_stats(measured.lengths, short_threshold, cutoff)
    return PlanReport(
        dataset_size=measured.dataset_size,
        measured=len(measured.lengths),
        seconds=round(measured.seconds, 2),
        stopped_by_time=measured.stopped_by_time,
        lengths=stats,
        rows=rows,
        recommendation=recommend(rows, None if probed is None else probed.get("safe_budget")),
        warnings=warnings_for(rows, stats) + _probe_warnings(probed),
        assumptions=_assumptions(measured, cost, base),
        step_cost=_cost_dict(cost, source),
        probe=probed,
        worth_it=uniform_verdict(rows, stats) is None,
        config={k: v for k, v in asdict(base).items() if k != "token_budget"},
    )


def _cost_dict(cost: StepCost | StepModel, source: str) -> dict[str, Any]:
    if isinstance(cost, StepModel):
        return {
            "model": cost.describe(),
            "peak_mfu": cost.constants.peak_mfu,
            "step_overhead_s": cost.constants.step_overhead_s,
            "source": source,
        }
    return {"a": cost.a, "b": cost.b, "source": source}


def _check_args(world_sizes, num_samples, time_limit_s, short_threshold, cutoff, budgets) -> None:
    if not world_sizes:
        raise ValueError("world_sizes is empty; give the numbers of ranks to plan for")
    for w in world_sizes:
        check_int("world_sizes item", w, 1)
    if num_samples is not None:
        check_int("num_samples", num_samples, 1)
    check_int("short_threshold", short_threshold, 1)
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0 seconds, got {time_limit_s}")
    if cutoff is not None:
        check_int("cutoff", cutoff, 1)
    if budgets is not None:
        _check_budgets(budgets)


def _base_config(config: ODBConfig | None, options: dict[str, Any]) -> ODBConfig:
    if config is not None and options:
        raise TypeError(f"give config or loader options, not both (options: {sorted(options)})")
    base = (
        config
        if config is not None
        else ODBConfig.from_options(options.pop("token_budget", 1), None, options)
    )
    # Measuring must not refuse a sample for the one budget the config names.
    return replace(base, oversize="singleton")


def _budgets(budgets: Sequence[int] | None, cutoff: int) -> list[int]:
    if budgets is None:
        first = 2 ** math.ceil(math.log2(cutoff))
        return [first * 2**k for k in range(5)]
    return sorted(set(budgets))


def _check_budgets(budgets: Sequence[int]) -> None:
    if not budgets:
        raise ValueError("budgets is empty; give candidate token budgets, or None")
    for b in budgets:
        check_int("budgets item", b, 1)


def _probe(
    dataset: Any, measured: Measured, probe: MemoryProbe | None, max_budget: int
) -> tuple[dict[str, Any] | None, StepCost | None]:
    """``(the probe's report, the step cost fitted from its timings)``."""
    if probe is None:
        return None, None
    if not torch.cuda.is_available():
        return {"ran": False, "reason": NO_CUDA}, None
    lengths = measured.lengths
    longest = measured.indices[max(range(len(lengths)), key=lengths.__getitem__)]
    shortest = measured.indices[min(range(len(lengths)), key=lengths.__getitem__)]
    result = probe.search(dataset[longest], max(lengths), dataset[shortest], min(lengths),
                          max_budget)  # fmt: skip
    fitted = fit_step_cost(result.tries)
    return {"ran": True, **asdict(result)}, None if fitted is None else StepCost(*fitted)


def _probe_warnings(probed: dict[str, Any] | None) -> list[str]:
    if probed is None:
        return []
    if not probed["ran"]:
        return [f"memory not probed: {probed['reason']}"]
    if probed["limit"] is None:
        return ["the probe found no budget that fits memory, down to its smallest step"]
    return []


def _cost_source(given: StepCost | None, fitted: StepCost | None) -> str:
    if given is not None:
        return "given"
    if fitted is not None:
        return "measured by the probe"
    return (
        f"{GENERIC}: a step's fixed cost = the work of 1000 tokens, whatever the model "
        "and GPU; give model= and gpu= for the step-cost model (docs/plan.md)"
    )


GENERIC = "generic cost, not your model or GPU"


def _cost_assumption(cost: StepCost | StepModel, base: ODBConfig) -> str:
    if isinstance(cost, StepModel):
        return (
            f"step time from the step-cost model: {cost.describe()}; the costliest "
            "rank's step; IDLE steps cost the per-step part (docs/plan.md)"
        )
    generic = f" ({GENERIC}: the speed-up assumes it)" if cost == StepCost() else ""
    return (
        f"step time = {cost.a:g} + {cost.b:g} x tokens of the costliest rank's step "
        f"({base.cost_model} cost); IDLE steps cost the fixed part {cost.a:g}{generic}"
    )


def _assumptions(measured: Measured, cost: StepCost | StepModel, base: ODBConfig) -> list[str]:
    out = [
        _cost_assumption(cost, base),
        "the loader's own round protocol over the measured lengths (no processes); "
        "the seed, views and buffer settings are the loader's",
    ]
    if base.policy == "paper":
        out.append("policy 'paper': a trainer that keeps up (every round sees a free queue)")
    if measured.dataset_size != len(measured.lengths):
        scale = measured.dataset_size / len(measured.lengths)
        out.append(
            f"{len(measured.lengths)} of {measured.dataset_size} samples measured: steps are "
            f"the sample's; an epoch has about {scale:.2f}x as many"
        )
    return out
