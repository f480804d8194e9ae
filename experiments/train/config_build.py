"""A typed config from a nested mapping: every key a dataclass field, every value checked.

`build` walks a frozen dataclass's type hints (nested dataclasses, ``Literal``,
optionals, tuples, mappings and scalars) and refuses an unknown key, a missing one or a
value of the wrong type with a `ConfigError` that names the dotted key and what to change.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal


class ConfigError(ValueError):
    """A train config that cannot run: the message names the key and what to change."""


def build(cls: type, data: Any, where: str = "") -> Any:
    """``cls(**data)`` with every value converted to its field's type hint, recursively.

    Raises:
        ConfigError: an unknown or missing key, or a value of the wrong type, named by
            its dotted path from ``where``.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config'} must be a mapping of keys, got "
                          f"{type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {_join(where, unknown[0])!r}; known keys of "
                          f"{where or 'the config'}: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, _join(where, name))
    missing = [n for n, f in fields.items() if n not in kwargs
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing key {_join(where, missing[0])!r} (required)")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value if value is not None else {}, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}={value!r} is not allowed; choose one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        kind = args[0]
        return tuple(_convert(kind, v, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is Any or origin in (Mapping, dict) or hint is Mapping:
        if origin in (Mapping, dict) and not isinstance(value, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value) if isinstance(value, Mapping) else value
    return _scalar(hint, value, where)


def _scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is float:
        try:
            if isinstance(value, bool):
                raise TypeError
            return float(value)  # YAML reads 1e-5 (no dot) as a string
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def plain(value: Any) -> Any:
    """Mappings and sequences as plain dicts and lists (JSON/YAML-safe), recursively."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
