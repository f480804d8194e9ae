"""Method name -> loader factory, one signature for all, so recipes are method-agnostic.

Every loader built here yields dict batches carrying an :class:`odb.StepInfo` (pop it
with :func:`odb.pop_step_info` before ``model(**batch)``) and has ``set_epoch``,
``stats``, ``progress``, ``state_dict`` and ``load_state_dict``.

Example:
    >>> from baselines import build_loader, needs_lengths
    >>> cache = LengthCache.load(path, dataset) if needs_lengths(method) else None  # doctest: +SKIP
    >>> loader = build_loader(method, dataset, token_budget=8192, lengths=cache,
    ...                       collate_fn=collate, cutoff_len=4096)           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import odb
from baselines.config import BaselineConfig
from baselines.length_cache import LengthSource
from baselines.loader import PlannedLoader
from baselines.methods import BMTLoader, GMTLoader, PackingLoader, SortedLoader, StandardLoader
from odb.kit import ResumableLoader

__all__ = ["METHODS", "Loader", "Method", "build_loader", "needs_lengths"]


class Loader(ResumableLoader, Protocol):
    """What every method's loader offers (ODB's loader surface): an epoch of batches, and
    the resume contract of :class:`odb.kit.ResumableLoader`."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...
    def set_epoch(self, epoch: int) -> None: ...
    def stats(self) -> dict[str, float | int]: ...
    def progress(self) -> float: ...


Factory = Callable[..., Loader]


@dataclass(frozen=True)
class Method:
    """One registered method.

    Attributes:
        name: The name recipes and configs use.
        factory: ``factory(dataset, token_budget, *, collate_fn, lengths, **options)``.
        needs_lengths: The method plans from per-sample lengths known in advance (pass
            ``lengths=``, normally a length cache).
        summary: One line for help texts.
    """

    name: str
    factory: Factory
    needs_lengths: bool
    summary: str


def _baseline(cls: type[PlannedLoader]) -> Factory:
    def factory(
        dataset: Any,
        token_budget: int,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        lengths: LengthSource | None = None,
        **options: Any,
    ) -> Loader:
        config = BaselineConfig.from_options(token_budget, options=options)
        return cls(dataset, config, collate_fn=collate_fn, lengths=lengths)

    return factory


def _odb(
    dataset: Any,
    token_budget: int,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    lengths: LengthSource | None = None,
    **options: Any,
) -> Loader:
    if lengths is not None:
        raise ValueError(
            "odb measures each sample after the pipeline; it takes no lengths=. "
            "Leave lengths=None (needs_lengths('odb') is False)"
        )
    return odb.ODBLoader(dataset, token_budget, collate_fn=collate_fn, **options)


METHODS: Mapping[str, Method] = {
    m.name: m
    for m in (
        Method(
            "standard",
            _baseline(StandardLoader),
            False,
            "shuffled fixed batches (token_budget // cutoff_len by default)",
        ),
        Method(
            "sorted",
            _baseline(SortedLoader),
            True,
            "fixed batches over a length-sorted order (cache or proxy lengths)",
        ),
        Method(
            "gmt",
            _baseline(GMTLoader),
            True,
            "greedy max-token groups over a sorted offline length cache",
        ),
        Method("bmt", _baseline(BMTLoader), True, "gmt groups balanced per step across ranks"),
        Method(
            "packing",
            _baseline(PackingLoader),
            True,
            "text-only packed rows with a block-causal mask",
        ),
        Method("odb", _odb, False, "online dynamic batching (odb.ODBLoader)"),
    )
}


def _method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]


def needs_lengths(method: str) -> bool:
    """Whether ``method`` needs ``lengths=`` (a length cache) to build its loader."""
    return _method(method).needs_lengths


def build_loader(
    method: str,
    dataset: Any,
    token_budget: int,
    *,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    lengths: LengthSource | None = None,
    **options: Any,
) -> Loader:
    """Build the loader of ``method``.

    Args:
        method: One of :data:`METHODS`.
        dataset: Map-style dataset of model-ready dict samples.
        token_budget: The step budget in tokens.
        collate_fn: List of samples -> dict batch (each method has a default).
        lengths: Per-sample lengths for the methods that need them (a
            :class:`~baselines.length_cache.LengthCache`, a list, or a proxy ``f(i)``).
        **options: Fields of :class:`baselines.BaselineConfig` (baselines) or
            :class:`odb.ODBConfig` (``"odb"``).

    Raises:
        ValueError: Unknown method, or settings the method refuses.
    """
    return _method(method).factory(
        dataset, token_budget, collate_fn=collate_fn, lengths=lengths, **options
    )
