"""GPU smoke of the paper settings: Standard vs ODB on one GPU, one JSON out.

Runs the train entry point twice on one GPU with the paper-scale layers
(``experiments/configs/scale/paper.yaml``: bf16, gradient checkpointing, cutoff 16384,
8 workers), the real Qwen3-VL-2B architecture with seeded random weights (no download),
DeepSpeed ZeRO-2 and the paper's ShareGPT4o budget (14336), on the ShareGPT4o proxy made
here (no hub). Standard takes one sample per step, as in the paper grid. It answers, on
the day a GPU is lent: does the paper recipe run on a GPU, in bf16, at its budgets, and
what is ODB's speed-up there (one run each: a smoke check, not a table figure).

    python -m bench.gpu_smoke --out results/bench/gpu_smoke.json   # sized for < 8 min, one H200
    python -m bench.gpu_smoke --out /tmp/s.json --device cpu --samples 8 --model tiny  # wiring

It prints progress to stderr and the JSON to stdout (and ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "experiments" / "configs"
MODELS = {"qwen3-vl-2b": "model/qwen3-vl-2b-random.yaml", "tiny": "model/tiny.yaml"}
BUDGET = 14336  # the paper's ShareGPT4o L_max (config/paper.yaml)
PROXY_ROWS = 400  # the proxy's CV calibration needs a few hundred rows; runs read the first


def _log(message: str) -> None:
    print(f"[gpu_smoke {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> None:
    _log(" ".join(cmd))
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"command failed ({proc.returncode}); log {log}:\n{tail}")


def make_data(work: Path, samples: int, env: dict[str, str]) -> tuple[Path, Path]:
    """The ShareGPT4o proxy and the local processor (and tiny model) for it."""
    proxies, assets = work / "proxies", work / "assets"
    if not (proxies / "sharegpt4o").exists():
        _run([sys.executable, "-m", "experiments.data.proxies", "--out", str(proxies),
              "--datasets", "sharegpt4o", "--num-samples", str(max(samples, PROXY_ROWS))],
             work / "proxies.log", env)
    if not assets.exists():
        _run([sys.executable, "-m", "experiments.data.assets", "--proxies", str(proxies),
              "--out", str(assets)], work / "assets.log", env)
    return proxies / "sharegpt4o", assets


def train_command(method: str, args: argparse.Namespace, source: Path, assets: Path,
                  out_dir: Path) -> list[str]:
    """``torchrun -m experiments.train`` for one method with the paper's layers."""
    layers = ["scale/paper.yaml", MODELS[args.model], f"method/{method}.yaml",
              "mode/full.yaml", "strategy/deepspeed.yaml"]
    overrides = [
        "data.dataset=sharegpt4o", f"data.source={source}", f"data.processor={assets}/processor",
        "data.image_max_pixels=9437184", f"data.max_samples={args.samples}",
        "data.holdout_samples=0", "validation.enabled=false", f"method.token_budget={BUDGET}",
        f"run.out_dir={out_dir}", "run.save_every=0", "run.scale=GPU smoke (1 GPU)",
    ]
    if args.model == "tiny":
        overrides.append(f"model.path={assets}/model")
    if args.device == "cpu":
        overrides += ["model.dtype=float32", "model.gradient_checkpointing=false",
                      "method.num_workers=1", "strategy.device=auto"]
    if method == "standard":
        overrides.append("method.baseline.batch_size=1")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "1", "-m", "experiments.train",
            *(x for layer in layers for x in ("--config", str(CONFIGS / layer))), *overrides]


SUMMARY = ("throughput_samples_per_s", "real_tokens_per_s", "padding_efficiency", "steps",
           "emitted_samples", "train_wall_s", "peak_memory", "final_train_loss")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=ROOT / "results" / "bench" / "gpu_smoke")
    parser.add_argument("--samples", type=int, default=160,
                        help="ShareGPT4o proxy samples trained per method")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-vl-2b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    args.work.mkdir(parents=True, exist_ok=True)
    source, assets = make_data(args.work, args.samples, env)
    runs = {}
    for method in ("standard", "odb"):
        out_dir = args.work / method
        _run(train_command(method, args, source, assets, out_dir), args.work / f"{method}.log",
             env)
        result = json.loads((out_dir / "result.json").read_text())
        runs[method] = {key: result.get(key) for key in SUMMARY}
        _log(f"{method}: {runs[method]['throughput_samples_per_s']:.2f} samples/s")
    report = {"bench": "gpu_smoke", "device": args.device, "model": args.model,
              "dataset": "sharegpt4o proxy", "token_budget": BUDGET, "runs": runs,
              "odb_speedup": runs["odb"]["throughput_samples_per_s"]
              / runs["standard"]["throughput_samples_per_s"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
