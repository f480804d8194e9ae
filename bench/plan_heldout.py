"""The step-cost model held against published measurements it was not fitted to.

The model (:mod:`odb.planning.step_cost`) has two fitted constants, fitted here (``--fit``)
on the paper's UltraChat 8B pair alone. Every other row is predicted with those constants
and the published figure is set beside it: the paper's other samples/s and speed-ups (8x
H20 per node, DeepSpeed ZeRO-2, Standard at one sample per GPU), the two GPU-proxy runs
(``docs/gpu/``: one H200, a 166M text model) and torchtitan's Llama 3.1 8B on 8x H100
with FSDP2 (``docs/performance.md`` of pytorch/torchtitan). Samples are the artifact's
proxies (``experiments.data.proxies``, 2,000 each, seed 0) or, for the GPU-proxy runs,
their own lengths (``bench.distributions``, seed 1).

    python -m bench.plan_heldout --out docs/bench/plan_heldout.json     # the table
    python -m bench.plan_heldout --fit                                  # the constants
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import _io
from bench.distributions import lengths as bench_lengths
from experiments.plan_schedules import Samples, proxy_samples, schedule, text_samples
from odb.planning.hardware import gpu
from odb.planning.models import architecture
from odb.planning.step_cost import (
    FITTED,
    FITTED_ON,
    Constants,
    Schedule,
    Setup,
    StepModel,
    fit_constants,
    schedule_terms,
)

# The paper's table (ODB README "Benchmarks And Paper"; paper/published.py).
PAPER_BUDGET = {"ultrachat": 12288, "llava": 12288, "sharegpt4o": 14336, "mmmix": 12288}
FIT_RATES = {"standard": 5.77, "odb": 10.23}  # UltraChat 8B, 8x H20: the fit's only data


@dataclass(frozen=True)
class Run:
    """One measured configuration: what trained, on which samples, how."""

    model: str
    gpu: str
    world: int
    samples: Callable[[], Samples]
    method: str
    budget: int
    batch_size: int = 1
    strategy: str = "zero2"
    checkpointing: str = "full"
    gpus_per_node: int = 8

    def schedule(self) -> Schedule:
        return schedule(self.samples(), self.method, self.world, budget=self.budget,
                        batch_size=self.batch_size)  # fmt: skip

    def model_of(self, constants: Constants) -> StepModel:
        setup = Setup(architecture(self.model), gpu(self.gpu), self.strategy, self.world,
                      self.gpus_per_node, checkpointing=self.checkpointing)  # fmt: skip
        return StepModel(setup, constants)


def paper_run(data: str, model: str, method: str, world: int = 8) -> Run:
    return Run(model, "h20", world, lambda: proxy_samples(data), method, PAPER_BUDGET[data])


def proxy_run(data: str, n: int, method: str) -> Run:
    return Run("gpu-proxy-166m", "h200", 1,
               lambda: text_samples(data, bench_lengths(data, n, seed=1).tolist()), method,
               16384, batch_size=2, strategy="ddp", checkpointing="none")  # fmt: skip


def torchtitan_run() -> Run:
    samples = lambda: text_samples("torchtitan", [8192] * 8 * 2 * 10)  # noqa: E731
    return Run("llama-3.1-8b", "h100", 8, samples, "standard", 16384, batch_size=2,
               strategy="fsdp", checkpointing="selective")  # fmt: skip


def fit() -> Constants:
    """The two constants from the UltraChat 8B Standard / ODB pair, nothing else."""
    observations = []
    for method, rate in FIT_RATES.items():
        run = paper_run("ultrachat", "8b", method)
        sched = run.schedule()
        samples = sum(len(step) for rank in sched for step in rank)
        observations.append((schedule_terms(run.model_of(FITTED).setup, sched), samples / rate))
    return fit_constants(observations)


def rate(run: Run, constants: Constants) -> float:
    return run.model_of(constants).samples_per_s(run.schedule())


def rows(constants: Constants) -> list[dict[str, Any]]:
    """Every held-out row: ``(what, predicted, published, error)``."""
    out: list[dict[str, Any]] = []

    def add(what: str, predicted: float, published: float, unit: str) -> None:
        out.append({"what": what, "unit": unit, "predicted": round(predicted, 3),
                    "published": published,
                    "error": round((predicted - published) / published, 3)})  # fmt: skip

    for data, model, world, std, odb_rate, speedup in (
        ("llava", "8b", 8, 14.38, 24.87, 1.73),
        ("sharegpt4o", "8b", 8, 2.37, 5.83, 2.46),
        ("mmmix", "2b", 16, 17.85, 79.15, 4.43),
    ):
        s = rate(paper_run(data, model, "standard", world), constants)
        o = rate(paper_run(data, model, "odb", world), constants)
        tag = f"paper {data} {model.upper()} {world}x H20"
        add(f"{tag} Standard", s, std, "samples/s")
        add(f"{tag} ODB", o, odb_rate, "samples/s")
        add(f"{tag} ODB speed-up", o / s, speedup, "x")
    s2 = rate(paper_run("sharegpt4o", "2b", "standard"), constants)
    add(
        "paper sharegpt4o 2B 8x H20 ODB speed-up",
        rate(paper_run("sharegpt4o", "2b", "odb"), constants) / s2,
        2.47,
        "x",
    )
    s8 = rate(paper_run("sharegpt4o", "8b", "standard"), constants)
    add(
        "paper sharegpt4o 8B 8x H20 Sorted speed-up",
        rate(paper_run("sharegpt4o", "8b", "sorted"), constants) / s8,
        1.03,
        "x",
    )
    for data, n, std, odb_rate, speedup in (
        ("sharegpt4o", 1500, 10.01, 38.25, 3.821),
        ("mmmix", 3000, 23.41, 162.8, 6.954),
    ):
        s = rate(proxy_run(data, n, "standard"), constants)
        o = rate(proxy_run(data, n, "odb"), constants)
        tag = f"GPU proxy {data}-shaped 166M 1x H200"
        add(f"{tag} Standard", s, std, "samples/s")
        add(f"{tag} ODB", o, odb_rate, "samples/s")
        add(f"{tag} ODB speed-up", o / s, speedup, "x")
    tt = torchtitan_run()
    add(
        "torchtitan Llama 3.1 8B 8x H100 FSDP2 tokens/s/GPU",
        rate(tt, constants) * 8192 / tt.world,
        5762.0,
        "tokens/s/GPU",
    )
    return out


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| row | unit | predicted | published | error |", "|---|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['unit']} | {r['predicted']:,} | {r['published']:,} | "
              f"{r['error']:+.0%} |" for r in table]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = _io.parser(__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants and print them")
    args = parser.parse_args(argv)
    fitted = fit()
    result: dict[str, Any] = {
        "benchmark": "plan_heldout",
        "fitted_on": FITTED_ON,
        "refit": {
            "peak_mfu": round(fitted.peak_mfu, 4),
            "step_overhead_s": round(fitted.step_overhead_s, 4),
        },
        "constants": {"peak_mfu": FITTED.peak_mfu, "step_overhead_s": FITTED.step_overhead_s},
    }
    if not args.fit:
        table = rows(FITTED)
        result["rows"] = table
        _io.progress("\n" + markdown(table))
    _io.emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
