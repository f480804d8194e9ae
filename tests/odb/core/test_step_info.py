"""Tests for odb.core.step_info: the StepInfo record and the pop_step_info boundary."""

from __future__ import annotations

import dataclasses
import types
from collections import OrderedDict, UserDict

import pytest

import odb.kit
from odb.core.step_info import STEP_INFO_KEY, StepInfo, pop_step_info


def info(**overrides) -> StepInfo:
    fields = dict(
        epoch=0,
        step=3,
        round=1,
        idle=False,
        sample_ids=(4, 9),
        local_samples=2,
        global_samples=5,
        local_loss_tokens=11,
        global_loss_tokens=30,
        accumulation_loss_tokens=30,
        loss_normalizer=15.0,
        world_size=2,
        rank=1,
    )
    return StepInfo(**(fields | overrides))


@pytest.mark.parametrize("kind", [dict, OrderedDict, UserDict])
def test_pop_step_info_pops_and_leaves_the_model_inputs(kind):
    record = info()
    batch = kind(input_ids=[1, 2], labels=[2, 3])
    batch[STEP_INFO_KEY] = record
    assert pop_step_info(batch) is record
    assert STEP_INFO_KEY not in batch
    assert list(batch) == ["input_ids", "labels"]


def test_pop_step_info_twice_raises_key_error():
    batch = {"input_ids": [1], STEP_INFO_KEY: info()}
    pop_step_info(batch)
    with pytest.raises(KeyError, match=STEP_INFO_KEY):
        pop_step_info(batch)


def test_pop_step_info_on_a_foreign_batch_raises_key_error():
    with pytest.raises(KeyError, match="did not come from an ODB loader"):
        pop_step_info({"input_ids": [1]})


@pytest.mark.parametrize(
    "batch",
    [
        [1, 2],
        (STEP_INFO_KEY,),
        "batch",
        None,
        3,
        types.MappingProxyType({STEP_INFO_KEY: "x"}),
    ],  # read-only mapping: cannot pop
)
def test_pop_step_info_rejects_non_mutable_mappings(batch):
    with pytest.raises(TypeError, match=type(batch).__name__):
        pop_step_info(batch)


def test_pop_step_info_is_exported():
    assert odb.pop_step_info is pop_step_info


def test_step_info_is_frozen_and_idle_shape():
    record = info(idle=True, sample_ids=(), local_samples=0, local_loss_tokens=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 4  # type: ignore[misc]
    assert record.idle and record.sample_ids == () and record.local_samples == 0


# --- finish_batch: the check, IDLE mask and loss-token count every loader shares ------


def test_finish_batch_counts_loss_tokens_after_the_shift():
    import torch

    from odb.core.config import LoaderConfig

    labels = torch.tensor([[7, 8, 9, -100], [-100, 5, -100, -100]])
    assert odb.kit.finish_batch({"labels": labels}, LoaderConfig(token_budget=8), idle=False) == 3
    unshifted = LoaderConfig(token_budget=8, shift_labels=False)
    assert odb.kit.finish_batch({"labels": labels}, unshifted, idle=False) == 4


def test_finish_batch_masks_an_idle_step_without_touching_the_sample():
    import torch

    from odb.core.config import LoaderConfig

    sample_labels = torch.tensor([[1, 2, 3]])
    batch = {"input_ids": torch.tensor([[4, 5, 6]]), "labels": sample_labels}  # a view
    config = LoaderConfig(token_budget=8, ignore_index=-1)
    assert odb.kit.finish_batch(batch, config, idle=True) == 0
    assert batch["labels"].tolist() == [[-1, -1, -1]] and batch["labels"].dtype == torch.int64
    assert sample_labels.tolist() == [[1, 2, 3]]  # replaced, not written in place


@pytest.mark.parametrize(
    "batch, exc, fragment",
    [
        ([1, 2], TypeError, "returned a list"),
        ({"input_ids": [1]}, ValueError, "no label tensor 'labels'"),
        ({"labels": [1, 2]}, ValueError, "no label tensor 'labels'"),
    ],
)
def test_finish_batch_refuses_what_cannot_carry_a_step(batch, exc, fragment):
    from odb.core.config import LoaderConfig

    with pytest.raises(exc, match=fragment):
        odb.kit.finish_batch(batch, LoaderConfig(token_budget=8), idle=False)


def test_the_old_name_of_the_accumulation_tokens_still_reads() -> None:
    assert info(accumulation_loss_tokens=42).window_loss_tokens == 42
