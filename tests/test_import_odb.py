"""`import odb` must work with torch alone: no heavy framework may be imported with it."""

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ["transformers", "deepspeed", "datasets", "peft", "lm_eval", "snakemake"]


def test_import_odb_pulls_in_no_framework():
    # A fresh interpreter, because this test process may already have imported any of them.
    code = (
        "import json, sys; import odb; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, f"`import odb` failed:\n{proc.stderr}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"`import odb` imported {loaded}; import them lazily instead"
