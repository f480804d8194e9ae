"""What a data config reads: its settings, its files, and its records as turns and images.

One loader path: a local file, folder or glob (json / jsonl / parquet, as written by
`experiments.data.proxies` or staged by `experiments.data.stage`) or a hub id, both through
``datasets.load_dataset``. Each record of the four schemas normalises to ``(role, text)``
turns with ``<image>`` placeholders plus its image references.
"""

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from experiments.data.pixels import PixelFormat

IMAGE_TAG = "<image>"
DatasetName = Literal["ultrachat", "llava", "sharegpt4o", "mmmix"]
_ROLES = {"human": "user", "gpt": "assistant", "user": "user", "assistant": "assistant",
          "system": "system"}
_META_FILES = {"metadata.json", "proxy_meta.json", "dataset_info.json"}


@dataclass(frozen=True)
class DataConfig:
    """Everything that decides what a sample looks like (and how long it is).

    Attributes:
        dataset: record schema: ``ultrachat`` (``messages``), ``llava`` / ``sharegpt4o``
            (``conversations`` + one ``image``), ``mmmix`` (``conversations`` + ``images``;
            also the leverage mixes).
        source: a local file or folder, a local glob (``.../data/train_sft-*.parquet``),
            an ``hf://`` file, or a hub dataset id.
        processor: tokenizer + image processor folder, or a hub model id.
        subset: hub config name (``sharegpt4o`` in ``lmms-lab/LLaVA-OneVision-Data``).
        split: hub split; local files always read as one ``train`` split.
        image_dir: root of relative image paths (default: the data file's folder; for
            ``llava`` its ``train2017`` sub-folder, COCO's layout).
        cutoff_len: longest sample in tokens.
        image_max_pixels / image_min_pixels: the processor's pixel budget.
        aug_min_scale / aug_max_scale: random-resize factors; both 1.0 = no augmentation.
        seed: seeds the augmentation (with the epoch and the index).
        max_samples: read only the first ``max_samples`` records (0 = all).
        holdout_samples: that many of those records are the held-out split (validation
            loss); training never sees them.
        holdout_seed: which records are held out: None takes the last ``holdout_samples``
            (a generated proxy has no order); a seed takes a seeded random choice, as
            LLaMA-Factory's ``val_size`` split does (a hub file may be ordered by source,
            e.g. LLaVA-Instruct's three parts, so its tail is not a fair sample).
        holdout: read the held-out records instead of the training ones.
        pixels: how samples carry ``pixel_values``: ``uint8`` (the resized image's
            integers, one frame: an eighth of the bytes; ``experiments.data.pixels.decode_batch``
            turns them into the processor's exact floats on the device) or ``float32``
            (the processor's own output).

    Example:
        >>> DataConfig("ultrachat", "data/proxies/ultrachat", "data/assets/processor").cutoff_len
        16384
    """

    dataset: DatasetName
    source: str
    processor: str
    subset: str | None = None
    split: str = "train"
    image_dir: str | None = None
    cutoff_len: int = 16384
    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 64 * 32 * 32
    aug_min_scale: float = 1.0
    aug_max_scale: float = 1.0
    seed: int = 0
    max_samples: int = 0
    holdout_samples: int = 0
    holdout_seed: int | None = None
    holdout: bool = False
    pixels: PixelFormat = "uint8"

    def __post_init__(self) -> None:
        if self.dataset not in DatasetName.__args__:
            raise ValueError(f"Unknown dataset {self.dataset!r}; choose one of "
                             f"{DatasetName.__args__}")
        if self.pixels not in PixelFormat.__args__:
            raise ValueError(f"Unknown pixels {self.pixels!r}; choose one of "
                             f"{PixelFormat.__args__}")
        if self.cutoff_len < 16:
            raise ValueError(f"cutoff_len must be >= 16, got {self.cutoff_len}")
        if not 0 < self.image_min_pixels <= self.image_max_pixels:
            raise ValueError(f"Need 0 < image_min_pixels <= image_max_pixels, got "
                             f"{self.image_min_pixels} and {self.image_max_pixels}")
        if not 0 < self.aug_min_scale <= self.aug_max_scale:
            raise ValueError(f"Need 0 < aug_min_scale <= aug_max_scale, got "
                             f"{self.aug_min_scale} and {self.aug_max_scale}")
        if self.max_samples < 0:
            raise ValueError(f"max_samples must be >= 0 (0 = all), got {self.max_samples}")
        if self.holdout_samples < 0:
            raise ValueError(f"holdout_samples must be >= 0, got {self.holdout_samples}")
        if self.holdout_seed is not None and self.holdout_seed < 0:
            raise ValueError(f"holdout_seed must be >= 0 or None (the last records), got "
                             f"{self.holdout_seed}")
        if self.holdout and not self.holdout_samples:
            raise ValueError("holdout=True reads the held-out split, but holdout_samples=0 "
                             "defines none; set holdout_samples")

    @property
    def augment(self) -> bool:
        """Whether images are randomly rescaled (a scale range other than 1.0 to 1.0)."""
        return (self.aug_min_scale, self.aug_max_scale) != (1.0, 1.0)


