"""Breadth-first search of every round schedule of one :class:`Bounds`, and its replay.

From every epoch start (:func:`bench.model_check_world.start_states`) the search tries
every move (each rank's read sequence of the round, :func:`read_options`, in every
combination over the ranks) and keeps each state it reaches once, keyed by the state
itself (every rank's :class:`RankState`: reads, buffer with positions, lengths and
ages, read limit, rounds, steps and the normalisers' held steps; all a rank's future
depends on). Breadth first, so the first violation found has the fewest rounds; its
schedule (the start's view sizes and each round's move) replays with :func:`replay`.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bench.model_check_spec import Bounds, Violation
from bench.model_check_world import Stats, read_options, start_states, step


@dataclass
class Result:
    """One search's figures, and its first violation (None: none reachable)."""

    bounds: Bounds
    states: int = 0
    depth: int = 0
    seconds: float = 0.0
    stats: Stats = field(default_factory=Stats)
    violation: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The table row ``python -m bench.model_check`` prints."""
        s = self.stats
        return {
            "bounds": self.bounds.label(),
            "states": self.states,
            "transitions": s.transitions,
            "epoch_ends": s.epoch_ends,
            "depth_rounds": self.depth,
            "paced_moves": s.paced,
            "split_moves": s.split,
            "idle_moves": s.idle,
            "carrying_ends": s.carried,
            "seconds": round(self.seconds, 2),
            "violation": self.violation,
        }


def explore(bounds: Bounds, max_states: int | None = None) -> Result:
    """Every state reachable within ``bounds``; stops at the first violation.

    Args:
        bounds: The search.
        max_states: Stop after this many states (a bound for quick runs); None: all.
    """
    # The visited states are many small tuples that live to the end: the cyclic
    # collector would rescan them all, again and again, for no garbage.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _explore(bounds, max_states)
    finally:
        if enabled:
            gc.enable()


def _explore(bounds: Bounds, max_states: int | None) -> Result:
    started = time.perf_counter()
    config = bounds.config()
    result = Result(bounds)
    parent: dict[tuple, tuple[tuple | None, Any]] = {}
    frontier: deque[tuple[tuple, int]] = deque()
    for views, state in start_states(bounds):
        parent[state] = (None, views)
        frontier.append((state, 0))
    while frontier:
        state, depth = frontier.popleft()
        result.depth = max(result.depth, depth)
        options = [read_options(bounds, config, r, s) for r, s in enumerate(state)]
        for move in itertools.product(*options):
            result.stats.transitions += 1
            try:
                out = step(bounds, config, state, move)
            except Violation as exc:
                result.violation = _found(exc, _schedule(parent, state) + [move])
                result.depth = max(result.depth, depth + 1)
                return _close(result, parent, started)
            _tally(result.stats, out)
            if out.state is None:
                result.depth = max(result.depth, depth + 1)
            elif out.state not in parent:
                parent[out.state] = (state, move)
                frontier.append((out.state, depth + 1))
        if max_states is not None and len(parent) >= max_states:
            break
    return _close(result, parent, started)


def _tally(stats: Stats, out) -> None:
    stats.paced += out.paced
    stats.split += out.split
    stats.idle += out.idle
    if out.state is None:
        stats.epoch_ends += 1
        stats.carried += out.carried


def _close(result: Result, parent: dict, started: float) -> Result:
    result.states = len(parent)
    result.seconds = time.perf_counter() - started
    return result


def _schedule(parent: dict, state: tuple) -> list:
    """``[views, move of round 0, move of round 1, ...]`` that reaches ``state``."""
    moves = []
    while True:
        prev, how = parent[state]
        moves.append(how)
        if prev is None:
            return moves[::-1]
        state = prev


def _found(exc: Violation, schedule: list) -> dict[str, Any]:
    views, *moves = schedule
    return {
        "rule": exc.rule,
        "message": exc.message,
        "views": list(views),
        "rounds": [[list(reads) for reads in move] for move in moves],
    }


def replay(bounds: Bounds, views: list, rounds: list) -> int:
    """Run one schedule (as a violation reports it); the rounds it ran.

    Raises:
        Violation: The schedule breaks a guarantee (what the search reported).
        ValueError: The schedule does not fit ``bounds``.
    """
    config = bounds.config()
    starts = {tuple(v): s for v, s in start_states(bounds)}
    if tuple(views) not in starts:
        raise ValueError(f"views {views} are not an epoch start of {bounds.label()}")
    state = starts[tuple(views)]
    for k, move in enumerate(rounds):
        if state is None:
            raise ValueError(f"the epoch ended before round {k} of the schedule")
        move = tuple(tuple(reads) for reads in move)
        for r, reads in enumerate(move):
            if reads not in read_options(bounds, config, r, state[r]):
                raise ValueError(f"round {k}: rank {r} cannot read {list(reads)}")
        state = step(bounds, config, state, move).state
    return len(rounds)
