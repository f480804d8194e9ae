"""Objects named in JSON: ``{"_target_": "module:callable", ...}`` built as in Hydra.

The length cache's command line builds its dataset from such a factory path, so the
library never imports an experiment.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["import_target", "instantiate"]


def instantiate(value: Any) -> Any:
    """Builds ``{"_target_": "module:callable", **kwargs}`` values, recursively.

    Example:
        >>> instantiate({"_target_": "fractions:Fraction", "numerator": 1, "denominator": 3})
        Fraction(1, 3)
    """
    if isinstance(value, list):
        return [instantiate(v) for v in value]
    if not isinstance(value, dict):
        return value
    value = {k: instantiate(v) for k, v in value.items()}
    if "_target_" not in value:
        return value
    return import_target(value.pop("_target_"))(**value)


def import_target(path: str) -> Callable[..., Any]:
    """``"package.module:name"`` (or ``"package.module.name"``) to the object it names."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    if not module or not name:
        raise ValueError(f"factory path must look like 'package.module:callable', got {path!r}")
    target = getattr(importlib.import_module(module), name, None)
    if target is None or not callable(target):
        raise ValueError(f"{path!r} does not name a callable in module {module!r}")
    return target
