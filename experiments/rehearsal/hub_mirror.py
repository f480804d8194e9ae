"""Write a local hub mirror: the paper's models and datasets laid out as the hub stores them.

The rehearsal of the paper path stages from this folder (``python -m
experiments.data.stage --mirror <out>``) through the same code that stages from the hub,
so every file name, folder and format below is the real repository's::

    models/Qwen/Qwen3-VL-{2B,8B}-Instruct/          tiny random Qwen3-VL + tokenizer +
                                                    image processor (save_pretrained)
    datasets/HuggingFaceH4/ultrachat_200k/data/{train_sft,test_sft}-0000k-of-0000n.parquet
    datasets/liuhaotian/LLaVA-Instruct-150K/llava_instruct_150k.json   (+ the repo's other
        JSON files: conversation_58k / detail_23k subsets and llava_v1_5_mix665k, whose
        text-only rows add a "model" column: loading the whole repository fails here as
        it does on the hub)
    urls/train2017.zip                              train2017/<COCO id>.jpg
    datasets/lmms-lab/LLaVA-OneVision-Data/<config>/train-0000k-of-0000n.parquet
        configs sharegpt4o and the MM-Mix sources iiit5k, orand_car_a,
        image_textualization(filtered), aokvqa(cauldron,llava_format); fields id,
        image (a datasets Image: struct of bytes and path), conversations, data_source
    datasets/cais/mmlu/<subject>/{dev,validation,test}-00000-of-00001.parquet (+ all/,
        auxiliary_train/)
    datasets/MMMU/MMMU/<Subject>/{dev,validation,test}-00000-of-00001.parquet
    MIRROR.json                                     what was written, and how fast

Texts and image sizes come from the calibrated proxies (`experiments.data.proxies`), so
lengths are distributed as there; the models from `experiments.data.assets`; MMLU and MMMU
rows from `experiments.data.task_fixtures`. Deterministic for a given ``--records`` and ``--seed``.

    python -m experiments.rehearsal.hub_mirror --out data/hub_mirror --records 60 --seed 0
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

from experiments.data.proxies import write_proxy
from experiments.data.proxy_plans import ProxyConfig

MODELS = ("Qwen/Qwen3-VL-2B-Instruct", "Qwen/Qwen3-VL-8B-Instruct")
ONEVISION = "datasets/lmms-lab/LLaVA-OneVision-Data"
# The MM-Mix proxy's sources, as the LLaVA-OneVision-Data configs they come from.
MMMIX_CONFIGS = {
    "iiit5k": "iiit5k", "chinese_text_recognition": "iiit5k", "orand_car_a": "orand_car_a",
    "aokvqa": "aokvqa(cauldron,llava_format)", "vqa_like": "aokvqa(cauldron,llava_format)",
    "image_textualization": "image_textualization(filtered)",
    "sharegpt4o": "image_textualization(filtered)",
}
# Records each proxy is calibrated on; the mirror keeps the first few (small samples alone
# often cannot reach the paper's CV).
CALIBRATION_SAMPLES = 500
# The Qwen3-VL checkpoints' own pixel budget (preprocessor_config.json).
QWEN_MAX_PIXELS, QWEN_MIN_PIXELS = 16777216, 65536


def _shards(rows: list, n: int) -> list[list]:
    return [list(part) for part in np.array_split(np.array(rows, dtype=object), n)]


def _write_parquet(rows: list[dict], path: Path, features=None) -> Path:
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def _write_sharded(rows: list[dict], folder: Path, stem: str, n: int, features=None) -> None:
    for k, part in enumerate(_shards(rows, n)):
        _write_parquet(part, folder / f"{stem}-{k:05d}-of-{n:05d}.parquet", features)


def _readme(repo: Path) -> None:
    """Every hub repository has a card; the stage patterns must leave it behind."""
    repo.mkdir(parents=True, exist_ok=True)
    (repo / "README.md").write_text(f"# {repo.name} (local hub mirror)\n")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_ultrachat(proxy: Path, out: Path, n_test: int) -> int:
    """``data/train_sft`` (3 shards) and ``data/test_sft`` (1 shard) from the proxy rows."""
    rows = _jsonl(proxy / "train.jsonl")
    repo = out / "datasets/HuggingFaceH4/ultrachat_200k"
    _readme(repo)
    _write_sharded(rows[:-n_test], repo / "data", "train_sft", 3)
    _write_sharded(rows[-n_test:], repo / "data", "test_sft", 1)
    return len(rows)


def _jpeg(png: Path) -> bytes:
    buf = io.BytesIO()
    Image.open(png).convert("RGB").save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def write_llava(proxy: Path, out: Path) -> int:
    """``llava_instruct_150k.json`` (COCO ids, ``<id>.jpg``), the repository's other JSON
    files, and ``urls/train2017.zip`` holding ``train2017/<id>.jpg``."""
    rows = json.loads((proxy / "llava_instruct_150k.json").read_text())
    repo = out / "datasets/liuhaotian/LLaVA-Instruct-150K"
    _readme(repo)
    (out / "urls").mkdir(parents=True, exist_ok=True)
    # JPEGs are compressed already: stored, as COCO's own zip does.
    with zipfile.ZipFile(out / "urls/train2017.zip", "w", zipfile.ZIP_STORED) as zf:
        for i, row in enumerate(rows):
            coco = f"{33471 + 1013 * i:012d}"
            zf.writestr(f"train2017/{coco}.jpg", _jpeg(proxy / "train2017" / row["image"]))
            row.update(id=coco, image=f"{coco}.jpg")
    (repo / "llava_instruct_150k.json").write_text(json.dumps(rows))
    multi = [r for r in rows if len(r["conversations"]) > 2]
    (repo / "conversation_58k.json").write_text(json.dumps(multi))
    (repo / "detail_23k.json").write_text(json.dumps([r for r in rows if r not in multi]))
    # LLaVA-1.5's mix: ShareGPT text-only rows (no image, a "model" field) among the image
    # rows; its extra column is what breaks loading the whole repository.
    text_only = [{"id": f"sharegpt_{k}", "model": "",
                  "conversations": [{"from": t["from"],
                                     "value": t["value"].replace("<image>", "").strip()}
                                    for t in r["conversations"]]}
                 for k, r in enumerate(rows[:4])]
    (repo / "llava_v1_5_mix665k.json").write_text(json.dumps(text_only + rows[4:]))
    return len(rows)


def _onevision_features():
    from datasets import Features, Image, Value

    string = Value("string")
    return Features({"id": string, "image": Image(),
                     "conversations": [{"from": string, "value": string}],
                     "data_source": string})


def _onevision_row(row: dict, image: Path, config: str) -> dict:
    return {"id": row["id"], "image": {"bytes": image.read_bytes(), "path": image.name},
            "conversations": row["conversations"], "data_source": config}


def write_onevision(sharegpt4o: Path, mmmix: Path, out: Path) -> dict[str, int]:
    """``sharegpt4o`` (2 shards) and the MM-Mix source configs (1 shard each) of
    LLaVA-OneVision-Data, images embedded as bytes; returns rows per config."""
    repo = out / ONEVISION
    _readme(repo)
    configs = {"sharegpt4o": [_onevision_row(r, sharegpt4o / r["image"], "sharegpt4o")
                              for r in _jsonl(sharegpt4o / "train.jsonl")]}
    for r in _jsonl(mmmix / "records.jsonl"):
        config = MMMIX_CONFIGS[r["source"]]
        configs.setdefault(config, []).append(_onevision_row(r, mmmix / r["images"][0], config))
    for config, rows in configs.items():
        shards = 2 if config == "sharegpt4o" else 1
        _write_sharded(rows, repo / config, "train", shards, _onevision_features())
    return {config: len(rows) for config, rows in configs.items()}


def _mmlu_aggregates(root: Path, subjects: list[str]) -> None:
    """The hub's ``all/`` (every subject per split) and ``auxiliary_train/`` folders."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in ("dev", "validation", "test"):
        tables = [pq.read_table(root / s / f"{split}-00000-of-00001.parquet") for s in subjects]
        (root / "all").mkdir(exist_ok=True)
        pq.write_table(pa.concat_tables(tables), root / "all" / f"{split}-00000-of-00001.parquet")
    (root / "auxiliary_train").mkdir(exist_ok=True)
    shutil.copy(root / "all" / "dev-00000-of-00001.parquet",
                root / "auxiliary_train" / "train-00000-of-00001.parquet")


