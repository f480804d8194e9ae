"""Does the model check catch planted bugs? Each mutant is a copy of ``odb`` with one
plausible textual bug in the protocol code; the checker runs on it and must find a
violation, with its shortest schedule.

Each mutant copies the ``odb`` package to a temporary directory, replaces one exact
piece of source (which must occur exactly once, so a mutant can never silently be the
original code), and runs ``python -m bench.model_check --stop-first`` in a child whose
``odb`` is the copy (checked: the child reports where it imported ``odb`` from). The
searches run from the smallest world up and stop at the first violation.

    python -m bench.model_check_mutations            # every mutant, the table as JSON
    python -m bench.model_check_mutations --only carry_not_dealt
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

from bench import _io

ROOT = Path(__file__).resolve().parent.parent


class Mutant(NamedTuple):
    """One planted bug: ``old`` (exactly once in ``path``) replaced by ``new``."""

    name: str
    path: str
    old: str
    new: str
    why: str


MUTANTS = (
    Mutant(
        "paper_max_as_min",
        "odb/core/alignment.py",
        "    target = max(s.ready for s in active)\n",
        "    target = min(s.ready for s in active)\n",
        "the paper rule's target takes the min of the ready counts, not the max",
    ),
    Mutant(
        "drain_max_as_min",
        "odb/core/alignment.py",
        "return max(s.ready for s in active), True",
        "return min(s.ready for s in active), True",
        "the balanced drain's target takes the min of the ready counts, not the max",
    ),
    Mutant(
        "recirculated_group_dropped",
        "odb/core/rounds.py",
        "self.buffer.take(steps.groups))",
        "self.buffer.take(steps.groups + tuple(ready[plan.target : plan.target + 1]))"
        "[: len(steps.groups)])",
        "the first ready group not chosen (to recirculate) leaves the buffer unemitted",
    ),
    Mutant(
        "split_loses_last_piece",
        "odb/core/grouping.py",
        "        result.append(peeled)\n",
        "        if len(result) + 1 < target:\n            result.append(peeled)\n",
        "split_to_count drops the piece that would reach the target",
    ),
    Mutant(
        "end_from_own_status",
        "odb/core/rounds.py",
        "        if plan.end:\n",
        "        if plan.end or self._status.dry:\n",
        "a rank ends its epoch from its own status (dry) instead of the gathered plan",
    ),
    Mutant(
        "plan_from_own_status",
        "odb/core/rounds.py",
        "        plan = plan_round(\n            statuses,\n",
        "        plan = plan_round(\n            [self._status] * len(statuses),\n",
        "each rank plans from its own status instead of the gathered ones",
    ),
    Mutant(
        "pacing_while_reading",
        "odb/core/alignment.py",
        "if not own.read_done or not share * self.heaviest <= g < self.heaviest:",
        "if not share * self.heaviest <= g < self.heaviest:",
        "a rank still reading paces itself on an estimate of its own remaining steps",
    ),
    Mutant(
        "ramp_ends_early",
        "odb/core/rounds.py",
        "growing = buffer_budgets_in_round(self.config, self.rounds) <",
        "growing = buffer_budgets_in_round(self.config, self.rounds + 1) <",
        "ramp off by one: the one-step rounds end a round before the buffer is full",
    ),
    Mutant(
        "carry_not_dealt",
        "odb/_process/collate_epoch.py",
        "return everything[rank :: len(per_rank)]",
        "return per_rank[rank]",
        "each rank keeps its own carry instead of the round-robin deal",
    ),
    Mutant(
        "idle_step_with_ids",
        "odb/core/steps.py",
        "self.collate_fn([self.reader.idle_sample()]), (), 0)",
        "self.collate_fn([self.reader.idle_sample()]), (-1,), 0)",
        "an IDLE step is given a sample id",
    ),
    Mutant(
        "idle_labels_unmasked",
        "odb/core/step_info.py",
        "    if idle:\n",
        "    if idle and False:\n",
        "an IDLE step's labels are not masked, so it adds loss tokens",
    ),
    Mutant(
        "read_limit_off_by_one",
        "odb/core/alignment.py",
        "min(s.read_count for s in statuses) + buffer_size",
        "min(s.read_count for s in statuses) + buffer_size + 1",
        "non-join: a rank may read one more than a buffer ahead of the slowest",
    ),
    Mutant(
        "nonjoin_target_over_buffered",
        "odb/core/alignment.py",
        "target = min(target, min(s.buffered for s in active))",
        "target = min(target, max(s.buffered for s in active))",
        "non-join: T bounded by the most buffered rank, not the least",
    ),
    Mutant(
        "oversize_rule_off_by_one",
        "odb/core/budget.py",
        "return m.n == 0 or self.fits(m.plus(length, patches))",
        "return m.n <= 1 or self.fits(m.plus(length, patches))",
        "the oversize rule off by one: a group of one admits any second sample",
    ),
    Mutant(
        "normaliser_not_over_world",
        "odb/core/loss.py",
        "normalizer = max(total, 1) / self.world_size",
        "normalizer = max(total, 1)",
        "the loss normaliser is not divided by the world size",
    ),
    Mutant(
        "window_off_by_one",
        "odb/core/loss.py",
        "if len(self._held) < self.window:",
        "if len(self._held) <= self.window:",
        "an accumulation window is released one step late",
    ),
)


def mutate(mutant: Mutant, into: Path) -> Path:
    """A copy of ``odb`` under ``into`` with ``mutant`` applied; the copy's parent."""
    shutil.copytree(ROOT / "odb", into / "odb", ignore=shutil.ignore_patterns("__pycache__"))
    target = into / mutant.path
    source = target.read_text()
    if source.count(mutant.old) != 1:
        raise ValueError(
            f"mutant {mutant.name}: {mutant.old!r} occurs {source.count(mutant.old)} times "
            f"in {mutant.path}, not once; update the mutant to the code"
        )
    target.write_text(source.replace(mutant.old, mutant.new))
    return into


