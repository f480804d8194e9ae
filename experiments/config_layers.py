"""Config layers laid one over another: the one merge rule of every config here.

Pure (no torch), so the Snakefile and the workflow tools use it as the train entry point
does: a workflow config over its default scale (`experiments.workflow_config`), a train
config's layers and overrides (`experiments.train.config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_layers(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, recursively for mappings; other values are replaced (the
    rule Snakemake applies to its config files).

    Example:
        >>> merge_layers({"a": {"x": 1, "y": 2}}, {"a": {"y": 3}})
        {'a': {'x': 1, 'y': 3}}
    """
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_layers(out[key], value)
        else:
            out[key] = value
    return out