def write_eval(out: Path) -> None:
    """``cais/mmlu`` and ``MMMU/MMMU`` from the eval fixture generators."""
    from experiments.data.task_fixtures import MMLU_SUBJECTS, write_mmlu_hub, write_mmmu_subjects

    mmlu, mmmu = out / "datasets/cais/mmlu", out / "datasets/MMMU/MMMU"
    _readme(mmlu)
    write_mmlu_hub(mmlu)
    _mmlu_aggregates(mmlu, list(MMLU_SUBJECTS))
    _readme(mmmu)
    write_mmmu_subjects(mmmu, ("dev", "validation", "test"))


def write_models(proxies: Path, out: Path, seed: int) -> int:
    """The tiny Qwen3-VL with its tokenizer (trained on the proxies' text) and image
    processor in each of ``MODELS`` (one build, copied); returns the vocabulary size."""
    from experiments.data.assets import (
        build_image_processor,
        build_tiny_model,
        corpus_from_proxies,
        train_tokenizer,
    )

    first = out / "models" / MODELS[0]
    tokenizer = train_tokenizer(corpus_from_proxies(proxies), first)
    build_image_processor(QWEN_MAX_PIXELS, QWEN_MIN_PIXELS).save_pretrained(first)
    build_tiny_model(tokenizer, seed, first)
    for repo in MODELS[1:]:
        shutil.copytree(first, out / "models" / repo)
    return len(tokenizer)


