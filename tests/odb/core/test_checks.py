"""Tests for odb.core.checks: the argument checks every loader shares."""

from __future__ import annotations

import pytest

import odb.kit


@pytest.mark.parametrize(
    "value, exc, fragment",
    [
        (True, TypeError, "True"),
        (2.0, TypeError, "float 2.0"),
        ("3", TypeError, "'3'"),
        (0, ValueError, ">= 1, got 0"),
    ],
)
def test_check_int(value, exc, fragment):
    odb.kit.check_int("batch_size", 1, 1)
    with pytest.raises(exc) as err:
        odb.kit.check_int("batch_size", value, 1)
    assert type(err.value) is exc and "batch_size" in str(err.value) and fragment in str(err.value)


@pytest.mark.parametrize("epoch", [-1, True, 1.0, "2", None])
def test_check_epoch_refuses_what_is_not_an_epoch(epoch):
    assert odb.kit.check_epoch(0) == 0 and odb.kit.check_epoch(7) == 7
    with pytest.raises(ValueError, match=rf"epoch must be an int >= 0, got {epoch!r}"):
        odb.kit.check_epoch(epoch)


def test_check_callables_names_the_argument():
    odb.kit.check_callables(collate_fn=len, length_fn=None)
    with pytest.raises(TypeError, match="length_fn must be callable, got str"):
        odb.kit.check_callables(collate_fn=len, length_fn="len")


def test_check_state_keys_names_missing_and_unknown_keys():
    odb.kit.check_state_keys({"a": 1, "b": 2}, ("a", "b"), "GMTLoader")
    with pytest.raises(ValueError) as err:
        odb.kit.check_state_keys({"a": 1, "c": 3}, ("a", "b"), "GMTLoader")
    message = str(err.value)
    assert "missing keys ['b']" in message and "unknown keys ['c']" in message
    assert "GMTLoader.state_dict()" in message


def test_state_pieces_takes_one_dict_or_a_list_of_them():
    assert odb.kit.state_pieces({"a": 1}) == [{"a": 1}]
    assert odb.kit.state_pieces(({"a": 1}, {"a": 2})) == [{"a": 1}, {"a": 2}]
    for bad, fragment in [([], "non-empty list"), ("state", "got str"), ([{"a": 1}, 3], "int")]:
        with pytest.raises(TypeError, match=fragment):
            odb.kit.state_pieces(bad)
