"""How ``make test``'s two pytest-xdist workers (``-n 2``) share the suite.

One worker runs the modules that start the local Slurm cluster (:data:`SLURM_MODULES`),
one after the other, so one cluster is up at a time; the other runs every other test, in
collection order. The Slurm tests spend most of their time waiting (Slurm's and
Snakemake's job starts, the Slurm executor's polling), so they fit beside the rest; two
halves of the rest side by side would put two tests' rank processes on the 2 cores.

A module with a ``slurm`` test belongs to :data:`SLURM_MODULES`; collection fails, naming
the module, when it is missing, so a new Slurm test cannot run beside the others (two
clusters at once would share ``/etc/hosts`` and the site's ``slurm.conf`` link).

Without ``-n`` nothing changes: every test runs in this process, in order. (xdist's own
``--dist loadgroup`` would do this with a mark, but its 3.8.0 groups through
``item._nodeid``, which pytest 9 no longer reads.)
"""

from __future__ import annotations

from typing import Any

import pytest

SLURM_MODULES = frozenset({
    "tests/experiments/test_cluster.py",
    "tests/experiments/test_rehearsal.py",
})  # fmt: skip


def worker_group(nodeid: str) -> str:
    """The worker a test runs on: ``slurm`` or ``rest``."""
    return "slurm" if nodeid.split("::", 1)[0] in SLURM_MODULES else "rest"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    marked = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slurm")}
    if marked - SLURM_MODULES:
        raise pytest.UsageError(
            f"tests/workers.py: add {sorted(marked - SLURM_MODULES)} to SLURM_MODULES: its "
            "slurm tests must run on the Slurm worker, one cluster at a time"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class SlurmApart(LoadScopeScheduling):
        """xdist's scope scheduling with two scopes: a worker each, largest first."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return SlurmApart(config, log)
