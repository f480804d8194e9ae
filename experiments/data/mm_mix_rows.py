"""The staged LLaVA-OneVision sources of MM-Mix, read row by row and checked.

Where each source's parquet shards sit in the site cache (the hub layout), its rows read
one row group at a time (a source is never held in memory), and per row: the image's
format and size from its header, the conversation with its ``<image>`` tag, and the
post-pipeline length estimate (text characters / 4 + 5 template tokens per message +
image tokens).
"""

import io
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from experiments.data.proxy_lengths import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    VISION_WRAP_TOKENS,
    image_tokens,
)
from experiments.data.records import IMAGE_TAG

HUB_DATASET = "lmms-lab/LLaVA-OneVision-Data"
SOURCE_CONFIGS = {
    "iiit5k": "iiit5k",
    "orand_car_a": "orand_car_a",
    "aokvqa": "aokvqa(cauldron,llava_format)",
    "image_textualization": "image_textualization(filtered)",
    "sharegpt4o": "sharegpt4o",
}
CHARS_PER_TOKEN = 4  # English text under the Qwen tokenizer, for the length estimate only
_COLUMNS = ("id", "image", "conversations")
_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp",
               "TIFF": "tif"}


def config_dir(cache: Path, source: str) -> Path:
    """Where the hub layout keeps ``source``'s parquet shards below ``cache``."""
    return Path(cache) / "datasets" / HUB_DATASET / SOURCE_CONFIGS[source]


def staged_files(cache: Path, source: str) -> list[Path]:
    """The sorted parquet shards of ``source``; raises naming the folder if none."""
    folder = config_dir(cache, source)
    files = sorted(folder.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(
            f"MM-Mix source {source!r} is not staged: no *.parquet in {folder}. Stage the "
            f"{HUB_DATASET} config {SOURCE_CONFIGS[source]!r} into the site cache first")
    return files


def num_rows(files: list[Path]) -> int:
    """Rows across ``files`` from their footers (no data read)."""
    return sum(pq.read_metadata(f).num_rows for f in files)


def iter_rows(files: list[Path], wanted: np.ndarray) -> Iterator[tuple[int, dict]]:
    """(global index, row) for the sorted unique indices ``wanted`` across ``files``, in
    order; only one row group is in memory at a time."""
    base, pos = 0, 0
    for path in files:
        with pq.ParquetFile(path) as pf:
            names = set(pf.schema_arrow.names)
            missing = [c for c in _COLUMNS if c not in names]
            if missing:
                raise ValueError(f"{path} lacks columns {missing}; a LLaVA-OneVision config "
                                 f"has {list(_COLUMNS) + ['data_source']}")
            columns = [*_COLUMNS, *(["data_source"] if "data_source" in names else [])]
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                end = int(np.searchsorted(wanted, base + n))
                if end > pos:
                    table = pf.read_row_group(g, columns=columns).take(wanted[pos:end] - base)
                    yield from zip(wanted[pos:end].tolist(), table.to_pylist(), strict=True)
                    pos = end
                base += n


def inspect_image(data: bytes, where: str) -> tuple[str, tuple[int, int]]:
    """(file extension, (h, w)) of encoded image bytes, read from the header only."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (w, h) = img.format, img.size
    except Exception as err:  # PIL raises several types for unreadable data
        raise ValueError(f"{where}: image bytes are not a readable image ({err})") from err
    return _EXTENSIONS.get(fmt, str(fmt).lower()), (h, w)


def conversations_of(row: dict, has_image: bool, where: str) -> list[dict]:
    """``{from, value}`` turns; an image without an ``<image>`` tag gets one at the start
    of the first turn (LLaVA's convention). Raises when tags and images disagree."""
    conv = [{"from": t["from"], "value": t["value"]} for t in row["conversations"] or []]
    tags = sum(t["value"].count(IMAGE_TAG) for t in conv)
    if has_image and tags == 0 and conv:
        conv[0]["value"] = f"{IMAGE_TAG}\n{conv[0]['value']}"
        tags = 1
    if tags != int(has_image):
        raise ValueError(f"{where}: {tags} {IMAGE_TAG} tags but {int(has_image)} images; "
                         f"this row cannot be used; re-stage the config or report it")
    return conv


def estimate_length(conv: list[dict], size: tuple[int, int] | None, max_pixels: int) -> int:
    """Post-pipeline length estimate: text chars / 4 + template + image tokens."""
    text = sum(math.ceil(len(t["value"].replace(IMAGE_TAG, "").strip()) / CHARS_PER_TOKEN)
               for t in conv)
    vision = image_tokens(*size, max_pixels) + VISION_WRAP_TOKENS if size else 0
    return text + TEMPLATE_TOKENS_PER_MESSAGE * len(conv) + vision
