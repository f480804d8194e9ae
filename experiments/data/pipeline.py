"""Map-style preprocessing dataset: one model-ready Qwen3-VL sample per index.

This is the work ODB overlaps with training: a sample's real length (template, tokens,
visual-token expansion, cutoff) is only known after it. For item ``i`` the dataset

1. reads record ``i`` (any of the four schemas) and normalises it to ``(role, text)``
   turns with ``<image>`` placeholders plus its images (LLaVA's rule: a single image's
   placeholder moves to the start of the first user turn);
2. optionally rescales each image by a factor drawn from ``(seed, epoch, index)``
   (random-resize augmentation: lengths change per epoch, reproducibly);
3. resizes with the Qwen-VL image processor (``smart_resize``, patch 16, merge 2) and
   expands each image into ``<|vision_start|>`` + ``<|image_pad|>`` x
   ``grid_t*grid_h*grid_w/4`` + ``<|vision_end|>``;
4. renders the Qwen3-VL chat template turn by turn and tokenizes; labels copy the
   assistant content and its ``<|im_end|>\\n``; everything else (prompts, role headers,
   vision tokens) is -100;
5. truncates to ``cutoff_len`` (refusing to cut through an image, which would break the
   image/placeholder count).

`length(i)` runs the same code without decoding pixels (image sizes come from file
headers and the processor's own patch count); a test proves it equal to
``len(dataset[i]["input_ids"])``. `fingerprint()` hashes every setting that changes
lengths, for the length cache of the GMT/BMT baselines.

Records come from `experiments.data.records`.
"""

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from experiments.data.assets import IMAGE_PAD, VISION_END, VISION_START, load_processor
from experiments.data.patches import Uint8Patcher
from experiments.data.pixels import PixelCodec
from experiments.data.records import (
    IMAGE_TAG,
    DataConfig,
    data_files,
    default_image_dir,
    load_records,
    normalise,
)
from odb import batch_parts

PIPELINE_VERSION = 1  # bump when the rendering or masking below changes lengths or labels
IGNORE_INDEX = -100


def _given(value: Any) -> list[Any]:
    """``[value]``, or ``[]`` for None (a new setting left unset keeps old fingerprints)."""
    return [] if value is None else [value]


