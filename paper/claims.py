"""Timings as repeated measurements, their spread, and the one rule for claiming a difference.

Timings are repeated measurements, never one number: :func:`measurements` says what a
measurement is (each whole epoch after a warm-up epoch; the seeds of a cell add more),
:func:`pairings` pairs a run's measurements with its reference's by position,
:class:`Spread` is the one cell format of a timing or a ratio (``2.10x [1.98-2.24] n=3``)
and :func:`verdict` is the one rule by which a table or the report says "faster",
"slower" or "within noise".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from paper.common import Run

MIN_PAIRINGS = 3
FASTER, SLOWER, WITHIN_NOISE, TOO_FEW = "faster", "slower", "within noise", "too few measurements"
CLAIM_RULE = (
    f'Verdicts follow the claim rule: with n >= {MIN_PAIRINGS} paired ratios, "{FASTER}" if '
    f'every ratio > 1, "{SLOWER}" if every ratio < 1, else "{WITHIN_NOISE}"; with n < '
    f'{MIN_PAIRINGS}, "{TOO_FEW}" and no direction.'
)


def measurements(run: Run) -> list[float]:
    """The run's throughput measurements (samples/s), in epoch order.

    A measurement is one whole epoch that ran in one segment (``epoch_timings``:
    samples / wall_s). The first timed epoch is a warm-up (process and worker start-up,
    allocator, caches) and is dropped, so a run that timed ``k >= 2`` epochs gives
    ``k - 1`` measurements. A run that timed fewer (an older result without
    ``epoch_timings``, a one-epoch run, a run resumed mid-epoch) gives one: its own
    ``throughput_samples_per_s`` over the whole loop.

    Example:
        >>> run = Run("r", {}, {"throughput_samples_per_s": 3.0, "epoch_timings": [
        ...     {"epoch": 0, "wall_s": 4.0, "samples": 8, "steps": 2},
        ...     {"epoch": 1, "wall_s": 2.0, "samples": 8, "steps": 2}]})
        >>> measurements(run)
        [4.0]
    """
    timings = run.result.get("epoch_timings") or []
    if len(timings) < 2:
        return [run.throughput]
    for t in timings:
        if t["wall_s"] <= 0:
            raise ValueError(
                f"{run.name}: epoch {t['epoch']} has wall_s {t['wall_s']}; a timed epoch "
                "takes time: rerun the cell (its result file is not a real run's)"
            )
    return [t["samples"] / t["wall_s"] for t in timings[1:]]


def epoch_seconds(run: Run) -> list[float]:
    """The wall seconds behind :func:`measurements`, one per measurement: each timed
    epoch after the warm-up, else the run's whole training loop."""
    return per_measurement(run, "wall_s", float(run.result["train_wall_s"]))


def per_measurement(run: Run, key: str, whole_run: float) -> list[float]:
    """Figure ``key`` of each timed epoch after the warm-up (the epochs behind
    :func:`measurements`), or ``[whole_run]`` when the run timed fewer than 2 epochs
    or an epoch lacks ``key`` (an older result).

    Example:
        >>> run = Run("r", {}, {"epoch_timings": [
        ...     {"epoch": 0, "wall_s": 4.0, "samples": 8, "steps": 2, "data_wait_s": 1.0},
        ...     {"epoch": 1, "wall_s": 2.0, "samples": 8, "steps": 2, "data_wait_s": 0.5}]})
        >>> per_measurement(run, "data_wait_s", 1.5)
        [0.5]
    """
    timings = run.result.get("epoch_timings") or []
    if len(timings) < 2 or any(key not in t for t in timings):
        return [whole_run]
    return [float(t[key]) for t in timings[1:]]


def build_seconds(run: Run) -> list[float]:
    """Every timed pass of the run's length-cache build (one for a cache built once or
    an older result); ``[]`` for a run without a cache."""
    cache = run.result.get("length_cache")
    if not cache:
        return []
    return [float(t) for t in cache.get("build_timings") or [cache["build_seconds"]]]


