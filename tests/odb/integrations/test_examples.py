"""The plain loop and the HF Trainer examples on 2 CPU ranks: the plain loop gives both
ranks the same number of steps and trains every sample once; the Trainer logs finite
step losses whose mean is its train_loss. The Accelerate, DeepSpeed and FSDP examples run
in ``test_loop_resume.py``, which checks their guarantees over a checkpoint and resume."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from harness.torchrun import run_torchrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
SAMPLES = 64  # the examples' default


def _run(script: str, *args: str) -> str:
    code, out, err = run_torchrun(EXAMPLES / script, 2, list(args), timeout=240, env=ENV)
    assert code == 0, out[-2000:] + err[-4000:]
    return out


def test_plain_loop(tmp_path: Path) -> None:
    _run("plain_loop.py", "--record", str(tmp_path))
    steps = [json.loads((tmp_path / f"rank{r}.json").read_text())["steps"] for r in (0, 1)]
    assert len(steps[0]) == len(steps[1]) > 0
    assert sorted(i for s in steps for step in s for i in step["ids"]) == list(range(SAMPLES))


def _logged_dicts(out: str) -> list[dict]:
    """The metric dicts the HF Trainer printed (one line each)."""
    found = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                found.append(ast.literal_eval(line))
            except (ValueError, SyntaxError):
                continue
    return found


def test_hf_trainer_example(tmp_path: Path) -> None:
    """Two optimizer steps, each logged with a finite loss; the run's train_loss is
    their mean (the Trainer's own accounting over the ODB loader's windows)."""
    out = _run("hf_trainer.py", "--max-steps", "2", "--samples", "16", "--out", str(tmp_path))
    logged = _logged_dicts(out)
    steps = [float(d["loss"]) for d in logged if "loss" in d]  # printed as numbers or text
    [summary] = [d for d in logged if "train_loss" in d]
    assert len(steps) == 2 and all(math.isfinite(x) and x > 0 for x in steps), logged
    assert float(summary["train_loss"]) == pytest.approx(sum(steps) / 2, rel=1e-2)
