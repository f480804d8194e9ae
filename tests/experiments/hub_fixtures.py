"""Tiny ``lmms-lab/LLaVA-OneVision-Data`` parquet shards in the hub's own layout.

`write_onevision_config` writes rows ``{id, image: {bytes, path}, conversations: [{from,
value}], data_source}`` to ``<cache>/datasets/lmms-lab/LLaVA-OneVision-Data/<config>/
train-0000k-of-0000n.parquet`` with the ``huggingface`` schema metadata that makes
``datasets`` decode ``image`` as an Image feature, in several shards and small row groups
(so readers that stream row groups are exercised). `write_mm_mix_sources` fills the five
configs MM-Mix is built from: small PNG word crops with one-word answers (OCR), COCO-size
JPEGs with short answers (VQA), large JPEGs with long captions. Self-contained (pyarrow,
PIL, numpy), so a hub-mirror generator can share it.
"""

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from experiments.data.proxy_files import vocabulary

HUB_DATASET = "lmms-lab/LLaVA-OneVision-Data"
_STRING = {"dtype": "string", "_type": "Value"}
_FEATURES = {"id": _STRING, "image": {"_type": "Image"},
             "conversations": [{"from": _STRING, "value": _STRING}], "data_source": _STRING}
_SCHEMA = pa.schema(
    [("id", pa.string()),
     ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
     ("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
     ("data_source", pa.string())],
    metadata={"huggingface": json.dumps({"info": {"features": _FEATURES}})},
)


def image_bytes(h: int, w: int, fmt: str, colour: int) -> bytes:
    """A solid ``h x w`` image encoded as ``fmt`` (``PNG`` or ``JPEG``)."""
    buf = io.BytesIO()
    mode = "L" if fmt == "PNG" else "RGB"
    fill = colour if mode == "L" else (colour, 255 - colour, colour // 2)
    Image.new(mode, (w, h), fill).save(buf, format=fmt)
    return buf.getvalue()


def write_onevision_config(cache: Path, config: str, rows: list[dict], shards: int = 2,
                           row_group_size: int = 4) -> list[Path]:
    """Write ``rows`` as ``shards`` parquet files of ``config``; returns their paths."""
    folder = cache / "datasets" / HUB_DATASET / config
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, chunk in enumerate(np.array_split(np.arange(len(rows)), shards)):
        path = folder / f"train-{k:05d}-of-{shards:05d}.parquet"
        table = pa.Table.from_pylist([rows[i] for i in chunk], schema=_SCHEMA)
        pq.write_table(table, path, row_group_size=row_group_size)
        paths.append(path)
    return paths


def _turns(question: str, answer: str) -> list[dict]:
    return [{"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]


def _row(config: str, i: int, data: bytes, question: str, answer: str) -> dict:
    return {"id": f"{config}_{i}", "image": {"bytes": data, "path": None},
            "conversations": _turns(question, answer), "data_source": config}


def _rows(config: str, n: int, rng: np.random.Generator) -> list[dict]:
    """``n`` rows of one config with the role's image sizes and answer lengths."""
    words = np.array(vocabulary())

    def salad(k: int) -> str:
        return " ".join(words[rng.integers(0, len(words), k)])

    out = []
    for i in range(n):
        c = int(rng.integers(0, 256))
        if config == "iiit5k":
            data = image_bytes(int(rng.integers(24, 80)), int(rng.integers(80, 400)), "PNG", c)
            word = "".join(rng.choice(list("ABCDEFGHKLMNPRST"), int(rng.integers(3, 9))))
            out.append(_row(config, i, data, "What is the text in the image?", word))
        elif config == "orand_car_a":
            data = image_bytes(int(rng.integers(40, 90)), int(rng.integers(150, 400)), "PNG", c)
            out.append(_row(config, i, data, "Read the amount.", str(rng.integers(1, 99999))))
        elif config.startswith("aokvqa"):
            data = image_bytes(480, 640, "JPEG", c)
            out.append(_row(config, i, data, salad(int(rng.integers(8, 20))) + "?",
                            salad(int(rng.integers(1, 4)))))
        else:  # captions: image_textualization(filtered), sharegpt4o
            big = config == "sharegpt4o"
            h, w = (768, 1024) if big else (600, 800)
            words_n = int(rng.integers(250, 450) if big else rng.integers(120, 260))
            out.append(_row(config, i, image_bytes(h, w, "JPEG", c),
                            "Describe the image in detail.", salad(words_n)))
    return out


MM_MIX_CONFIGS = ("iiit5k", "orand_car_a", "aokvqa(cauldron,llava_format)",
                  "image_textualization(filtered)", "sharegpt4o")


def write_mm_mix_sources(cache: Path, rows_per_config: int = 30, seed: int = 0,
                         configs: tuple[str, ...] = MM_MIX_CONFIGS) -> dict[str, list[Path]]:
    """Stage small versions of MM-Mix's five source configs under ``cache``."""
    return {c: write_onevision_config(
                cache, c, _rows(c, rows_per_config, np.random.default_rng([seed, i])))
            for i, c in enumerate(configs)}