def _local_files(path: Path) -> list[Path]:
    """The data files of a file or folder source. Hidden files are not data: a staged
    repository folder holds the stage marker ``.staged.json`` and the hub client's
    ``.cache/`` (pathlib's glob, unlike the shell's, matches them)."""
    if path.is_file():
        return [path]
    if (path / "records.jsonl").exists():  # the MM-Mix TMDB layout
        return [path / "records.jsonl"]
    for pattern in ("*.parquet", "*.jsonl", "*.json"):
        files = sorted(p for p in path.glob(pattern)
                       if p.name not in _META_FILES and not p.name.startswith("."))
        if files:
            return files
    raise FileNotFoundError(f"No parquet/jsonl/json data files in {path}")


def _builder(files: list[str]) -> str:
    return "parquet" if files[0].endswith(".parquet") else "json"


def _glob_files(pattern: str) -> list[Path]:
    """The files matching a glob source (a staged hub folder's shards)."""
    files = sorted(p for p in map(Path, glob.glob(pattern)) if p.is_file())
    if not files:
        raise FileNotFoundError(
            f"No files match the source pattern {pattern!r}; check the staged folder "
            f"(python -m experiments.data.stage) or fix the pattern")
    return files


def data_files(cfg: DataConfig) -> list[str] | None:
    """The files a config reads, or None for a hub dataset id.

    A source with glob characters (``*?[``) that is not an ``hf://`` path is a local
    pattern, e.g. ``<cache>/datasets/HuggingFaceH4/ultrachat_200k/data/train_sft-*.parquet``;
    it must match at least one file (it never falls through to a hub look-up).
    """
    path = Path(cfg.source)
    if path.exists():
        return [str(p) for p in _local_files(path)]
    if any(c in cfg.source for c in "*?[") and "://" not in cfg.source:
        return [str(p) for p in _glob_files(cfg.source)]
    if cfg.source.endswith((".json", ".jsonl", ".parquet")):
        return [cfg.source]  # e.g. hf://datasets/liuhaotian/LLaVA-Instruct-150K/...json
    return None


def load_records(cfg: DataConfig):
    """The raw records of ``cfg`` as a ``datasets.Dataset`` (hub or local, one code path)."""
    from datasets import load_dataset

    files = data_files(cfg)
    if files is None:
        ds = load_dataset(cfg.source, cfg.subset, split=cfg.split)
    else:
        ds = load_dataset(_builder(files), data_files=files, split="train")
    if cfg.max_samples:
        ds = ds.select(range(min(cfg.max_samples, len(ds))))
    return _split(ds, cfg)


def _split(ds, cfg: DataConfig):
    """The training records or the held-out ones (``cfg.holdout``), in record order."""
    if not cfg.holdout_samples:
        return ds
    n_train = len(ds) - cfg.holdout_samples
    if n_train < 1:
        raise ValueError(f"holdout_samples={cfg.holdout_samples} leaves no training records "
                         f"out of {len(ds)}; lower it")
    if cfg.holdout_seed is None:
        return ds.select(range(n_train, len(ds)) if cfg.holdout else range(n_train))
    order = np.random.default_rng(cfg.holdout_seed).permutation(len(ds))
    held = np.sort(order[:cfg.holdout_samples])
    return ds.select(held if cfg.holdout else np.sort(order[cfg.holdout_samples:]))


def default_image_dir(cfg: DataConfig) -> Path:
    """Root of the records' relative image paths (``cfg.image_dir``, else beside the data)."""
    if cfg.image_dir is not None:
        return Path(cfg.image_dir)
    files = data_files(cfg)
    root = Path(files[0]).parent if files else Path(".")
    return root / "train2017" if cfg.dataset == "llava" else root


def normalise(dataset: str, row: dict) -> tuple[list[tuple[str, str]], list[Any]]:
    """(turns, image references) of one record; raises if placeholders and images differ."""
    if dataset == "ultrachat":
        turns = [(_ROLES[m["role"]], m["content"]) for m in row["messages"]]
        images: list[Any] = []
    else:
        conv = row.get("conversations") or row.get("conversation") or []
        turns = [(_ROLES[t["from"]], t["value"]) for t in conv]
        images = list(row["images"] or []) if dataset == "mmmix" else [row["image"]]
    if dataset in ("llava", "sharegpt4o") and turns and IMAGE_TAG in turns[0][1]:
        # LLaVA's preprocess_multimodal: the single <image> goes first, then a newline.
        text = turns[0][1].replace(IMAGE_TAG, "").strip()
        turns[0] = (turns[0][0], f"{IMAGE_TAG}\n{text}")
    tags = sum(text.count(IMAGE_TAG) for _, text in turns)
    if tags != len(images):
        raise ValueError(f"Record {row.get('id', '?')}: {tags} {IMAGE_TAG} placeholders but "
                         f"{len(images)} images; fix the record or its images field")
    return turns, images
