"""How ``make test``'s two pytest-xdist workers (``-n 2``) share the suite.

The second worker runs the modules that start the local Slurm cluster
(:data:`SLURM_MODULES`), one after the other, so one cluster is up at a time, the train
entry point's, the example loops' resume, the examples', TRL's, the trainer settings',
the real-pipeline benchmark's and the workflow's runs (:data:`RUN_MODULES`: whole
``torchrun``, benchmark and Snakemake runs, no timeout that must fire inside them), then
the protocol core's single-process tests (:data:`CORE`: properties and state machines,
no clock in them); the first runs every other test, in collection order. The Slurm tests
spend most of their time waiting (Slurm's and Snakemake's job starts, the Slurm
executor's polling) and the rest leaves about one core idle on average (rank processes
wait on each other, on start-up and on timeouts that must fire), so the second worker's
tests fit beside the rest. The fault and lifecycle tests, whose timeouts fire on
purpose, stay together on the first. Measured shares (one clean-clone run of 19f3813,
junit times): first 1076 s, second 373 s with the Slurm modules and the core only; the
run modules add 292 s to the second. With those, one clean-clone run of 5d3518c (load
from other work): first 1082 s, second 851 s; the example loops' resume and the
real-pipeline benchmark (about 100 s together) moved to the second after it. Once the
train tests ran on warm ranks (issue 47), a clean clone of dd9463b: first 915 s (a hung
test's 180 s apart), second 718 s; the TRL tests and the examples' runs (about 95 s,
whole `torchrun` runs) moved to the second. With the fault ranks forked from a fork
server, a run of f83dd02 (a per-test CPU plugin): the first ended at 855 s, the second
at 788 s; the trainer-settings runs (29 s) moved.

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
RUN_MODULES = frozenset({
    "tests/experiments/train/test_resume.py",
    "tests/experiments/train/test_run.py",
    "tests/experiments/train/test_exact_loss.py",
    "tests/test_workflow.py",
    "tests/odb/integrations/test_loop_resume.py",
    "tests/bench/test_real_pipeline.py",
    "tests/odb/integrations/test_trl.py",
    "tests/odb/integrations/test_examples.py",
    "tests/odb/test_trainer_settings.py",
})  # fmt: skip
CORE = "tests/odb/core/"


def worker_group(nodeid: str) -> str:
    """The share a test belongs to: ``beside`` (the second worker's) or ``rest``."""
    path = nodeid.split("::", 1)[0]
    beside = path in SLURM_MODULES or path in RUN_MODULES or path.startswith(CORE)
    return "beside" if beside else "rest"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    marked = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slurm")}
    if marked - SLURM_MODULES:
        raise pytest.UsageError(
            f"tests/workers.py: add {sorted(marked - SLURM_MODULES)} to SLURM_MODULES: its "
            "slurm tests must run on the second worker, one cluster at a time"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class TwoShares(LoadScopeScheduling):
        """xdist's scope scheduling with two scopes, ``rest`` and ``beside``: one per
        worker, each run in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return TwoShares(config, log)
