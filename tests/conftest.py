"""Suite-wide settings: no hub access, and `gpu` tests skipped without CUDA."""

import os

# Nothing on the CPU-scale path may fetch from a hub. Set at import, before any test
# module (or a rank process it spawns, which inherits the environment) imports HF code.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
