"""Before training: what ODB gives on a dataset, which token budget to choose, and
whether it fits in memory.

:func:`plan` measures a seeded sample of a map-style dataset through its own
``__getitem__`` (lengths as the loader measures them) and runs ODB's real round
protocol over them (``odb.planning.simulate``, no processes) for each candidate
budget and world size, against the fixed-batch Standard and the offline oracle. With a
training step and CUDA it also searches the largest budget that fits memory
(``odb.planning.probe``). ``python -m odb.planning`` does the same from a shell.

Example:
    >>> report = odb.plan(dataset, world_sizes=[1, 8])  # doctest: +SKIP
    >>> print(report.table())                            # doctest: +SKIP
"""

from odb.planning.forecast import StepCost
from odb.planning.hardware import Gpu, gpu
from odb.planning.models import Architecture, architecture
from odb.planning.plan import plan
from odb.planning.probe import MemoryProbe, ProbeResult, search_budget
from odb.planning.report import PlanReport
from odb.planning.step_cost import Constants, Setup, StepModel

__all__ = [
    "Architecture",
    "Constants",
    "Gpu",
    "MemoryProbe",
    "PlanReport",
    "ProbeResult",
    "Setup",
    "StepCost",
    "StepModel",
    "architecture",
    "gpu",
    "plan",
    "search_budget",
]