def check_mutant(mutant: Mutant, args: list[str]) -> dict[str, Any]:
    """Run the model check on a mutated copy; its first violation (or None)."""
    with tempfile.TemporaryDirectory(prefix=f"odb-{mutant.name}-") as tmp:
        copy = mutate(mutant, Path(tmp))
        code = (
            "import json, sys, odb; from bench import model_check as m; "
            "print(json.dumps({'odb': odb.__file__}), file=sys.stderr); "
            f"sys.exit(m.main({args!r}))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=copy,
            env=_env(copy),
            capture_output=True,
            text=True,
            check=False,
        )
        if str(copy) not in proc.stderr.split("\n", 1)[0]:
            raise RuntimeError(
                f"mutant {mutant.name}: the child did not import the copy: {proc.stderr[-2000:]}"
            )
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"mutant {mutant.name}: the check crashed: {proc.stderr[-2000:]}")
    doc = json.loads(proc.stdout)
    found = next((row for row in doc["table"] if row["violation"]), None)
    return {
        "mutant": mutant.name,
        "bug": mutant.why,
        "caught": found is not None,
        "states_searched": doc["states"],
        "search": found["bounds"] if found else None,
        "violation": found["violation"] if found else None,
    }


def _env(copy: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy), str(ROOT)])
    return env


def main(argv: list[str] | None = None) -> int:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--only", action="append", help="only these mutants (by name)")
    args = p.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    search = ["--stop-first", "--jobs", "1", "--mutants"]
    rows = []
    for mutant in chosen:
        row = check_mutant(mutant, search)
        rows.append(row)
        _io.progress(f"{mutant.name}: {'caught' if row['caught'] else 'MISSED'} ({row['search']})")
    doc = {
        "benchmark": "model_check_mutations",
        "mutants": len(rows),
        "caught": sum(r["caught"] for r in rows),
        "table": rows,
    }
    _io.emit(doc, args.out)
    return 0 if doc["caught"] == doc["mutants"] else 1


if __name__ == "__main__":
    sys.exit(main())
