"""One factory signature for every method, ODB included; settings a method refuses."""

from __future__ import annotations

import pytest

import odb
from baselines import METHODS, BMTLoader, PackingLoader, StandardLoader, build_loader
from baselines import needs_lengths as needs
from baselines.length_cache import build
from tests.baselines.toy import ToyDataset


def test_registry_names_every_method() -> None:
    assert sorted(METHODS) == ["bmt", "gmt", "odb", "packing", "sorted", "standard"]
    assert [m for m in METHODS if needs(m)] == ["sorted", "gmt", "bmt", "packing"]
    with pytest.raises(ValueError, match="unknown method 'fixed'"):
        build_loader("fixed", ToyDataset(4), 64)


def test_factories_build_the_right_loaders() -> None:
    ds = ToyDataset(10)
    cache = build(ds)
    assert isinstance(build_loader("standard", ds, 256, cutoff_len=128), StandardLoader)
    assert isinstance(build_loader("bmt", ds, 256, lengths=cache), BMTLoader)
    assert isinstance(build_loader("packing", ds, 256, lengths=cache), PackingLoader)
    loader = build_loader("odb", ds, 256, collate_mode="thread")
    assert isinstance(loader, odb.ODBLoader)


@pytest.mark.parametrize(
    "method, options, match",
    [
        ("gmt", {"batch_size": 4}, "no meaning for the 'gmt' method"),
        ("packing", {"cost_model": "padded"}, "packing prices a row"),
        ("standard", {}, "cutoff_len"),
        ("standard", {"batchsize": 4}, "fields of baselines.BaselineConfig"),
        ("odb", {"lengths": [1] * 6}, "takes no lengths"),
    ],
)
def test_settings_a_method_refuses(method: str, options: dict, match: str) -> None:
    ds = ToyDataset(6)
    if needs(method):
        options.setdefault("lengths", build(ds))
    with pytest.raises((TypeError, ValueError), match=match):
        build_loader(method, ds, 256, **options)


def test_packing_refuses_multimodal_caches() -> None:
    ds = ToyDataset(3)
    cache = build(ds, patches_fn=lambda s: 4)
    with pytest.raises(ValueError, match="text-only"):
        build_loader("packing", ds, 256, lengths=cache)


def test_len_and_estimate_steps_are_exact() -> None:
    ds = ToyDataset(30)
    loader = build_loader("gmt", ds, 256, lengths=build(ds))
    expected = len(loader)
    assert loader.estimate_steps() == expected == sum(1 for _ in loader)
    assert loader.stats()["steps"] == expected


def test_import_baselines_needs_neither_experiments_nor_frameworks() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    heavy = ["experiments", "transformers", "datasets", "deepspeed"]
    code = (
        "import json, sys, baselines; "
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
