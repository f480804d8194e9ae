"""`import odb` must work with torch alone: no heavy framework may be imported with it,
nor with `import odb.integrations` (each adapter imports its framework only itself)."""

import json
import subprocess
import sys
from pathlib import Path

HEAVY = [
    "transformers",
    "accelerate",
    "deepspeed",
    "datasets",
    "peft",
    "trl",
    "lm_eval",
    "snakemake",
]


def test_import_odb_pulls_in_no_framework():
    # A fresh interpreter, because this test process may already have imported any of
    # them; one for both imports (each starts torch): what `import odb` loads, then what
    # `import odb.integrations` adds.
    code = (
        f"import json, sys; heavy = {HEAVY!r}; loaded = lambda: [m for m in heavy if m in "
        "sys.modules]; import odb; print(json.dumps(loaded())); import odb.integrations; "
        "print(json.dumps(loaded()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, f"`import odb` or `import odb.integrations` failed:\n{proc.stderr}"
    after_odb, after_integrations = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    assert after_odb == [], f"`import odb` imported {after_odb}; import them lazily instead"
    assert after_integrations == [], (
        f"`import odb.integrations` imported {after_integrations}; import them lazily instead"
    )
