"""Argument checks every loader shares, in one error style.

ODB's loader and the baselines take the same kinds of arguments (an epoch, callables,
integer settings, a state dict); each check lives here once so both say the same thing
about the same mistake: what was wrong, the value, and what to change. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

__all__ = [
    "refuse_renamed",
    "check_callables",
    "check_epoch",
    "check_int",
    "check_state_keys",
    "state_pieces",
]


def check_int(name: str, value: object, minimum: int) -> None:
    """Refuse anything but an ``int >= minimum`` (bools too: ``True`` is never a count).

    Raises:
        TypeError: ``value`` is not an int.
        ValueError: ``value < minimum``.

    Example:
        >>> check_int("batch_size", 4, 1)
        >>> check_int("batch_size", 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: batch_size must be >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_epoch(epoch: object) -> int:
    """The epoch a loader's ``set_epoch`` was given, if it is an ``int >= 0``.

    Raises:
        ValueError: Anything else (the message shows it).

    Example:
        >>> check_epoch(3)
        3
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


def check_callables(**functions: Any) -> None:
    """Refuse a function argument that was given but cannot be called.

    ``None`` means "not given" and passes.

    Raises:
        TypeError: Names the argument and the type it got.

    Example:
        >>> check_callables(collate_fn=None, length_fn=len)
        >>> check_callables(collate_fn=3)
        Traceback (most recent call last):
        ...
        TypeError: collate_fn must be callable, got int
    """
    for name, fn in functions.items():
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")


def check_state_keys(state: Mapping[str, Any], keys: Collection[str], owner: str) -> None:
    """Refuse a loader state whose keys are not exactly ``keys``.

    Args:
        state: The dict given to ``load_state_dict``.
        keys: The keys that ``owner``'s ``state_dict()`` writes.
        owner: Who wrote it, for the message (e.g. ``"ODBLoader"``).

    Raises:
        ValueError: Names the missing and the unknown keys.

    Example:
        >>> check_state_keys({"epoch": 0}, ("epoch",), "ODBLoader")
        >>> check_state_keys({"epoch": 0, "x": 1}, ("epoch",), "ODBLoader")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: loader state has missing keys [] and unknown keys ['x']; pass the dict ...
    """
    missing = [k for k in keys if k not in state]
    unknown = sorted(set(state) - set(keys))
    if missing or unknown:
        raise ValueError(
            f"loader state has missing keys {missing} and unknown keys {unknown}; "
            f"pass the dict returned by {owner}.state_dict()"
        )


def state_pieces(
    pieces: Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> list[Mapping[str, Any]]:
    """The pieces a ``load_state_dict`` was given, as a non-empty list of dicts.

    Loaders save one piece per rank (no collective); a restore takes the list of them,
    or one dict where one piece is a whole state (a single-rank save).

    Raises:
        TypeError: Neither a dict nor a non-empty list or tuple of dicts.

    Example:
        >>> state_pieces({"epoch": 0})
        [{'epoch': 0}]
    """
    if isinstance(pieces, Mapping):
        return [pieces]
    if not isinstance(pieces, (list, tuple)) or not pieces:
        raise TypeError(
            "load_state_dict takes the state_dict() pieces of the saved ranks: a non-empty "
            f"list of dicts, or one dict (a whole state); got {type(pieces).__name__}"
        )
    for piece in pieces:
        if not isinstance(piece, Mapping):
            raise TypeError(f"a loader state piece must be a dict, got {type(piece).__name__}")
    return list(pieces)


def refuse_renamed(
    given: Mapping[str, Any] | Collection[str],
    renamed: Mapping[str, tuple[str, str]],
    fix: str,
    *,
    error: type[Exception] = ValueError,
    prefix: str = "",
    **values: Any,
) -> None:
    """Refuse a name given under its former spelling, naming the new one and why.

    The one wording of every renamed-name error of the project (loader options, run
    config sections, workflow config keys): ``"<prefix><old> was renamed <prefix><new>
    (<why>); <fix>"``, where ``renamed`` maps ``old -> (new, why)`` and ``fix`` says what
    to write instead, formatted with ``old``, ``new``, ``value`` (the given value, when
    ``given`` is a mapping) and ``values``.

    Example:
        >>> refuse_renamed({"window": 8}, {"window": ("buffer", "a clearer word")},
        ...                "pass {new}={value!r} instead", error=TypeError)
        Traceback (most recent call last):
        ...
        TypeError: window was renamed buffer (a clearer word); pass buffer=8 instead
    """
    for old in given:
        if old in renamed:
            new, why = renamed[old]
            value = given[old] if isinstance(given, Mapping) else None
            hint = fix.format(old=old, new=new, value=value, **values)
            raise error(f"{prefix}{old} was renamed {prefix}{new} ({why}); {hint}")
