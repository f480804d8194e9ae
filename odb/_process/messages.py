"""What crosses between the loader and its collate side: the spec, the jobs, the results.

The loader sends its collate side one :class:`CollateSpec` (the user's objects, once per
collate side) and one :class:`EpochJob` per epoch; each epoch ends with one
:class:`EpochResult`. In process mode all three are pickled across the boundary, so
every field must be picklable; in thread mode they pass as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from odb.core.config import ODBConfig
from odb.core.steps import SampleMeter


@dataclass
class CollateSpec:
    """The user's objects the collate side runs (must be picklable in process mode)."""

    dataset: Any
    collate_fn: Callable[[list[Any]], Any]
    meter: SampleMeter
    worker_init_fn: Callable[[int], None] | None = None


@dataclass
class EpochJob:
    """Everything one rank's collate side needs for one epoch (picklable)."""

    config: ODBConfig
    epoch: int
    rank: int
    world_size: int
    view: list[int] | None
    skip: frozenset[int] = frozenset()
    carried: list[tuple[int, Any]] = field(default_factory=list)
    shard: str = "odb"
    # This rank's row of the epoch's cross-rank source check (odb.core.sharding.source_row).
    source_row: list[int] = field(default_factory=list)


@dataclass
class EpochResult:
    """What an epoch leaves behind: unread or unemitted indices (non-join) and metrics."""

    carry: list[int]
    metrics: dict[str, float | int]
    carried_samples: list[tuple[int, Any]] = field(default_factory=list)
