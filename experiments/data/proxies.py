"""Seeded proxy datasets in the real schemas, calibrated to the paper's length statistics.

The CPU path has no hub, so each paper dataset is replaced by a generated proxy written in
the dataset's *real* on-disk schema (so the real loader and preprocessing run unchanged):

- ``ultrachat``: UltraChat 200k rows ``{prompt, prompt_id, messages: [{role, content}]}``
  (JSON lines; the hub ships parquet with the same columns);
- ``llava``: LLaVA-Instruct-150K, one JSON array of ``{id, image, conversations:
  [{from, value}]}`` with ``<image>`` in the first human turn and images under
  ``train2017/``;
- ``sharegpt4o``: LLaVA-OneVision ``sharegpt4o`` rows ``{id, image, conversations,
  data_source}`` (``image`` is a path here, a decoded image on the hub);
- ``mmmix``: the MM-Mix "TMDB" directory: ``records.jsonl`` of ``{id, source,
  conversations, images, upstream}``, ``metadata.json`` and ``images/``.

Text is word salad over a fixed synthetic vocabulary; the tokenizer trained on it
(`experiments.data.assets`) maps nearly every word to one token, so a word count is a
token count. Post-pipeline length is then modelled as text words + 5 template tokens per
message + (Qwen-VL image tokens + 2) per image, clipped at the cutoff. Each proxy has one
dispersion knob, solved by bisection on the *same seeded draws* (common random numbers),
so the realised CV of the written sample hits the target for any size and seed, not only
in expectation. The measured CV after the real pipeline is checked by the tests.

A "leverage" family (MM-Mix schema, text only) sweeps CV and the short-sample fraction
``f_s`` independently for the short-sample-leverage ablation.

    python -m experiments.data.proxies --out data/proxies          # the four defaults
    python -m experiments.data.proxies --out data/proxies --leverage-cv 0.6 0.8 \
        --leverage-fs 0.2 0.5
"""

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from experiments.data.proxy_files import WRITERS, TextSource
from experiments.data.proxy_lengths import summary
from experiments.data.proxy_plans import (
    KNOB_NAMES,
    PROXY_NAMES,
    LeverageConfig,
    ProxyConfig,
    calibrate,
    calibrate_leverage,
)

GENERATOR_VERSION = 1


def write_proxy(cfg: ProxyConfig, out_dir: Path, keep: int = 0) -> dict:
    """Calibrate and write one proxy under ``out_dir``; returns its metadata record.

    ``keep`` > 0 writes only the first ``keep`` records of the calibrated sample: a few
    records drawn from the distribution that ``cfg.num_samples`` records calibrate (a
    small sample alone often cannot reach the target CV); ``model_stats`` then describes
    the written records.

    Example:
        >>> meta = write_proxy(ProxyConfig("ultrachat", 50), Path(tmp))  # doctest: +SKIP
        >>> meta["data_file"]  # doctest: +SKIP
        '.../train.jsonl'
    """
    if not 0 <= keep <= cfg.num_samples:
        raise ValueError(f"keep must be in [0, num_samples={cfg.num_samples}], got {keep}")
    start = time.perf_counter()
    knob, plans, lengths = calibrate(cfg)
    if keep:
        plans, lengths = plans[:keep], lengths[:keep]
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = WRITERS[cfg.name](out_dir, plans, TextSource(cfg.seed, cfg.name))
    meta = {
        "generator_version": GENERATOR_VERSION, "config": asdict(cfg),
        "data_file": str(data_file), "knob": {KNOB_NAMES[cfg.name]: round(knob, 6)},
        "model_stats": summary(lengths), "seconds": round(time.perf_counter() - start, 2),
    }
    if keep:
        meta["kept"] = keep
    (out_dir / "proxy_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def write_leverage(cfg: LeverageConfig, out_dir: Path, cutoff_len: int = 16384) -> dict:
    """Calibrate and write one leverage mix (MM-Mix TMDB layout) under ``out_dir``."""
    t, plans, lengths = calibrate_leverage(cfg, cutoff_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = WRITERS["mmmix"](out_dir, plans, TextSource(cfg.seed, cfg.name))
    meta = {"generator_version": GENERATOR_VERSION, "config": asdict(cfg),
            "data_file": str(data_file), "knob": {"path_t": round(t, 6)},
            "model_stats": summary(lengths)}
    (out_dir / "proxy_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="root folder of the proxies")
    parser.add_argument("--datasets", nargs="*", default=list(PROXY_NAMES), choices=PROXY_NAMES)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--leverage-cv", type=float, nargs="*", default=[])
    parser.add_argument("--leverage-fs", type=float, nargs="*", default=[])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = {}
    for name in args.datasets:
        cfg = ProxyConfig(name, num_samples=args.num_samples, seed=args.seed)
        report[name] = write_proxy(cfg, args.out / name)
    for cv in args.leverage_cv:
        for fs in args.leverage_fs:
            cfg = LeverageConfig(cv, fs, num_samples=args.num_samples, seed=args.seed)
            report[cfg.name] = write_leverage(cfg, args.out / "leverage" / cfg.name)
    report["total_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
