"""Online Dynamic Batching: token-budgeted batches formed after preprocessing, DDP-aligned.

Needs only torch. These names are what a training loop uses: the loader
(:class:`ODBLoader`, :func:`wrap`) and its config, the token budget, the collate helpers,
the step info every batch carries and the loss normaliser it holds, the resume state and
the errors a loader raises; and, before training, :func:`plan` (what ODB gives on a
dataset, at which budget). Framework adapters live in :mod:`odb.integrations` and
import their framework lazily. Loaders that are not ODB build on :mod:`odb.kit`.

Layout: ``odb/core`` is the pure logic (budget, grouping, alignment, rounds, ...),
``odb/_process`` the collate process, its transports and I/O; neither is imported from
outside ``odb`` (``docs/architecture.md``).

``odb.__version__`` is the installed distribution's version (``importlib.metadata``);
``"0+unknown"`` when ``odb`` is imported from a checkout that was never installed.

Example:
    >>> import odb
    >>> loader = odb.ODBLoader(dataset, token_budget=8192, num_workers=4)  # doctest: +SKIP
    >>> for batch in loader:                                                # doctest: +SKIP
    ...     info = odb.pop_step_info(batch)
    ...     model(**batch, num_items_in_batch=info.loss_normalizer).loss.backward()
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from odb._process.comm import AlignmentTimeoutError
from odb.collate import PadCollate, TensorParts, batch_cat, batch_empty, batch_parts
from odb.core.budget import CostModel, TokenBudget
from odb.core.config import ODBConfig
from odb.core.lockstep import PeerFailedError
from odb.core.loss import AccumulationNormalizer, count_loss_tokens
from odb.core.resume import LoaderState
from odb.core.step_info import STEP_INFO_KEY, StepInfo, pop_step_info
from odb.loader import ODBLoader
from odb.planning import plan
from odb.wrapping import wrap

try:
    __version__ = _version("odb")
except _PackageNotFoundError:  # a checkout on sys.path, never installed: no metadata
    __version__ = "0+unknown"  # PEP 440, below every release

__all__ = [
    "STEP_INFO_KEY",
    "AccumulationNormalizer",
    "AlignmentTimeoutError",
    "CostModel",
    "LoaderState",
    "ODBConfig",
    "ODBLoader",
    "PadCollate",
    "PeerFailedError",
    "StepInfo",
    "TensorParts",
    "TokenBudget",
    "batch_cat",
    "batch_empty",
    "batch_parts",
    "count_loss_tokens",
    "plan",
    "pop_step_info",
    "wrap",
]
