"""MM-Mix at paper scale: compose the multimodal mix from staged LLaVA-OneVision parquet.

The paper's MM-Mix is a production mix that is not public; its reported statistics are a
post-pipeline length CV of 0.80 with a high density of short samples. The authors'
public stand-in (``build-mm-mix-dataset``) is not available either, so this module
rebuilds it from the five of its sources that are configs of
``lmms-lab/LLaVA-OneVision-Data`` (reference/DATASETS_AND_EVAL.md section 1.4):

- ``iiit5k`` (config ``iiit5k``): OCR, one-word answers;
- ``orand_car_a`` (``orand_car_a``): OCR, handwritten amounts;
- ``aokvqa`` (``aokvqa(cauldron,llava_format)``): VQA, short answers;
- ``image_textualization`` (``image_textualization(filtered)``): captions, long;
- ``sharegpt4o`` (``sharegpt4o``): captions, long.

Weights. The role shares are the CPU proxy's calibration (`experiments.data.proxies`:
``MMMIX_SHARES`` = OCR 0.40, VQA 0.08, caption 0.52, the shares at which its length
model gives CV 0.80 and 40% of samples under ``SHORT_THRESHOLD`` tokens); each role's
share is split evenly over its staged sources. ``short_fraction`` (default 0.48, the
proxy's OCR + VQA share) moves the short-answer roles together, keeping their 5:1
ratio; the caption roles get the rest. With the LLaMA-Factory pixel budget (589,824) an
OCR sample is ~90 tokens (a 64-token image floor and a word), a VQA sample ~350 (a COCO
image) and a caption ~700-1,000 (a capped image and a 150-400 word caption), so the mix
is bimodal and its CV comes mostly from the 40/52 split, as in the proxy.

Assumptions (the authors' builder is not public): the public mix also had
``chinese_text_recognition`` (OCR) and ``vqa_like`` (VQA), which are not LLaVA-OneVision
configs and are left out (their roles' shares go to the staged sources of the same
role); the even split inside a role; uniform sampling of rows inside a source. Each
build estimates lengths (text characters / 4 + 5 template tokens per message + image
tokens from the image header) and writes the estimate to ``metadata.json``; measure the
real post-pipeline statistics with `experiments.data.length_stats`.

The OCR configs are small (the dataset card lists ~2,000 rows each), so at the paper's
~200k records the default weights need each OCR row ~20 times. Repeats are never
silent: a build that needs more rows than a source holds stops and names the largest
``--records`` it can build, unless ``--max-repeats`` allows repeated rows (a repeated
row is a new record, ``<id>_r<k>``, sharing the image file).

Output, the TMDB layout that `experiments.data.pipeline` reads (dataset ``mmmix``):
``records.jsonl`` (``id``, ``source``, ``conversations``, ``images`` relative to the
folder, ``upstream`` = ``{dataset, config, index, id}``), ``images/<source>/<id>.<ext>``
(the parquet bytes as they are, never re-encoded) and ``metadata.json``, written last,
so its presence marks a complete build. Records are in a seeded random order, so the
pipeline's held-out tail is a mix of every source. Parquet is read one row group at a
time; a source is never held in memory.

    python -m experiments.data.mm_mix --cache <site_cache> --out data/mm_mix \
        --records 206526 --seed 0 --max-repeats 25
"""

import argparse
import json
import math
import shutil
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.data.mm_mix_rows import (
    CHARS_PER_TOKEN,
    HUB_DATASET,
    SOURCE_CONFIGS,
    conversations_of,
    estimate_length,
    inspect_image,
    iter_rows,
    num_rows,
    staged_files,
)
from experiments.data.proxy_lengths import (
    SHORT_THRESHOLD,
    TEMPLATE_TOKENS_PER_MESSAGE,
    summary,
)
from experiments.data.proxy_plans import LF_MAX_PIXELS, MMMIX_SHARES, MMMIX_SOURCES, TARGET_CV

BUILDER_VERSION = 1
SHORT_ROLES = ("ocr", "vqa")
DEFAULT_SHORT_FRACTION = round(sum(MMMIX_SHARES[r] for r in SHORT_ROLES), 6)


