"""Online Dynamic Batching: token-budgeted batches formed after preprocessing, DDP-aligned.

Needs only torch. Framework adapters live in :mod:`odb.integrations` and import their
framework lazily.

Example:
    >>> import odb
    >>> loader = odb.ODBLoader(dataset, token_budget=8192, num_workers=4)  # doctest: +SKIP
    >>> for batch in loader:                                                # doctest: +SKIP
    ...     info = odb.pop_step_info(batch)
    ...     model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
"""

from odb.budget import GroupMeasure, TokenBudget
from odb.collate import PadCollate
from odb.comm import AlignmentTimeoutError
from odb.config import ODBConfig
from odb.engine import PeerFailedError
from odb.loader import ODBLoader, wrap
from odb.loss import count_loss_tokens
from odb.step_info import STEP_INFO_KEY, StepInfo, pop_step_info

__all__ = [
    "STEP_INFO_KEY",
    "AlignmentTimeoutError",
    "GroupMeasure",
    "ODBConfig",
    "ODBLoader",
    "PadCollate",
    "PeerFailedError",
    "StepInfo",
    "TokenBudget",
    "count_loss_tokens",
    "pop_step_info",
    "wrap",
]
