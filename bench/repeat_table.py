"""The Markdown table of a repeat campaign, from ``bench.repeat_tests``' JSON files.

    python -m bench.repeat_table results/repeats/*.json

One row per selection (file): the commit it repeated, module, repeats, failures, hangs,
load (busy processes the campaign started beside it, and the machine's 1-minute load
average at the repeats' ends, min-max: on a shared machine ``--load 0`` is not idle),
wall time per repeat (min-max). Accepts both a per-module file (``--out-dir``) and a whole
run's document (``--out``, its ``selections``).

``--rounds-of N`` prints a summary line first: the rounds every one of the campaign's
``N`` modules completed (none while a module has no file yet), the repeats, their wall
time, failures and hangs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

HEADER = (
    "| commit | module | repeats | failures | hangs | load | s per repeat |\n"
    "|---|---|---|---|---|---|---|"
)


def rows_of(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The selections a JSON document holds (one, or a whole run's ``selections``)."""
    return document["selections"] if "selections" in document else [document]


def table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of ``results`` (``bench.repeat_tests`` selections), in order."""
    lines = [HEADER]
    for r in results:
        walls = r.get("wall_s_per_repeat") or [0.0]
        lines.append(
            f"| {_commit(r)} | `{' '.join(r['selection'])}` | {r['repeats_run']} | "
            f"{r['failures']} | {r['hangs']} | {_load(r)} | {min(walls):.0f}-{max(walls):.0f} |"
        )
    return "\n".join(lines)


def summary(results: list[dict[str, Any]], modules: int) -> str:
    """One line on a campaign of ``modules`` modules: a round is complete once each
    module has repeated that often, so a module without a file leaves none complete."""
    runs = [r["repeats_run"] for r in results]
    rounds = min(runs) if runs and len(results) >= modules else 0
    walls = sum(sum(r.get("wall_s_per_repeat") or []) for r in results)
    return (
        f"{_counted(rounds, 'complete round')} of {modules} modules ({sum(runs)} repeats "
        f"of {len(results)} modules), {walls:,.0f} s of repeats, "
        f"{_counted(sum(r['failures'] for r in results), 'failure')}, "
        f"{_counted(sum(r['hangs'] for r in results), 'hang')}"
    )


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _commit(result: dict[str, Any]) -> str:
    """The short commit a selection's repeats ran (``+dirty``: uncommitted changes)."""
    commit = result.get("commit") or "-"
    return commit[:7] + ("+dirty" if commit.endswith("+dirty") else "")


def _load(result: dict[str, Any]) -> str:
    loads = result.get("load_average_1min_per_repeat") or [
        result.get("machine", {}).get("load_average_1_5_15", [None])[0]
    ]
    busy = f"{result.get('load', 0)} busy"
    if None in loads:
        return busy
    return f"{busy}, load avg {min(loads):.1f}-{max(loads):.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Markdown table of bench.repeat_tests JSON files.")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument(
        "--rounds-of", type=int, metavar="N", help="print a summary line first: N modules"
    )
    args = p.parse_args(argv)
    if args.rounds_of is not None and args.rounds_of < 1:
        p.error(f"--rounds-of must be at least 1, got {args.rounds_of}")
    results = [r for f in args.files for r in rows_of(json.loads(f.read_text()))]
    if args.rounds_of is not None:
        print(summary(results, args.rounds_of) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