class PreprocessedDataset(torch.utils.data.Dataset):
    """Map-style dataset returning one model-ready Qwen3-VL sample per index.

    A sample is ``input_ids``, ``labels``, ``attention_mask``, ``mm_token_type_ids`` (1-D
    LongTensors; the last is 1 on image tokens, as the Qwen3-VL processor returns it) and, for
    samples with images, ``pixel_values`` (patches x 1536 float32, or under the
    default ``DataConfig.pixels`` patches x 768 uint8, one of the two identical frames,
    decoded into the former on the device with :attr:`pixel_codec`) and
    ``image_grid_thw`` (images x 3). Call `set_epoch` before each epoch when augmentation
    is on.

    Example:
        >>> ds = PreprocessedDataset(DataConfig("mmmix", "data/proxies/mmmix",
        ...                                     "data/assets/processor"))  # doctest: +SKIP
        >>> len(ds[0]["input_ids"]) == ds.length(0)  # doctest: +SKIP
        True
    """

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.records = load_records(cfg)
        self.image_dir = default_image_dir(cfg)
        self.tokenizer, self.image_processor = load_processor(
            cfg.processor, cfg.image_max_pixels, cfg.image_min_pixels)
        tok = self.tokenizer
        self.vision_ids = {tok.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VISION_START,
                                                                  VISION_END)}
        self.image_pad_id = tok.convert_tokens_to_ids(IMAGE_PAD)
        self.vision_end_id = tok.convert_tokens_to_ids(VISION_END)
        self.merge = self.image_processor.merge_size
        self.pixel_codec = (PixelCodec.for_processor(self.image_processor)
                            if cfg.pixels == "uint8" else None)
        # uint8 pixels without the processor's float round trip, where it is reproduced
        # (the same bytes as pixel_codec.encode of the processor's output).
        self.uint8_patcher = (Uint8Patcher.for_processor(self.image_processor)
                              if self.pixel_codec is not None else None)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation draws of ``epoch`` (no effect without augmentation)."""
        self.epoch = epoch

    # ---------------------------------------------------------------- images

    def _open(self, ref: Any) -> Image.Image:
        if isinstance(ref, Image.Image):
            return ref
        if isinstance(ref, dict):  # a datasets Image feature left undecoded
            if ref.get("bytes"):
                import io

                return Image.open(io.BytesIO(ref["bytes"]))
            ref = ref["path"]
        return Image.open(self.image_dir / ref)

    def _scales(self, index: int, n: int) -> np.ndarray:
        if not self.cfg.augment or n == 0:
            return np.ones(n)
        rng = np.random.default_rng([self.cfg.seed, self.epoch, index])
        return rng.uniform(self.cfg.aug_min_scale, self.cfg.aug_max_scale, n)

    @staticmethod
    def _scaled(size: tuple[int, int], scale: float) -> tuple[int, int]:
        w, h = size
        return max(1, round(w * scale)), max(1, round(h * scale))

    def _vision(self, index: int, refs: list, with_pixels: bool) -> tuple[list[int], dict]:
        """Image-token counts per image, and pixel tensors when ``with_pixels``."""
        if not refs:
            return [], {}
        images = [self._open(r) for r in refs]
        sizes = [self._scaled(im.size, s) for im, s in
                 zip(images, self._scales(index, len(images)), strict=True)]
        if not with_pixels:
            counts = [self.image_processor.get_number_of_image_patches(h, w, {}) // self.merge**2
                      for w, h in sizes]
            return counts, {}
        rgb = [im.convert("RGB") for im in images]
        rgb = [im if im.size == s else im.resize(s, Image.Resampling.BICUBIC)
               for im, s in zip(rgb, sizes, strict=True)]
        if self.pixel_codec is None:
            out = self.image_processor(images=rgb, return_tensors="pt")
            pixels, grid = out["pixel_values"], out["image_grid_thw"]
        elif self.uint8_patcher is not None:
            pixels, grid = self.uint8_patcher(rgb)
        else:
            out = self.image_processor(images=rgb, return_tensors="pt", do_rescale=False,
                                       do_normalize=False)
            pixels, grid = self.pixel_codec.encode(out["pixel_values"]), out["image_grid_thw"]
        counts = (grid.prod(-1) // self.merge**2).tolist()
        return counts, {"pixel_values": pixels, "image_grid_thw": grid}

    # ---------------------------------------------------------------- text

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _turn(self, role: str, text: str, counts: list[int]) -> tuple[list[int], list[int]]:
        block = f"{VISION_START}{IMAGE_PAD}{VISION_END}"
        header = f"<|im_start|>{role}\n"
        ids = self._encode(header + text.replace(IMAGE_TAG, block) + "<|im_end|>\n")
        if IMAGE_TAG in text:  # expand each placeholder pad as Qwen3VLProcessor does
            expanded: list[int] = []
            for t in ids:
                expanded += [t] * counts.pop(0) if t == self.image_pad_id else [t]
            ids = expanded
        if role != "assistant":
            return ids, [IGNORE_INDEX] * len(ids)
        n_header = len(self._encode(header))
        labels = [IGNORE_INDEX] * n_header + ids[n_header:]
        return ids, [IGNORE_INDEX if t in self.vision_ids else t for t in labels]

    def _build(self, index: int, with_pixels: bool) -> tuple[list[int], list[int], dict]:
        turns, refs = normalise(self.cfg.dataset, self.records[index])
        counts, vision = self._vision(index, refs, with_pixels)
        ids: list[int] = []
        labels: list[int] = []
        for role, text in turns:
            t_ids, t_labels = self._turn(role, text, counts)
            ids += t_ids
            labels += t_labels
        cutoff = self.cfg.cutoff_len
        if len(ids) > cutoff:
            if refs and self.vision_end_id in ids[cutoff - 1:]:
                raise ValueError(
                    f"Sample {index} has {len(ids)} tokens and an image beyond cutoff_len="
                    f"{cutoff}; raise cutoff_len or lower image_max_pixels "
                    f"({self.cfg.image_max_pixels})")
            ids, labels = ids[:cutoff], labels[:cutoff]
        return ids, labels, vision

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels, vision = self._build(index, with_pixels=True)
        input_ids = torch.tensor(ids)
        sample = {"input_ids": input_ids, "labels": torch.tensor(labels),
                  "attention_mask": torch.ones(len(ids), dtype=torch.long),
                  # 1 on image tokens: Qwen3-VL's M-RoPE needs it (as the processor returns)
                  "mm_token_type_ids": (input_ids == self.image_pad_id).long()}
        return sample | vision

    def length(self, index: int) -> int:
        """Post-pipeline length of item ``index`` at the current epoch, without pixels."""
        return len(self._build(index, with_pixels=False)[0])

    def lengths(self) -> np.ndarray:
        """`length` of every item at the current epoch."""
        return np.array([self.length(i) for i in range(len(self))], dtype=np.int64)

    # ---------------------------------------------------------------- fingerprint

    def fingerprint(self) -> str:
        """Stable hash of everything that changes lengths (for the length cache).

        Covers: pipeline version, dataset schema, the data (file contents for local
        files; id/subset/split for the hub), ``max_samples``, the tokenizer (its full
        serialisation and chat template), cutoff, image-processor settings and the
        augmentation (with its seed; the seed is left out when augmentation is off,
        since it changes nothing then). Image files are identified through the records'
        paths, not hashed.
        """
        cfg = self.cfg
        files = data_files(cfg)
        data = ({Path(f).name: _file_sha256(Path(f)) for f in files}
                if files and Path(files[0]).exists() else [cfg.source, cfg.subset, cfg.split])
        ip = self.image_processor
        parts = {
            "pipeline_version": PIPELINE_VERSION, "dataset": cfg.dataset, "data": data,
            "max_samples": cfg.max_samples,
            "holdout": [cfg.holdout_samples, cfg.holdout, *_given(cfg.holdout_seed)],
            "image_dir": str(self.image_dir),
            "tokenizer": hashlib.sha256(
                self.tokenizer.backend_tokenizer.to_str().encode()).hexdigest(),
            "chat_template": self.tokenizer.chat_template, "cutoff_len": cfg.cutoff_len,
            "image_processor": {"patch_size": ip.patch_size, "merge_size": ip.merge_size,
                                "temporal_patch_size": ip.temporal_patch_size,
                                "size": dict(ip.size)},
            "augmentation": ({"min": cfg.aug_min_scale, "max": cfg.aug_max_scale,
                              "seed": cfg.seed} if cfg.augment else None),
        }
        blob = json.dumps(parts, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def describe(self) -> dict:
        """The config and fingerprint, for result JSON."""
        return asdict(self.cfg) | {"fingerprint": self.fingerprint()}


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def collate(samples: list[dict[str, torch.Tensor]], pad_token_id: int) -> dict:
    """Right-pad a group of samples into one batch (labels padded with -100).

    ``pixel_values`` is an :class:`odb.TensorParts` of the samples' tensors: its
    ``.to(device)`` returns the concatenated tensor, on that device.

    Example:
        >>> batch = collate([ds[0], ds[1]], ds.tokenizer.pad_token_id)  # doctest: +SKIP
        >>> batch["input_ids"].shape[0]  # doctest: +SKIP
        2
    """
    if not samples:
        raise ValueError("collate needs at least one sample, got an empty list")
    width = max(len(s["input_ids"]) for s in samples)

    def pad(key: str, value: int) -> torch.Tensor:
        out = torch.full((len(samples), width), value, dtype=torch.long)
        for row, s in enumerate(samples):
            out[row, : len(s[key])] = s[key]
        return out

    batch = {"input_ids": pad("input_ids", pad_token_id), "labels": pad("labels", IGNORE_INDEX),
             "attention_mask": pad("attention_mask", 0),
             "mm_token_type_ids": pad("mm_token_type_ids", 0)}
    with_images = [s for s in samples if "pixel_values" in s]
    if with_images:
        # Concatenated where the batch lands (``.to(device)``), not on the loader's CPU.
        batch["pixel_values"] = batch_parts([s["pixel_values"] for s in with_images])
        batch["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in with_images])
    return batch
