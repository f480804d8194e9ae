"""The seam other loaders build on: ODB's rules and pieces, for loaders that are not ODB.

A training loop needs only :mod:`odb`. A loader that forms its batches differently (the
baselines in ``baselines/`` are such loaders) uses these pieces as well, so that its
batches, figures and state follow the same rules as ODB's and compare one to one:

- the shared config fields and their checks: :class:`~odb.kit.LoaderConfig` (``ODBConfig`` and
  ``baselines.BaselineConfig`` derive from it);
- a collated batch's check, an IDLE step's mask and its loss tokens: :func:`finish_batch`;
- the per-epoch figures, each defined once: :class:`StepMetrics`;
- the private count group of the collate side, apart from the trainer's process group:
  :func:`open_rendezvous` and :class:`AlignmentGroup`;
- the grouper and its cost: :func:`form_groups` over :class:`SizedSample` items,
  priced by :class:`odb.TokenBudget` through :class:`GroupMeasure`;
- argument and state checks with one error wording: :func:`check_int`,
  :func:`check_epoch`, :func:`check_callables`, :func:`check_state_keys`,
  :func:`state_pieces`, and :func:`refuse_renamed` (every renamed-name error's wording);
- what a resumable loader is (per-rank pieces saved, every rank's pieces loaded):
  :class:`ResumableLoader`, and :class:`GatheredState`, its torchdata ``Stateful``.

Example:
    >>> from odb.kit import SizedSample, form_groups
    >>> from odb import TokenBudget
    >>> [g.keys for g in form_groups([SizedSample(0, 6), SizedSample(1, 4)], TokenBudget(8))]
    [(0,), (1,)]
"""

from odb._process.comm import AlignmentGroup
from odb._process.rendezvous import open_rendezvous
from odb.core.budget import GroupMeasure
from odb.core.checks import (
    check_callables,
    check_epoch,
    check_int,
    check_state_keys,
    refuse_renamed,
    state_pieces,
)
from odb.core.config import LoaderConfig
from odb.core.grouping import SizedSample, form_groups
from odb.core.metrics import StepMetrics
from odb.core.step_info import finish_batch
from odb.resumable import GatheredState, ResumableLoader

__all__ = [
    "AlignmentGroup",
    "GatheredState",
    "GroupMeasure",
    "LoaderConfig",
    "ResumableLoader",
    "SizedSample",
    "StepMetrics",
    "check_callables",
    "check_epoch",
    "check_int",
    "check_state_keys",
    "finish_batch",
    "form_groups",
    "open_rendezvous",
    "refuse_renamed",
    "state_pieces",
]
