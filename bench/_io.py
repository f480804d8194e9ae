"""Shared plumbing of the benchmarks: argument parsing, progress on stderr, JSON out.

Every benchmark prints one JSON document to stdout and, with ``--out PATH``, writes
the same document to ``PATH``. Progress goes to stderr so stdout stays parseable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

_T0 = time.perf_counter()


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the common ``--out`` option."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return p


def progress(message: str) -> None:
    """One progress line on stderr, with the seconds since start."""
    print(f"[{time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    """What the numbers were measured on (CPU-proxy scale)."""
    import torch

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerator": "none (CPU)",
        "scale": "CPU-proxy scale",
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def emit(result: dict[str, Any], out: Path | None) -> None:
    """Print the JSON document to stdout and write it to ``out`` when given."""
    result = dict(result, wall_s=round(time.perf_counter() - _T0, 2))
    text = json.dumps(result, indent=2, sort_keys=False, default=_default)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        progress(f"wrote {out}")


def _default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
