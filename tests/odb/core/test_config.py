"""Tests for odb.core.config.ODBConfig: defaults, derived values and every validation path.

Each bad setting must fail at construction with TypeError/ValueError whose message
names the field and shows the bad value.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from odb.core.budget import TokenBudget
from odb.core.config import LoaderConfig, ODBConfig

# (field overrides, exception, fragments the message must contain)
BAD = [
    (dict(token_budget=0), ValueError, ["token_budget", "0"]),
    (dict(token_budget=-1), ValueError, ["token_budget", "-1"]),
    (dict(token_budget=True), TypeError, ["token_budget", "True"]),
    (dict(token_budget="8"), TypeError, ["token_budget", "'8'"]),
    (dict(token_budget=8.0), TypeError, ["token_budget", "8.0"]),
    (dict(token_budget=None), TypeError, ["token_budget", "None"]),
    (dict(cost_model="dense"), ValueError, ["cost_model", "'dense'"]),
    (dict(max_patches=0), ValueError, ["max_patches", "0"]),
    (dict(max_patches=-5), ValueError, ["max_patches", "-5"]),
    (dict(max_patches=True), TypeError, ["max_patches", "True"]),
    (dict(max_patches="4"), TypeError, ["max_patches", "'4'"]),
    (dict(policy="x"), ValueError, ["policy", "'x'"]),
    (dict(policy="Balanced"), ValueError, ["policy", "'Balanced'"]),
    (dict(policy=None), ValueError, ["policy", "None"]),
    (dict(collate_mode="fork"), ValueError, ["collate_mode", "'fork'"]),
    (dict(oversize="drop"), ValueError, ["oversize", "'drop'"]),
    (dict(shard="node"), ValueError, ["shard", "'node'"]),
    (dict(worker_start_method="thread"), ValueError, ["worker_start_method", "'thread'"]),
    (dict(collate_start_method="exec"), ValueError, ["collate_start_method", "'exec'"]),
    (dict(worker_timeout_s=-1), ValueError, ["worker_timeout_s", "-1"]),
    (dict(pin_memory="yes"), TypeError, ["pin_memory", "'yes'"]),
    (dict(start_timeout_s=0), ValueError, ["start_timeout_s", "0"]),
    (dict(join="yes"), TypeError, ["join", "'yes'"]),
    (dict(join=1), TypeError, ["join", "1"]),
    (dict(shuffle=None), TypeError, ["shuffle", "None"]),
    (dict(shift_labels=0), TypeError, ["shift_labels", "0"]),
    (dict(grad_accum_steps=0), ValueError, ["grad_accum_steps", "0"]),
    (dict(grad_accum_steps=-2), ValueError, ["grad_accum_steps", "-2"]),
    (dict(grad_accum_steps=2.0), TypeError, ["grad_accum_steps", "2.0"]),
    (dict(grad_accum_steps=True), TypeError, ["grad_accum_steps", "True"]),
    (dict(seed=-1), ValueError, ["seed", "-1"]),
    (dict(seed="0"), TypeError, ["seed", "'0'"]),
    (dict(num_workers=-1), ValueError, ["num_workers", "-1"]),
    (dict(num_workers=2, prefetch_factor=0), ValueError, ["prefetch_factor", "0"]),
    (dict(num_workers=2, prefetch_factor=1.5), TypeError, ["prefetch_factor", "1.5"]),
    (dict(prefetch_factor=2), ValueError, ["prefetch_factor", "num_workers"]),
    (dict(buffer_budgets=0), ValueError, ["buffer_budgets", "0"]),
    (dict(initial_buffer_budgets=0), ValueError, ["initial_buffer_budgets", "0"]),
    (dict(initial_buffer_budgets=2.0), TypeError, ["initial_buffer_budgets", "2.0"]),
    (dict(buffer_bytes=0), ValueError, ["buffer_bytes", "0"]),
    (dict(buffer_bytes=1e9), TypeError, ["buffer_bytes", "1000000000.0"]),
    (dict(buffer_bytes=None), TypeError, ["buffer_bytes", "None"]),
    (dict(buffer_size=0), ValueError, ["buffer_size", "0"]),
    (dict(buffer_size=-3), ValueError, ["buffer_size", "-3"]),
    (dict(queue_depth=0), ValueError, ["queue_depth", "0"]),
    (dict(max_round_steps=0), ValueError, ["max_round_steps", "0"]),
    (dict(queue_depth=4, max_round_steps=5), ValueError, ["max_round_steps=5", "queue_depth=4"]),
    (dict(age_limit=0), ValueError, ["age_limit", "0"]),
    (dict(age_limit=None), TypeError, ["age_limit", "None"]),
    (dict(ignore_index=-(2**63)), ValueError, ["ignore_index", str(-(2**63))]),
    (dict(ignore_index="-100"), TypeError, ["ignore_index", "'-100'"]),
    (dict(align_timeout_s=0), ValueError, ["align_timeout_s", "0"]),
    (dict(align_timeout_s=-1.5), ValueError, ["align_timeout_s", "-1.5"]),
    (dict(align_timeout_s=math.nan), ValueError, ["align_timeout_s", "nan"]),
    (dict(align_timeout_s=True), ValueError, ["align_timeout_s", "True"]),
    (dict(align_timeout_s="60"), ValueError, ["align_timeout_s", "'60'"]),
    (dict(init_timeout_s=0.0), ValueError, ["init_timeout_s", "0.0"]),
    (dict(init_timeout_s=-10), ValueError, ["init_timeout_s", "-10"]),
    (dict(length_key=""), ValueError, ["length_key", "''"]),
    (dict(length_key=None), ValueError, ["length_key", "None"]),
    (dict(label_key=""), ValueError, ["label_key", "''"]),
    (dict(label_key=3), ValueError, ["label_key", "3"]),
]


@pytest.mark.parametrize(
    "overrides, exc, fragments",
    BAD,
    ids=[" ".join(f"{k}={v!r}" for k, v in o.items()) for o, _, _ in BAD],
)
def test_bad_settings_fail_at_construction(overrides, exc, fragments):
    kwargs = dict(token_budget=64) | overrides
    with pytest.raises(exc) as err:
        ODBConfig(**kwargs)
    # The exact type asked for (ValueError is not a TypeError and vice versa).
    assert type(err.value) is exc, (type(err.value), err.value)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_every_validated_field_is_covered():
    fields = {f.name for f in dataclasses.fields(ODBConfig)}
    covered = {k for overrides, _, _ in BAD for k in overrides}
    # Fields that accept any value of their type (and so have no failure path).
    free = {"rendezvous_host"}
    assert fields - covered == free, fields - covered - free


def test_defaults_and_derived_values():
    cfg = ODBConfig(token_budget=8192)
    assert (cfg.policy, cfg.join, cfg.grad_accum_steps, cfg.collate_mode) == (
        "balanced",
        True,
        1,
        "process",
    )
    assert cfg.budget == TokenBudget(8192, "padded", None)
    assert cfg.buffer_tokens == cfg.buffer_budgets * 8192
    # The buffer starts at 4 budgets and doubles per round; at most 4 GiB of tensors.
    assert (cfg.initial_buffer_budgets, cfg.buffer_bytes) == (4, 4 * 2**30)


def test_the_round_step_cap_defaults_to_the_queue_depth():
    assert ODBConfig(token_budget=64, queue_depth=6).round_step_cap == 6
    assert ODBConfig(token_budget=64, queue_depth=6, max_round_steps=2).round_step_cap == 2


def test_valid_edge_values_are_accepted():
    cfg = ODBConfig(
        token_budget=1,
        cost_model="packed",
        max_patches=1,
        policy="paper",
        join=False,
        grad_accum_steps=1,
        seed=0,
        num_workers=1,
        prefetch_factor=1,
        buffer_budgets=1,
        buffer_size=1,
        queue_depth=1,
        age_limit=1,
        oversize="error",
        ignore_index=-(2**62),
        align_timeout_s=1e-3,
        init_timeout_s=math.inf,
        collate_mode="thread",
        rendezvous_host="node0",
    )
    assert cfg.budget == TokenBudget(1, "packed", 1)
    assert ODBConfig(token_budget=64, align_timeout_s=5).align_timeout_s == 5


def test_config_is_frozen():
    cfg = ODBConfig(token_budget=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.token_budget = 128  # type: ignore[misc]
    # dataclasses.replace re-validates.
    with pytest.raises(ValueError, match="queue_depth"):
        dataclasses.replace(cfg, queue_depth=0)


# --- the shared base and from_options ------------------------------------------------


def test_shared_fields_are_declared_once_in_loader_config():
    from baselines import BaselineConfig

    shared = {f.name for f in dataclasses.fields(LoaderConfig)}
    odb_fields = {f.name for f in dataclasses.fields(ODBConfig)}
    baseline_fields = {f.name for f in dataclasses.fields(BaselineConfig)}
    # cost_model differs on purpose: ODB's defaults to "padded", the baselines' None
    # takes each method's own.
    assert odb_fields & baseline_fields == shared | {"cost_model"}
    assert issubclass(ODBConfig, LoaderConfig) and issubclass(BaselineConfig, LoaderConfig)
    # The shared checks run for the baselines too, NaN timeouts included.
    for overrides, exc, _ in BAD:
        if set(overrides) <= shared:
            with pytest.raises(exc):
                BaselineConfig(**(dict(token_budget=64) | overrides))


def test_from_options_builds_the_config():
    cfg = ODBConfig.from_options(64, options={"grad_accum_steps": 2, "policy": "paper"})
    assert cfg == ODBConfig(token_budget=64, grad_accum_steps=2, policy="paper")
    assert ODBConfig.from_options(config=cfg) is cfg
    assert ODBConfig.from_options(64) == ODBConfig(token_budget=64)


@pytest.mark.parametrize(
    "options, fragments",
    [
        ({"grad_acum_steps": 2}, ["'grad_acum_steps'", "did you mean 'grad_accum_steps'"]),
        ({"tokens_per_batch": 8}, ["'tokens_per_batch'", "odb.ODBConfig", "token_budget"]),
        ({"zzz": 1, "polcy": "paper"}, ["options 'zzz', 'polcy' (did you mean 'policy'?)"]),
    ],
)
def test_from_options_names_unknown_options(options, fragments):
    with pytest.raises(TypeError) as err:
        ODBConfig.from_options(64, options=options)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


@pytest.mark.parametrize(
    "old, new",
    [
        ("window_budgets", "buffer_budgets"),
        ("initial_window_budgets", "initial_buffer_budgets"),
        ("window_bytes", "buffer_bytes"),
    ],
)
def test_a_former_field_name_is_refused_with_the_new_name(old, new):
    expected = rf"^{old} was renamed {new} \(the grouping buffer; .*\); pass {new}=7 instead$"
    with pytest.raises(TypeError, match=expected):
        ODBConfig(token_budget=64, **{old: 7})
    with pytest.raises(TypeError, match=expected):
        ODBConfig.from_options(64, options={old: 7})
    assert not hasattr(ODBConfig(token_budget=64), old)  # no alias
    assert ODBConfig.RENAMED_FIELDS[old][0] == new


def test_from_options_names_the_config_class_of_the_caller():
    from baselines import BaselineConfig

    with pytest.raises(
        TypeError,
        match=r"'batchsize' \(did you mean 'batch_size'\?\).*"
        r"fields of baselines\.BaselineConfig",
    ):
        BaselineConfig.from_options(64, options={"batchsize": 4})
    # Fields of the other loader's config are unknown here, by name.
    with pytest.raises(TypeError, match="'policy'"):
        BaselineConfig.from_options(64, options={"policy": "paper"})


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(token_budget=64, config=ODBConfig(token_budget=64)), ValueError, "not both"),
        (dict(config=ODBConfig(token_budget=64), options={"seed": 1}), ValueError, "not both"),
        (
            dict(config=LoaderConfig(token_budget=64)),
            TypeError,
            "must be an instance of odb.ODBConfig",
        ),
        (dict(options={"seed": 1}), ValueError, "token_budget is required"),
        (dict(token_budget=64, options={"token_budget": 8}), ValueError, "given twice"),
        (dict(token_budget=0), ValueError, "token_budget must be >= 1"),
    ],
)
def test_from_options_refuses_ambiguous_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ODBConfig.from_options(**kwargs)
