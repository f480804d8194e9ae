"""Many small real-rank cases in few rank processes: one spawn per world size.

A rank process costs seconds to start (torch and its imports); a case that builds a
loader and reads a hundred samples costs a fraction of that. ``run_calls`` runs every
case of one world size in order in one set of ranks and hands each case its own
ranks' results; ``LazyCalls`` does so for one world size when a test first reads one
of its keys. An ODB loader has its own process group, so loaders built one after
another in one process do not share state. A case that raises fails the whole call
(its traceback names it); a case that expects an error returns it instead.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from harness.ranks import run_ranks

Call = tuple[int, Callable[..., Any], tuple[Any, ...]]  # (world_size, fn, args)


def _run_in_order(rank: int, world_size: int, calls: list[tuple[Callable, tuple]]) -> list:
    """Rank body: ``fn(rank, world_size, *args)`` for each call, in order."""
    return [fn(rank, world_size, *args) for fn, args in calls]


def run_calls(calls: dict[Hashable, Call], timeout: float = 180.0) -> dict[Hashable, list]:
    """Run each keyed call on ``world_size`` real ranks, one spawn per world size, calls
    of one world size in the dict's order.

    ``fn`` must be module-level (the ranks are spawned), as for ``run_ranks``.

    Returns:
        Per key, the list of its ranks' return values (rank 0 first).

    Example:
        >>> def _world(rank, world_size):  # module level in a real test
        ...     return world_size
        >>> run_calls({"a": (2, _world, ()), "b": (1, _world, ())})
        {'b': [1], 'a': [2, 2]}
    """
    out: dict[Hashable, list] = {}
    for world in sorted({w for w, _, _ in calls.values()}):
        keys = [key for key, (w, _, _) in calls.items() if w == world]
        results = run_ranks(_run_in_order, world, [calls[k][1:] for k in keys], timeout=timeout)
        out |= {key: [r[n] for r in results] for n, key in enumerate(keys)}
    return out


class LazyCalls:
    """Keyed calls run on first use: reading a key runs every call of its world size
    (one spawn) and keeps their results, so a module fixture of many cases charges each
    test for at most the one spawn it needs.

    Example:
        >>> calls = LazyCalls({"a": (2, _world, ()), "b": (1, _world, ())})
        >>> calls["a"]  # spawns 2 ranks; "b" is not run yet
        [2, 2]
    """

    def __init__(self, calls: dict[Hashable, Call], timeout: float = 180.0) -> None:
        self.calls, self.timeout = calls, timeout
        self._done: dict[Hashable, list] = {}

    def __getitem__(self, key: Hashable) -> list:
        if key not in self._done:
            world = self.calls[key][0]
            same = {k: c for k, c in self.calls.items() if c[0] == world}
            self._done |= run_calls(same, self.timeout)
        return self._done[key]