def role_of(source: str) -> str:
    """The proxy's role (``ocr``, ``vqa``, ``caption``) of an MM-Mix source name."""
    return next(role for role, names in MMMIX_SOURCES.items() if source in names)


def source_weights(short_fraction: float = DEFAULT_SHORT_FRACTION) -> dict[str, float]:
    """Per-source weights summing to 1: role shares from the proxy, scaled so the short
    roles sum to ``short_fraction``, each split evenly over its sources.

    Example:
        >>> round(source_weights()["iiit5k"], 3), round(source_weights()["sharegpt4o"], 3)
        (0.2, 0.26)
    """
    if not 0.0 < short_fraction < 1.0:
        raise ValueError(f"short_fraction must be in (0, 1), got {short_fraction}")
    short = sum(MMMIX_SHARES[r] for r in SHORT_ROLES)
    role_share = {r: (short_fraction * s / short if r in SHORT_ROLES
                      else (1 - short_fraction) * s / (1 - short))
                  for r, s in MMMIX_SHARES.items()}
    per_role = {r: sum(role_of(s) == r for s in SOURCE_CONFIGS) for r in MMMIX_SHARES}
    return {s: role_share[role_of(s)] / per_role[role_of(s)] for s in SOURCE_CONFIGS}


@dataclass(frozen=True)
class MMMixConfig:
    """One MM-Mix build.

    Attributes:
        cache: the site cache; sources are read from
            ``<cache>/datasets/lmms-lab/LLaVA-OneVision-Data/<config>/*.parquet``.
        out: the TMDB folder to write.
        records: records in the mix.
        seed: seeds row choice and order; equal configs and staged files give
            byte-identical outputs.
        short_fraction: share of records from the short-answer roles (OCR + VQA).
        max_repeats: how often one upstream row may appear (1 = never repeated).
        image_max_pixels: pixel budget of the length estimate (the pipeline's setting).
        overwrite: replace an existing build in ``out``.

    Example:
        >>> MMMixConfig(Path("cache"), Path("out"), records=100).short_fraction
        0.48
    """

    cache: Path
    out: Path
    records: int
    seed: int = 0
    short_fraction: float = DEFAULT_SHORT_FRACTION
    max_repeats: int = 1
    image_max_pixels: int = LF_MAX_PIXELS
    overwrite: bool = False
    weights: dict[str, float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.records < len(SOURCE_CONFIGS):
            raise ValueError(f"records must be >= {len(SOURCE_CONFIGS)} (one per source), "
                             f"got {self.records}")
        if self.max_repeats < 1:
            raise ValueError(f"max_repeats must be >= 1 (1 = no repeats), got {self.max_repeats}")
        if self.image_max_pixels < 1:
            raise ValueError(f"image_max_pixels must be >= 1, got {self.image_max_pixels}")
        object.__setattr__(self, "weights", source_weights(self.short_fraction))


def allocate(weights: dict[str, float], n: int) -> dict[str, int]:
    """Integer counts summing to ``n``, each within 1 of ``weight * n`` (largest remainder)."""
    exact = {s: w * n for s, w in weights.items()}
    counts = {s: math.floor(x) for s, x in exact.items()}
    by_remainder = sorted(weights, key=lambda s: (counts[s] - exact[s], s))
    for s in by_remainder[: n - sum(counts.values())]:
        counts[s] += 1
    return counts


def choose_rows(num_rows: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted upstream row indices, ``count`` of them: every row ``count // num_rows``
    times, plus a uniform sample without replacement for the remainder."""
    full, rest = divmod(count, num_rows)
    picks = np.concatenate([np.tile(np.arange(num_rows), full),
                            rng.choice(num_rows, rest, replace=False)])
    return np.sort(picks.astype(np.int64))


def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode())


@dataclass
class _Part:
    """One source's records in a temporary JSON-lines file (offsets of each line)."""

    path: Path
    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


def _record_lines(source: str, index: int, row: dict, out: Path,
                  copies: int, max_pixels: int) -> tuple[list[str], int]:
    """The JSON lines (one per copy) of one upstream row, and its length estimate; writes
    its image file."""
    rid = f"{source}_{index:08d}"
    where = f"{SOURCE_CONFIGS[source]} row {index} (id {row.get('id')!r})"
    image = row.get("image")
    if image is not None and not image.get("bytes"):
        raise ValueError(f"{where}: the image has no embedded bytes (path "
                         f"{image.get('path')!r}); stage the hub parquet, which embeds them")
    images, size = [], None
    if image is not None:
        ext, size = inspect_image(image["bytes"], where)
        images = [f"images/{source}/{rid}.{ext}"]
        (out / images[0]).write_bytes(image["bytes"])
    conv = conversations_of(row, bool(images), where)
    upstream = {"dataset": HUB_DATASET, "config": SOURCE_CONFIGS[source], "index": index,
                "id": row.get("id")}
    lines = [json.dumps({"id": rid if k == 0 else f"{rid}_r{k}", "source": source,
                         "conversations": conv, "images": images, "upstream": upstream},
                        ensure_ascii=False) + "\n" for k in range(copies)]
    return lines, estimate_length(conv, size, max_pixels)


def _write_source(cfg: MMMixConfig, source: str, rows: np.ndarray, parts: Path) -> _Part:
    """Stream ``source``'s chosen rows into its images and a temporary part file."""
    part = _Part(parts / f"{source}.jsonl")
    (cfg.out / "images" / source).mkdir(parents=True, exist_ok=True)
    unique, copies = np.unique(rows, return_counts=True)
    done, step, start = 0, max(1, len(rows) // 10), time.perf_counter()
    with part.path.open("wb") as f:
        for (index, row), n in zip(iter_rows(staged_files(cfg.cache, source), unique),
                                   copies.tolist(), strict=True):
            lines, length = _record_lines(source, index, row, cfg.out, n, cfg.image_max_pixels)
            for line in lines:
                part.offsets.append(f.tell())
                part.lengths.append(length)
                f.write(line.encode())
            if (done + n) // step > done // step or done + n == len(rows):
                _progress(f"{source}: {done + n}/{len(rows)} records "
                          f"({time.perf_counter() - start:.1f} s)")
            done += n
    return part


def _progress(message: str) -> None:
    print(f"[mm_mix] {message}", file=sys.stderr, flush=True)


def _merge(parts: dict[str, _Part], counts: dict[str, int], seed: int,
           out: Path) -> list[int]:
    """Write ``records.jsonl`` in a seeded random order of the part files' lines;
    returns the length estimates in that order."""
    rng = np.random.default_rng([seed, _stable_int("order")])
    labels = rng.permutation(np.repeat(np.array(list(counts)), list(counts.values())))
    queues = {s: iter(rng.permutation(len(p.offsets)).tolist()) for s, p in parts.items()}
    handles = {s: p.path.open("rb") for s, p in parts.items()}
    lengths = []
    try:
        with (out / "records.jsonl").open("wb") as f:
            for source in labels.tolist():
                k = next(queues[source])
                handles[source].seek(parts[source].offsets[k])
                f.write(handles[source].readline())
                lengths.append(parts[source].lengths[k])
    finally:
        for h in handles.values():
            h.close()
    return lengths


def _prepare_out(cfg: MMMixConfig) -> None:
    """Refuse to mix with an earlier build unless ``overwrite``; then clear it."""
    ours = [cfg.out / n for n in ("records.jsonl", "metadata.json", "images", ".parts")]
    existing = [p for p in ours if p.exists()]
    if existing and not cfg.overwrite:
        raise FileExistsError(f"{cfg.out} already holds a build ({existing[0].name}); "
                              f"pass --overwrite to replace it or pick another --out")
    for p in existing:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    cfg.out.mkdir(parents=True, exist_ok=True)


def plan(cfg: MMMixConfig) -> tuple[dict[str, int], dict[str, list[Path]], dict[str, int]]:
    """(records per source, staged files, upstream rows per source); checks every source
    before anything is written."""
    counts = allocate(cfg.weights, cfg.records)
    files = {s: staged_files(cfg.cache, s) for s in SOURCE_CONFIGS}
    rows = {s: num_rows(files[s]) for s in SOURCE_CONFIGS}
    for s, n in counts.items():
        if n > rows[s] * cfg.max_repeats:
            most = math.floor(rows[s] * cfg.max_repeats / cfg.weights[s])
            raise ValueError(
                f"MM-Mix source {s!r} holds {rows[s]} rows but {n} records are needed "
                f"(weight {cfg.weights[s]:.3f} x {cfg.records}) with max_repeats="
                f"{cfg.max_repeats}; lower --records to at most {most} or set --max-repeats "
                f"{math.ceil(n / rows[s])}")
    return counts, files, rows


def build(cfg: MMMixConfig) -> dict:
    """Build the mix described by ``cfg``; returns the metadata written.

    Example:
        >>> build(MMMixConfig(Path("cache"), Path("data/mm_mix"), 1000))  # doctest: +SKIP
        {'num_records': 1000, ...}
    """
    start = time.perf_counter()
    counts, files, rows = plan(cfg)
    _prepare_out(cfg)
    parts_dir = cfg.out / ".parts"
    parts_dir.mkdir()
    parts = {}
    for s in SOURCE_CONFIGS:
        rng = np.random.default_rng([cfg.seed, _stable_int(s)])
        parts[s] = _write_source(cfg, s, choose_rows(rows[s], counts[s], rng), parts_dir)
    lengths = _merge(parts, counts, cfg.seed, cfg.out)
    shutil.rmtree(parts_dir)
    meta = _metadata(cfg, counts, files, rows, lengths)
    (cfg.out / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    _progress(f"{cfg.records} records in {cfg.out} ({time.perf_counter() - start:.1f} s); "
              f"estimated CV {meta['estimated_lengths']['cv']} (target {TARGET_CV['mmmix']})")
    return meta


def _metadata(cfg: MMMixConfig, counts: dict[str, int], files: dict[str, list[Path]],
              rows: dict[str, int], lengths: list[int]) -> dict:
    return {
        "num_records": cfg.records, "builder": "experiments.data.mm_mix",
        "builder_version": BUILDER_VERSION, "seed": cfg.seed,
        "short_fraction": cfg.short_fraction, "max_repeats": cfg.max_repeats,
        "counts": counts, "weights": {s: round(w, 6) for s, w in cfg.weights.items()},
        "roles": {s: role_of(s) for s in SOURCE_CONFIGS},
        "sources": {s: {"dataset": HUB_DATASET, "config": SOURCE_CONFIGS[s],
                        "upstream_rows": rows[s],
                        "files": [{"path": str(f.relative_to(cfg.cache)),
                                   "bytes": f.stat().st_size} for f in files[s]]}
                    for s in SOURCE_CONFIGS},
        "estimated_lengths": {**summary(np.array(lengths), SHORT_THRESHOLD),
                              "image_max_pixels": cfg.image_max_pixels,
                              "method": f"text chars / {CHARS_PER_TOKEN} + "
                                        f"{TEMPLATE_TOKENS_PER_MESSAGE} per message + "
                                        "image tokens; not the pipeline's"},
        "target_cv": TARGET_CV["mmmix"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="site cache with the "
                        f"staged {HUB_DATASET} configs under datasets/")
    parser.add_argument("--out", type=Path, required=True, help="TMDB folder to write")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--short-fraction", type=float, default=DEFAULT_SHORT_FRACTION,
                        help="share of OCR + VQA records (default: the proxy's 0.48)")
    parser.add_argument("--max-repeats", type=int, default=1,
                        help="times one upstream row may be used (default 1: never repeated)")
    parser.add_argument("--image-max-pixels", type=int, default=LF_MAX_PIXELS,
                        help="pixel budget of the length estimate in metadata.json")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    cfg = MMMixConfig(args.cache, args.out, args.records, seed=args.seed,
                      short_fraction=args.short_fraction, max_repeats=args.max_repeats,
                      image_max_pixels=args.image_max_pixels, overwrite=args.overwrite)
    meta = build(cfg)
    print(json.dumps({k: meta[k] for k in ("num_records", "counts", "estimated_lengths")},
                     indent=2))
    return meta


if __name__ == "__main__":
    main()
