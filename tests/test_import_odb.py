"""`import odb` must work with torch alone: no heavy framework may be imported with it,
nor with `import odb.integrations` (each adapter imports its framework only itself)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ["transformers", "accelerate", "deepspeed", "datasets", "peft", "lm_eval", "snakemake"]


@pytest.mark.parametrize("module", ["odb", "odb.integrations"])
def test_import_odb_pulls_in_no_framework(module):
    # A fresh interpreter, because this test process may already have imported any of them.
    code = (
        f"import json, sys; import {module}; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, f"`import {module}` failed:\n{proc.stderr}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"`import {module}` imported {loaded}; import them lazily instead"
