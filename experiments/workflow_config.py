"""Which workflow config a run gets: one scale, whole, never two scales merged.

Snakemake merges every config file it is given key by key, so a Snakefile that always
loads the CPU scale and lets ``--profile slurm`` lay ``config/paper.yaml`` over it hands
every key the paper config does not set to the paper run at CPU scale (it once gave each
paper cell the CPU grid's 4 epochs). The rule here, used by the Snakefile and by every
tool that predicts what a run will do (the plan, the rehearsal):

- a given config that names its ``scale`` is a whole scale: ``--configfile
  config/paper.yaml`` (what the slurm profile passes), with later files and ``--config``
  values over it; nothing else is added;
- otherwise the given values (``--config`` overrides, a partial ``--configfile``) go over
  ``config/cpu.yaml``, the default scale of ``snakemake --cores 2`` and ``make reproduce``.

``tests/experiments/test_paper_plan.py`` keeps ``config/paper.yaml`` complete: every key
of ``config/cpu.yaml`` is set there too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from experiments.config_layers import merge_layers

ROOT = Path(__file__).resolve().parents[1]
CPU_CONFIG = ROOT / "config" / "cpu.yaml"
PAPER_CONFIG = ROOT / "config" / "paper.yaml"


def effective_config(given: Mapping[str, Any]) -> dict[str, Any]:
    """The workflow config a run gets from what it was ``given`` (config files and
    ``--config`` values, already merged in order): ``given`` itself when it names a
    ``scale``, else ``given`` over ``config/cpu.yaml``."""
    if "scale" in given:
        return dict(given)
    return merge_layers(yaml.safe_load(CPU_CONFIG.read_text()), given)


def load_files(*paths: Path) -> dict[str, Any]:
    """What ``snakemake --configfile paths...`` gives: the files merged in order, then
    :func:`effective_config`."""
    given: dict[str, Any] = {}
    for path in paths:
        given = merge_layers(given, yaml.safe_load(Path(path).read_text()) or {})
    return effective_config(given)
