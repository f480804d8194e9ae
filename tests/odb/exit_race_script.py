"""Run by tests/odb/test_exit_race.py and ``bench.exit_race``: exit right after a collective.

Under torchrun::

    python tests/odb/exit_race_script.py {bare,odb}

Each rank all-reduces a tensor Python made on the default Gloo group and the script
ends: Gloo's worker thread then still has to take the GIL to drop the tensor, racing the
interpreter's finalization (``odb/_process/gil_handoff.py``). ``odb`` imports ``odb``
first, whose exit hook hands the GIL over before finalization; ``bare`` does not. The
exit code is the verdict: -6 (SIGABRT, "terminate called without an active exception")
when the worker thread lost the race.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

if sys.argv[1] == "odb":
    import odb  # noqa: F401  (its exit hook)

dist.init_process_group("gloo")
tensor = torch.ones(4)
dist.all_reduce(tensor)
