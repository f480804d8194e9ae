"""The LLaMA-Factory launcher's recipe checks, without llamafactory (not in this venv).

The training itself runs in its own venv: ``make check-llamafactory``
(``experiments/rehearsal/llamafactory_check.py``). Here: the module imports without llamafactory, a
recipe is split into LLaMA-Factory's arguments and the ODBLoader options, and every
setting that cannot hold with ODB batches is refused by name; the venv's pins are exact.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path

import pytest

from odb.integrations import llamafactory
from odb.integrations.llamafactory import check_recipe

RECIPE = {"stage": "sft", "do_train": True, "template": "qwen", "odb": {"token_budget": 512}}


def test_the_module_imports_without_llamafactory() -> None:
    assert importlib.util.find_spec("llamafactory") is None  # else this proves nothing


def test_the_docstring_example_runs() -> None:
    assert doctest.testmod(llamafactory).failed == 0


def test_a_recipe_splits_into_llamafactory_args_and_loader_options() -> None:
    args, options = check_recipe(RECIPE)
    assert options == {"token_budget": 512}
    assert args == {"stage": "sft", "do_train": True, "template": "qwen", "ignore_data_skip": True}


def test_an_explicit_ignore_data_skip_is_kept_for_odbtrainer_to_judge() -> None:
    args, _ = check_recipe({**RECIPE, "ignore_data_skip": False})
    assert args["ignore_data_skip"] is False


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("neat_packing", True),
        ("packing", True),
        ("streaming", True),
        ("use_asft_loss", True),
        ("use_dft_loss", True),
        ("use_eaft_loss", True),
        ("ignore_pad_token_for_loss", False),
        ("per_device_train_batch_size", 1),
        ("do_eval", True),
        ("do_predict", True),
        ("use_hyper_parallel", True),
        ("use_swanlab", True),
        ("enable_torch_profiler", True),
        ("profile_modules", "model.layers"),
    ],
)
def test_settings_that_cannot_hold_with_odb_are_refused_by_name(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        check_recipe({**RECIPE, key: value})


@pytest.mark.parametrize(("key", "value"), [("neat_packing", False), ("packing", False)])
def test_the_same_settings_switched_off_pass(key: str, value: object) -> None:
    args, _ = check_recipe({**RECIPE, key: value})
    assert args[key] is value


@pytest.mark.parametrize(
    ("recipe", "match"),
    [
        ({**RECIPE, "stage": "dpo"}, "stage='dpo'"),
        ({**RECIPE, "do_train": False}, "do_train"),
        ({k: v for k, v in RECIPE.items() if k != "odb"}, "odb:"),
        ({**RECIPE, "odb": {"num_workers": 1}}, "token_budget"),
        ({**RECIPE, "odb": {"token_budget": 512, "grad_accum_steps": 2}}, "gradient_accum"),
        ({**RECIPE, "odb": {"token_budget": 512, "ignore_index": -1}}, "IGNORE_INDEX"),
    ],
)
def test_a_recipe_that_is_not_odb_sft_is_refused(recipe: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_recipe(recipe)


def test_the_llamafactory_venv_pins_are_exact_and_share_the_artifacts_torch() -> None:
    root = Path(__file__).resolve().parents[3]

    def pins(name: str) -> dict[str, str]:
        lines = (root / "requirements" / name).read_text().splitlines()
        found = {}
        for line in (ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")):
            package, sep, version = line.partition("==")
            assert sep and version and not re.search(r"[<>=!~;\[ +]", package + version), line
            found[package.lower()] = version
        return found

    ours = pins("llamafactory.txt")
    assert ours["torch"] == pins("artifact.txt")["torch"]  # the CPU wheel the Makefile installs
    assert ours["llamafactory"] == "0.9.5"  # what docs/integrations.md was checked against
