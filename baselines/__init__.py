"""Baseline loaders compared against ODB: Standard, Sorted, GMT/BMT length-cache, Packing.

They share ODB's loader interface and step info so recipes can swap methods freely:
every loader yields dict batches carrying an :class:`odb.StepInfo`, yields the same
number of steps on every rank (IDLE steps pad the short ranks; nothing is dropped),
and has ``set_epoch``, ``stats``, ``progress``, ``state_dict`` and ``load_state_dict``
(exactly-once mid-epoch resume). :func:`build_loader` maps a method name (including
``"odb"``) to its loader. Libraries only: no experiment paths, grids or environment
reads; depends on :mod:`odb` and torch.

Example:
    >>> import baselines, odb
    >>> loader = baselines.build_loader("gmt", dataset, token_budget=8192,
    ...                                 lengths=cache)          # doctest: +SKIP
    >>> for batch in loader:                                     # doctest: +SKIP
    ...     info = odb.pop_step_info(batch)
    ...     model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
"""

from baselines.config import BaselineConfig
from baselines.length_cache import LengthCache, StaleCacheError
from baselines.loader import PlannedLoader
from baselines.methods import (
    BMTLoader,
    GMTLoader,
    PackCollate,
    PackingLoader,
    SortedLoader,
    StandardLoader,
    block_causal_mask,
)
from baselines.registry import METHODS, build_loader, needs_lengths

__all__ = [
    "METHODS",
    "BMTLoader",
    "BaselineConfig",
    "GMTLoader",
    "LengthCache",
    "PackCollate",
    "PackingLoader",
    "PlannedLoader",
    "SortedLoader",
    "StaleCacheError",
    "StandardLoader",
    "block_causal_mask",
    "build_loader",
    "needs_lengths",
]
