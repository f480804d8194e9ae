"""Shared fixtures: the four proxies and the local assets, built once per session.

Two sizes. The default-size proxies (``CV_SAMPLES`` records each, as the workflow makes
them) and the processor trained on them serve what needs the whole distribution: the
CV targets (slow) and the training runs. Every other test reads a few hundred records
at most and gets ``SMALL_SAMPLES``-record proxies of the same generator, with their own
processor: the quick tier builds only those.
"""

from pathlib import Path

import pytest

from experiments.data.assets import build_image_processor, corpus_from_proxies, train_tokenizer
from experiments.data.pipeline import DataConfig, PreprocessedDataset
from experiments.data.proxies import PROXY_NAMES, ProxyConfig, default_max_pixels, write_proxy

CV_SAMPLES = 2000  # the acceptance criterion asks for CV targets on >= 2,000 samples
SMALL_SAMPLES = 300  # > the 200 records test_pipeline's variants read


def _proxies(root: Path, num_samples: int) -> Path:
    for name in PROXY_NAMES:
        write_proxy(ProxyConfig(name, num_samples=num_samples, seed=0), root / name)
    return root


def _processor(proxies: Path, out: Path) -> Path:
    train_tokenizer(corpus_from_proxies(proxies), out)
    build_image_processor(768 * 768).save_pretrained(out)
    return out


def _datasets(proxies: Path, processor: Path) -> dict[str, PreprocessedDataset]:
    return {
        name: PreprocessedDataset(DataConfig(name, proxy_source(proxies, name), str(processor),
                                             image_max_pixels=default_max_pixels(name)))
        for name in PROXY_NAMES
    }


def proxy_source(root: Path, name: str) -> str:
    return str(root / name / "llava_instruct_150k.json") if name == "llava" else str(root / name)


@pytest.fixture(scope="session")
def proxy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four proxies at their default size (``CV_SAMPLES`` records)."""
    return _proxies(tmp_path_factory.mktemp("proxies"), CV_SAMPLES)


@pytest.fixture(scope="session")
def processor_dir(proxy_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local tokenizer and image processor, trained on the default-size proxies."""
    return _processor(proxy_root, tmp_path_factory.mktemp("assets") / "processor")


@pytest.fixture(scope="session")
def cv_datasets_by_name(proxy_root: Path, processor_dir: Path) -> dict[str, PreprocessedDataset]:
    """The pipeline over the default-size proxies."""
    return _datasets(proxy_root, processor_dir)


@pytest.fixture(scope="session")
def small_proxy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The four proxies with ``SMALL_SAMPLES`` records each."""
    return _proxies(tmp_path_factory.mktemp("small_proxies"), SMALL_SAMPLES)


@pytest.fixture(scope="session")
def small_processor_dir(small_proxy_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local tokenizer and image processor, trained on the small proxies."""
    return _processor(small_proxy_root, tmp_path_factory.mktemp("small_assets") / "processor")


@pytest.fixture(scope="session")
def datasets_by_name(
    small_proxy_root: Path, small_processor_dir: Path
) -> dict[str, PreprocessedDataset]:
    """The pipeline over the small proxies."""
    return _datasets(small_proxy_root, small_processor_dir)
