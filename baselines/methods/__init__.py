"""The five baseline methods, one module each: a plan and its loader.

Each loader is :class:`~baselines.loader.PlannedLoader` (or its fixed-batch or
token-budgeted base) plus the method's plan; the plan decides the whole epoch from the
pool and, for all but Standard, lengths known in advance.

=========== ============================== ====================== ======================
method      batches                        lengths from           IDLE steps when
=========== ============================== ====================== ======================
standard    fixed size, shuffled           none                   a rank's view needs
                                                                  one batch fewer
sorted      fixed size, length-sorted      cache or proxy         the last step has < W
                                                                  batches
gmt         greedy token-budget groups     length cache           groups % W != 0
bmt         gmt, balanced per step         length cache           groups % W != 0
packing     concatenated rows (text only)  length cache           rows % W != 0
=========== ============================== ====================== ======================

No method drops a sample: every sample is in exactly one step per epoch, and the ranks
that are one step short get an IDLE step (see :mod:`baselines.plans`). Every shuffle is
seeded with the loader's ``seed + epoch``. A new method is a module here with its plan
(``plan(pool, world_size, seed) -> Plan``) and its loader, registered in
:mod:`baselines.registry`.

Example:
    >>> from baselines import BaselineConfig, GMTLoader, LengthCache
    >>> cache = LengthCache.load("results/cache/ultrachat.json", dataset)  # doctest: +SKIP
    >>> loader = GMTLoader(dataset, BaselineConfig(token_budget=8192),
    ...                    lengths=cache)                                  # doctest: +SKIP
"""

from baselines.methods.bmt import BMTLoader, BMTPlan
from baselines.methods.gmt import GMTLoader, GMTPlan
from baselines.methods.packing import PackCollate, PackingLoader, PackingPlan, block_causal_mask
from baselines.methods.sorted import SortedLoader, SortedPlan
from baselines.methods.standard import StandardLoader, StandardPlan

__all__ = [
    "BMTLoader",
    "BMTPlan",
    "GMTLoader",
    "GMTPlan",
    "PackCollate",
    "PackingLoader",
    "PackingPlan",
    "SortedLoader",
    "SortedPlan",
    "StandardLoader",
    "StandardPlan",
    "block_causal_mask",
]
