"""Online Dynamic Batching: token-budgeted batches formed after preprocessing, DDP-aligned.

Needs only torch. Framework adapters live in :mod:`odb.integrations` and import their
framework lazily.

Besides the loader, odb exports the base other loaders build on (the baselines in
``baselines/`` do): the shared config fields (:class:`LoaderConfig`), the step-info
rules (:func:`finish_batch`, :class:`AccumulationNormalizer`), the metrics with one
definition of each figure (:class:`StepMetrics`), the private count group
(:func:`open_rendezvous`, :class:`AlignmentGroup`), the resume state
(:class:`LoaderState`), the grouper (:func:`form_groups`) and the argument checks.

Example:
    >>> import odb
    >>> loader = odb.ODBLoader(dataset, token_budget=8192, num_workers=4)  # doctest: +SKIP
    >>> for batch in loader:                                                # doctest: +SKIP
    ...     info = odb.pop_step_info(batch)
    ...     model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
"""

from odb.budget import CostModel, GroupMeasure, TokenBudget
from odb.checks import (
    check_callables,
    check_epoch,
    check_int,
    check_state_keys,
    state_pieces,
)
from odb.collate import PadCollate, TensorParts, batch_cat, batch_empty, batch_parts
from odb.comm import AlignmentGroup, AlignmentTimeoutError, open_rendezvous
from odb.config import LoaderConfig, ODBConfig
from odb.engine import PeerFailedError
from odb.grouping import Item, form_groups
from odb.loader import ODBLoader, wrap
from odb.loss import AccumulationNormalizer, count_loss_tokens
from odb.metrics import StepMetrics
from odb.resume import LoaderState
from odb.step_info import STEP_INFO_KEY, StepInfo, finish_batch, pop_step_info

__all__ = [
    "STEP_INFO_KEY",
    "AlignmentGroup",
    "AlignmentTimeoutError",
    "CostModel",
    "GroupMeasure",
    "Item",
    "LoaderConfig",
    "LoaderState",
    "ODBConfig",
    "ODBLoader",
    "PadCollate",
    "PeerFailedError",
    "StepInfo",
    "StepMetrics",
    "TensorParts",
    "TokenBudget",
    "AccumulationNormalizer",
    "batch_cat",
    "batch_empty",
    "batch_parts",
    "check_callables",
    "check_epoch",
    "check_int",
    "check_state_keys",
    "count_loss_tokens",
    "finish_batch",
    "form_groups",
    "open_rendezvous",
    "pop_step_info",
    "state_pieces",
    "wrap",
]