def paired_ratios(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """``values[k] / reference[k]`` for each position both have (epoch k with epoch k).

    Example:
        >>> paired_ratios([4.0, 6.0, 5.0], [2.0, 3.0])
        [2.0, 2.0]
    """
    if any(r <= 0 for r in reference):
        raise ValueError(f"reference measurements must be > 0, got {list(reference)}")
    return [v / r for v, r in zip(values, reference, strict=False)]


def pairings(
    runs: Iterable[Run],
    ref_of: Callable[[Run], Run | None],
    measure: Callable[[Run], list[float]] = measurements,
) -> list[float]:
    """Every pairing of ``runs`` (seeds of one cell) with their references: each run's
    ``measure`` paired by position with that of ``ref_of(run)`` (same seed); a run
    without a reference adds none."""
    out: list[float] = []
    for run in runs:
        ref = ref_of(run)
        if ref is not None:
            out += paired_ratios(measure(run), measure(ref))
    return out


def pooled(runs: Iterable[Run]) -> list[float]:
    """The measurements of all ``runs`` (the seeds of one cell are repeats)."""
    return [m for run in runs for m in measurements(run)]


@dataclass(frozen=True)
class Spread:
    """Median, min, max and count of a set of measurements (or of paired ratios).

    Example:
        >>> Spread.of([2.24, 1.98, 2.10]).format(2, "x")
        '2.10x [1.98-2.24] n=3'
        >>> Spread.of([2.1]).format(2, "x")
        '2.10x (n=1)'
    """

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = [float(v) for v in values]
        if not values:
            return cls(math.nan, math.nan, math.nan, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    def format(self, digits: int = 2, suffix: str = "") -> str:
        """The one cell format of every timing and ratio in the tables."""
        if self.n == 0:
            return "–"
        median = f"{self.median:.{digits}f}{suffix}"
        if self.n == 1:
            return f"{median} (n=1)"
        return f"{median} [{self.low:.{digits}f}-{self.high:.{digits}f}] n={self.n}"

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-ready (None where there is no measurement)."""
        if self.n == 0:
            return {"median": None, "low": None, "high": None, "n": 0}
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n}


def verdict(ratios: Sequence[float]) -> str:
    """The claim rule: what a set of paired ratios (run / reference) lets a table say.

    With ``n >= 3`` ratios: ``"faster"`` when every ratio is > 1, ``"slower"`` when
    every ratio is < 1, otherwise ``"within noise"``. With fewer: ``"too few
    measurements (n=K)"``, never a direction.

    Why: the two sides of a pairing were measured alike (same seed, same epoch
    position), so a real difference shows in every pairing while the machine's drift
    does not. It is a sign test: with no difference, n ratios fall on one side with
    probability 2 * 0.5**n (0.25 for n = 3, 0.06 for n = 5), so 3 is the floor below
    which nothing is claimed; more repeats sharpen the verdict, the rule stays.

    Example:
        >>> verdict([1.2, 1.1, 1.3]), verdict([1.2, 0.9, 1.3]), verdict([1.2, 1.1])
        ('faster', 'within noise', 'too few measurements (n=2)')
    """
    if len(ratios) < MIN_PAIRINGS:
        return f"{TOO_FEW} (n={len(ratios)})"
    if all(r > 1 for r in ratios):
        return FASTER
    if all(r < 1 for r in ratios):
        return SLOWER
    return WITHIN_NOISE


def claim(ratios: Sequence[float]) -> dict[str, Any]:
    """The JSON of a comparison: the ratios' median, low, high, n and the verdict."""
    return {**Spread.of(ratios).to_dict(), "verdict": verdict(ratios)}


@dataclass(frozen=True)
class Comparison:
    """The paired ratios of a cell's runs against their references, as a table shows them.

    The reference's own row (every run its own reference) reads ``reference``.

    Example:
        >>> c = Comparison((1.1, 1.2, 1.05))
        >>> c.cell(), c.verdict
        ('1.10x [1.05-1.20] n=3', 'faster')
    """

    ratios: tuple[float, ...]
    is_reference: bool = False

    def cell(self) -> str:
        return "reference" if self.is_reference else Spread.of(self.ratios).format(2, "x")

    @property
    def verdict(self) -> str:
        return "–" if self.is_reference else verdict(self.ratios)

    def to_dict(self) -> dict[str, Any] | None:
        return None if self.is_reference else claim(self.ratios)


def compare(
    runs: Sequence[Run],
    ref_of: Callable[[Run], Run | None],
    measure: Callable[[Run], list[float]] = measurements,
) -> Comparison:
    """``runs`` (the seeds of one cell) against ``ref_of`` each, paired by position."""
    if all(ref_of(run) is run for run in runs):
        return Comparison((), is_reference=True)
    return Comparison(tuple(pairings(runs, ref_of, measure)))
