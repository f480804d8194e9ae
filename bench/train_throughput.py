"""End-to-end training throughput per method, through the real train entry point.

Every (dataset, method, repeat) is one ``torchrun`` run of ``python -m experiments.train``
at W ranks with the same model, token budget, cutoff and loader settings for every
method of a dataset; the figure is the run's literal throughput (emitted samples over
the training loop's wall time). Ratios are against Standard's median on the same
dataset. Needs the data stage (``make reproduce`` or ``snakemake proxies assets``).

    python -m bench.train_throughput --samples 64 --repeats 3 \\
        --out docs/bench/train_throughput_cpu.json --plot docs/figures/train_speedup_cpu.png

On a GPU machine, ``--model qwen3-vl-2b-random --dtype bfloat16 --world 1`` measures the
real 2B architecture with random weights. Numbers on CPU are CPU-proxy scale.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import _io

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "experiments" / "configs"
METHODS = ("standard", "sorted", "gmt", "bmt", "packing", "odb")
# Per dataset, the same for every method: source, pixel budget (the proxies' calibration),
# cutoff and token budget. ShareGPT4o's images reach ~9.8k tokens, so its cutoff is the
# paper's 16384 and its budget 16384: Standard then runs one sample per step, as the
# paper's long-tail case forces it to.
DATASETS: dict[str, dict[str, Any]] = {
    "ultrachat": {"source": "ultrachat", "image_max_pixels": 589824, "cutoff_len": 4096,
                  "token_budget": 8192},
    "llava": {"source": "llava", "image_max_pixels": 589824, "cutoff_len": 2048,
              "token_budget": 8192},
    "sharegpt4o": {"source": "sharegpt4o", "image_max_pixels": 9437184, "cutoff_len": 16384,
                   "token_budget": 16384},
    "mmmix": {"source": "mmmix", "image_max_pixels": 589824, "cutoff_len": 2560,
              "token_budget": 8192},
}
_KEEP = ("throughput_samples_per_s", "real_tokens_per_s", "padding_efficiency", "steps",
         "idle_fraction", "emitted_samples", "train_wall_s", "data_wait_s")


def run_one(dataset: str, method: str, args: Any, out_dir: Path) -> dict[str, Any]:
    """One training run; returns the fields of its result JSON this benchmark reports."""
    spec = DATASETS[dataset]
    overrides = [
        f"run.out_dir={out_dir}", f"run.seed={args.seed}", "validation.enabled=false",
        f"data.dataset={dataset}", f"data.source={args.data}/{spec['source']}",
        f"data.image_max_pixels={spec['image_max_pixels']}",
        f"data.cutoff_len={spec['cutoff_len']}",
        f"data.max_samples={args.samples}", "data.holdout_samples=0",
        f"method.token_budget={spec['token_budget']}", f"method.num_workers={args.workers}",
        f"model.dtype={args.dtype}", f"data.processor={args.processor}",
    ]
    layers = ["scale/cpu.yaml", f"model/{args.model}.yaml", f"method/{method}.yaml",
              "mode/full.yaml", "strategy/ddp.yaml"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(args.world), "-m", "experiments.train"]
    for layer in layers:
        cmd += ["--config", str(CONFIGS / layer)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([*cmd, *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{dataset}/{method} failed:\n{done.stderr[-3000:]}")
    result = json.loads((out_dir / "result.json").read_text())
    return {key: result[key] for key in _KEEP}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["throughput_samples_per_s"] for r in runs]
    return {"samples_per_s": {"min": min(rates), "median": statistics.median(rates),
                              "max": max(rates)},
            "padding_efficiency": statistics.median(r["padding_efficiency"] for r in runs),
            "steps": runs[0]["steps"], "idle_fraction": max(r["idle_fraction"] for r in runs),
            "data_wait_s_median": statistics.median(r["data_wait_s"] for r in runs),
            "runs": runs}


def speedups(table: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median throughput over Standard's median, per dataset and method."""
    out = {}
    for dataset, methods in table.items():
        base = methods["standard"]["samples_per_s"]["median"]
        out[dataset] = {m: s["samples_per_s"]["median"] / base for m, s in methods.items()}
    return out


def plot(ratios: dict[str, dict[str, float]], table: dict[str, Any], path: Path,
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(ratios)
    methods = [m for m in METHODS if any(m in ratios[d] for d in datasets)]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, method in enumerate(methods):
        xs, ys, lo, hi = [], [], [], []
        for j, d in enumerate(datasets):
            if method not in ratios[d]:
                continue
            rate = table[d][method]["samples_per_s"]
            base = table[d]["standard"]["samples_per_s"]["median"]
            xs.append(j + (i - (len(methods) - 1) / 2) * width)
            ys.append(ratios[d][method])
            lo.append(ratios[d][method] - rate["min"] / base)
            hi.append(rate["max"] / base - ratios[d][method])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel("samples/s over Standard (median)")
    ax.set_title(title, fontsize=9)
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = _io.parser(__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--samples", type=int, default=64, help="training samples per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world", type=int, default=2, help="ranks (torchrun processes)")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument("--model", default="cpu-bench", help="a layer in experiments/configs/model")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="results/data/proxies")
    parser.add_argument("--processor", default="results/data/assets/processor")
    parser.add_argument("--plot", type=Path, default=None, help="speedup figure (PNG)")
    args = parser.parse_args()
    if "standard" not in args.methods:
        parser.error("--methods must include standard (the ratios' reference)")
    table: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets:
            table[dataset] = {}
            for method in args.methods:
                if method == "packing" and dataset != "ultrachat":
                    continue  # packing is text-only, as in the paper
                runs = []
                for repeat in range(args.repeats):
                    out = Path(tmp) / f"{dataset}_{method}_{repeat}"
                    runs.append(run_one(dataset, method, args, out))
                    _io.progress(f"{dataset} {method} #{repeat}: "
                                 f"{runs[-1]['throughput_samples_per_s']:.2f} samples/s")
                table[dataset][method] = summarise(runs)
    ratios = speedups(table)
    scale = "CPU-proxy scale" if args.dtype == "float32" else "GPU"
    if args.plot is not None:
        plot(ratios, table, args.plot, f"{scale}: W={args.world}, model {args.model}, "
             f"{args.samples} samples/run, {args.repeats} repeats (bars: min-max)")
    _io.emit({"benchmark": "train_throughput", "machine": _io.machine(),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
              "datasets": {d: DATASETS[d] for d in args.datasets},
              "speedup_vs_standard": ratios, "results": table}, args.out)


if __name__ == "__main__":
    main()
