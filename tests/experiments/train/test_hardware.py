"""A run that asks for what this machine lacks exits before the model loads, saying what
to check (issue 42: a paper job that got no GPU trained on CPU until its time limit)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from experiments.train.hardware import HardwareError, check_machine
from experiments.train.run import main

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
needs_no_flash_attn = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None,
                                         reason="flash_attn is installed here")


@needs_no_gpu
def test_a_cuda_run_without_a_gpu_exits_before_the_model_loads(base_config: Path,
                                                               tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="strategy.device=cuda but torch sees no CUDA"):
        main(["--config", str(base_config), f"run.out_dir={tmp_path}",
              "strategy.device=cuda"])
    assert not dist.is_initialized()
    assert not any(tmp_path.iterdir())  # no process group, no output, no model


@needs_no_flash_attn
def test_flash_attention_without_the_package_exits_before_the_model_loads(
        base_config: Path, tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match=r"pip install --no-index <cache>/wheels/flash_attn"):
        main(["--config", str(base_config), f"run.out_dir={tmp_path}", "method.name=packing",
              "model.attn_implementation=flash_attention_2"])
    assert not dist.is_initialized()


def test_a_flash_attn_that_does_not_import_is_refused_with_its_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wheel built for another torch is installed but fails on import; the check
    imports it, so the job still exits at start-up, with the import's own error."""
    broken = tmp_path / "flash_attn"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDevice")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    with pytest.raises(HardwareError, match=r"undefined symbol.*pip install --no-index"):
        check_machine("auto", "flash_attention_2")


@needs_no_gpu
def test_auto_trains_on_what_is_there() -> None:
    check_machine("auto", "sdpa", local_world_size=8)  # CPU, on purpose


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_more_local_ranks_than_gpus_is_refused() -> None:
    with pytest.raises(HardwareError, match="visible GPU"):
        check_machine("cuda", "sdpa", local_world_size=torch.cuda.device_count() + 1)
