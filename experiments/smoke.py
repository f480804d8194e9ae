"""Placeholder main job until the workflow issue lands.

Runs a tiny real torch computation (a seeded two-layer MLP forward/backward on CPU),
writes a JSON record (torch version, timestamp, scale, loss) and prints its path. It
proves that the environment and the Snakemake wiring work end to end; it measures
nothing about ODB.

    python -m experiments.smoke --out results/smoke/smoke.json --scale CPU-proxy
"""

import argparse
import json
import platform
from datetime import UTC, datetime
from pathlib import Path

import torch


def run(seed: int = 0) -> dict[str, float]:
    """One seeded forward/backward pass of a small MLP; returns its loss and grad norm.

    Example:
        >>> record = run(seed=0)
        >>> sorted(record)
        ['grad_norm', 'loss']
    """
    torch.manual_seed(seed)  # seeds the data and the weight init alike
    x = torch.randn(32, 16)
    y = torch.randn(32, 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    return {"loss": loss.item(), "grad_norm": grad_norm.item()}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="path of the JSON to write")
    parser.add_argument("--scale", required=True, help="scale label from the workflow config")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    record = {
        "job": "smoke (placeholder main job)",
        "scale": args.scale,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": args.seed,
        **run(args.seed),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
