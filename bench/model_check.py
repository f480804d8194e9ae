"""Exhaustive model check of the round protocol on the real pure core (issue 57).

For ``W = 1, 2, 3`` ranks, join and non-join mode, both policies, views of known size
(pacing possible) and streams (no pacing), with and without the buffer ramp, every
state reachable from an epoch's start is explored breadth first
(:mod:`bench.model_check_search`): every view size up to ``N`` per rank, every length
of every sample from a three-letter alphabet (short, medium, over the budget), every
read count per rank per round that the caps allow, every end of a stream. Each
state is a round of ``W`` real :class:`odb.core.rounds.RankRounds` deciding on the same
gathered statuses, their steps collated by the real step builder, their counts summed
and released through the real normalisers (``G = 1`` and ``G = 2`` on every path), and
a non-join carry dealt by the real ``deal_carry`` (:mod:`bench.model_check_world`). The
guarantees of ``docs/protocol.md`` are checked in every round and at every epoch end
(:mod:`bench.model_check_spec`). Prints one JSON table: per search the states, moves,
epoch ends, depth in rounds, how often pacing, splitting, IDLE steps and carries
occurred, seconds, and the first violation with its shortest schedule (replayable with
:func:`bench.model_check_search.replay`).

    python -m bench.model_check                   # the default bounds (docs/protocol.md)
    python -m bench.model_check --small           # the suite's bound
    python -m bench.model_check --world 2 --max-view 3
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from bench import _io
from bench.model_check_search import Result, explore
from bench.model_check_spec import Bounds

DEFAULT_VIEWS = {
    (1, False): 5,
    (1, True): 5,
    (2, False): 3,
    (2, True): 3,
    (3, False): 2,
    (3, True): 1,
}
"""Most samples per view at the default bounds, per (world size, stream)."""
SMALL_VIEWS = {
    (1, False): 3,
    (1, True): 3,
    (2, False): 2,
    (2, True): 2,
    (3, False): 1,
    (3, True): 1,
}
"""The suite's bound (``tests/bench/test_model_check.py``)."""


def grid(views: dict[tuple[int, bool], int]) -> list[Bounds]:
    """World x mode x policy x source x ramp, each with its view bound."""
    return [
        Bounds(world, join, policy, stream, ramp, views[world, stream])
        for world, join, policy, stream, ramp in itertools.product(
            sorted({w for w, _ in views}),
            (True, False),
            ("balanced", "paper"),
            (False, True),
            (True, False),
        )
        if (world, stream) in views
    ]


def pacing(lengths: tuple[int, ...] | None = None) -> list[Bounds]:
    """Where pacing happens: two ranks in join mode, views of up to 4 samples.

    A rank paces itself only with ``3/4 E <= g < E`` ready groups and ``T >= 2``
    (e.g. ``(5, 5, 3)`` read against a peer holding ``(5, 3, 3)`` of 4 in round 0, the
    ramp off); views of 4 reach it. Read counts are those of ``wants_read`` (no early
    stop), every length of every sample is tried.
    """
    extra = {} if lengths is None else {"lengths": lengths}
    return [
        Bounds(2, True, policy, False, False, 4, early_stop=False, **extra)
        for policy in ("balanced", "paper")
    ]


def searches(small: bool) -> list[Bounds]:
    """The default searches (or the suite's small ones), the costliest first."""
    if small:
        return grid(SMALL_VIEWS) + pacing(lengths=(3, 5))
    found = grid(DEFAULT_VIEWS) + pacing()
    return sorted(found, key=lambda b: -_cost(b))


def _cost(b: Bounds) -> float:
    return (b.max_view + 1) ** b.world * (2 if b.stream else 1) * len(b.lengths)


def run(searches: Iterable[Bounds], jobs: int, stop_first: bool = False) -> list[Result]:
    """Explore each search (in ``jobs`` processes); progress on stderr."""
    searches = list(searches)
    results: list[Result] = []
    if jobs <= 1:
        mapped = map(explore, searches)
        return _collect(mapped, searches, results, stop_first)
    with ProcessPoolExecutor(jobs) as pool:
        return _collect(pool.map(explore, searches), searches, results, stop_first)


def _collect(mapped, searches, results, stop_first) -> list[Result]:
    for result in mapped:
        results.append(result)
        found = result.violation
        _io.progress(
            f"{result.bounds.label()}: {result.states} states, depth {result.depth}, "
            f"{result.seconds:.1f}s"
            + (f", VIOLATION {found['rule']}: {found['message']}" if found else "")
        )
        if found and stop_first:
            break
    return results


def summary(results: list[Result]) -> dict[str, Any]:
    """The JSON document: totals, then one row per search."""
    return {
        "benchmark": "model_check",
        "searches": len(results),
        "states": sum(r.states for r in results),
        "transitions": sum(r.stats.transitions for r in results),
        "max_depth_rounds": max((r.depth for r in results), default=0),
        "violations": sum(r.violation is not None for r in results),
        "explore_seconds": round(sum(r.seconds for r in results), 1),
        "bounds": {
            "fixed": {
                k: v
                for k, v in results[0].bounds.as_dict().items()
                if k not in ("world", "join", "policy", "stream", "ramp", "max_view")
            }
            if results
            else {},
            "grad_accum_steps": [1, 2],
            "per_search": "bounds of each row (W, mode, policy, source, ramp, N)",
            "free_slots": "queue_depth (every status)",
        },
        "table": [r.row() for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="the suite's small bound")
    p.add_argument("--world", type=int, action="append", help="only these world sizes")
    p.add_argument("--max-view", type=int, default=None, help="override N for every world")
    p.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    p.add_argument("--stop-first", action="store_true", help="stop at the first violation")
    p.add_argument("--mutants", action="store_true", help="the small bound, smallest search first")
    args = p.parse_args(argv)
    chosen = searches(args.small)
    if args.world:
        chosen = [b for b in chosen if b.world in args.world]
    if args.max_view is not None:
        chosen = [replace(b, max_view=args.max_view) for b in chosen]
    if args.mutants:
        chosen = sorted(searches(True), key=_cost)  # the smallest first: stop early
    results = run(chosen, args.jobs, args.stop_first)
    doc = summary(results)
    _io.emit(doc, args.out)
    return 1 if doc["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
