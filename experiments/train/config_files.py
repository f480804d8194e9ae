"""The train config from YAML layers: files (each with its ``include:`` files) then overrides.

A run is described by a few small YAML files composed in order (scale, model, method,
mode, strategy; see ``experiments/configs/``) plus ``key=value`` overrides on the command
line, e.g. ``method.name=gmt optim.lr=2e-5``. A file may name other files to merge
first with ``include: [relative/path.yaml, ...]``. Later layers win, key by key.

Example:
    >>> cfg = load_config(["experiments/configs/cpu_quick.yaml"],
    ...                   ["method.name=standard"])          # doctest: +SKIP
    >>> cfg.method.name                                      # doctest: +SKIP
    'standard'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from experiments.config_layers import merge_layers
from experiments.train.config import TrainConfig, refuse_renamed_sections
from experiments.train.config_build import ConfigError

__all__ = ["load_config", "parse_override"]


def _read_layer(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """One YAML file with its ``include:`` files merged underneath it."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config include cycle: {' -> '.join(map(str, (*seen, path)))}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    includes = data.pop("include", [])
    refuse_renamed_sections(data, "rename the section '{old}:' of {path} to '{new}:'", path=path)
    merged: dict[str, Any] = {}
    for rel in [includes] if isinstance(includes, str) else includes:
        merged = merge_layers(merged, _read_layer(path.parent / rel, (*seen, path)))
    return merge_layers(merged, data)


def parse_override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` -> ``{"a": {"b": {"c": value}}}`` (value read as YAML).

    Example:
        >>> parse_override("optim.lr=2e-5")
        {'train': {'lr': '2e-5'}}
    """
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} must look like section.key=value")
    value: Any = yaml.safe_load(raw) if raw else ""
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


def load_config(files: Sequence[str | Path], overrides: Sequence[str] = ()) -> TrainConfig:
    """Merge ``files`` (each with its includes) then ``overrides``, and validate."""
    if not files:
        raise ConfigError("give at least one --config file (see experiments/configs/)")
    merged: dict[str, Any] = {}
    for path in files:
        merged = merge_layers(merged, _read_layer(Path(path)))
    for text in overrides:
        override = parse_override(text)
        rest = text[len(next(iter(override))):]  # what follows the section: ".key=value"
        refuse_renamed_sections(
            override, "write {new}{rest} instead of {text}", rest=rest, text=text
        )
        merged = merge_layers(merged, override)
    return TrainConfig.from_dict(merged)
