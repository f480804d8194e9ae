"""The public surface: ``odb.__all__`` for a training loop, ``odb.kit`` for other loaders."""

from __future__ import annotations

import doctest

import odb
import odb.kit


def test_the_user_api_is_small_and_apart_from_the_kit() -> None:
    assert len(odb.__all__) <= 20, odb.__all__
    assert not set(odb.__all__) & set(odb.kit.__all__)


def test_every_public_name_exists() -> None:
    missing = [n for n in odb.__all__ if not hasattr(odb, n)]
    missing += [f"kit.{n}" for n in odb.kit.__all__ if not hasattr(odb.kit, n)]
    assert not missing, missing


def test_the_kit_docstring_example_runs() -> None:
    assert doctest.testmod(odb.kit).failed == 0