def build_mirror(out: Path, records: int, seed: int) -> dict:
    """Write the whole mirror into ``out`` (which must be empty or absent); returns the
    record also written to ``out/MIRROR.json``.

    Example:
        >>> build_mirror(Path(tmp) / "mirror", records=40, seed=0)["rows"]["llava"]
        ...                                                     # doctest: +SKIP
        40
    """
    if records < 8:
        raise ValueError(f"records must be >= 8 (every MM-Mix source config needs rows), "
                         f"got {records}")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"Mirror folder {out} is not empty; remove it or pick another "
                              f"--out (a mirror is written whole, never merged)")
    start = time.perf_counter()
    n_test = max(2, records // 4)
    sizes = {"ultrachat": records + n_test, "llava": records, "sharegpt4o": records,
             "mmmix": 4 * records}  # MM-Mix rows are spread over four source configs
    with tempfile.TemporaryDirectory(prefix="hub_mirror-") as tmp:
        work = Path(tmp)
        for name, n in sizes.items():
            cfg = ProxyConfig(name, num_samples=max(n, CALIBRATION_SAMPLES), seed=seed)
            write_proxy(cfg, work / name, keep=n)
        rows = {"ultrachat": write_ultrachat(work / "ultrachat", out, n_test),
                "llava": write_llava(work / "llava", out),
                **write_onevision(work / "sharegpt4o", work / "mmmix", out)}
        write_eval(out)
        vocab = write_models(work, out, seed)
    record = {"records": records, "seed": seed, "rows": rows, "models": list(MODELS),
              "vocab_size": vocab, "seconds": round(time.perf_counter() - start, 2)}
    (out / "MIRROR.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.rehearsal.hub_mirror",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="mirror folder (new or empty)")
    parser.add_argument("--records", type=int, default=60, help="rows per training dataset")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from datasets import disable_progress_bars

    disable_progress_bars()  # one bar per parquet file would bury the summary
    record = build_mirror(args.out, args.records, args.seed)
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
