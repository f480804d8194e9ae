"""Post-pipeline length statistics of one dataset config, as JSON plus a histogram.

Lengths are the real pipeline's (`PreprocessedDataset.length`: template, tokens, visual
tokens, cutoff), so on the cluster this measures the real datasets and here the proxies.

    python -m experiments.data.length_stats --dataset mmmix --source data/proxies/mmmix \
        --processor data/assets/processor --hist results/data/mmmix_lengths.png
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np

from experiments.data.pipeline import PreprocessedDataset
from experiments.data.proxy_lengths import SHORT_THRESHOLD, summary
from experiments.data.records import DataConfig


def write_histogram(lengths: np.ndarray, path: Path, title: str) -> None:
    """A log-count histogram of ``lengths`` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(lengths, bins=80, color="#4477aa")
    ax.set_xlabel("post-pipeline length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, choices=["ultrachat", "llava", "sharegpt4o",
                                                             "mmmix"])
    parser.add_argument("--source", required=True, help="local file/folder or hub dataset id")
    parser.add_argument("--processor", required=True, help="local folder or hub model id")
    parser.add_argument("--subset", default=None)
    parser.add_argument("--split", default="train")
    parser.add_argument("--image-dir", default=None)
    parser.add_argument("--cutoff-len", type=int, default=16384)
    parser.add_argument("--image-max-pixels", type=int, default=768 * 768)
    parser.add_argument("--aug-min-scale", type=float, default=1.0)
    parser.add_argument("--aug-max-scale", type=float, default=1.0)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-samples", type=int, default=0, help="0 = all")
    parser.add_argument("--short-threshold", type=int, default=SHORT_THRESHOLD)
    parser.add_argument("--hist", type=Path, default=None, help="histogram PNG to write")
    parser.add_argument("--out", type=Path, default=None, help="JSON to write")
    args = parser.parse_args(argv)
    cfg = DataConfig(args.dataset, args.source, args.processor, subset=args.subset,
                     split=args.split, image_dir=args.image_dir, cutoff_len=args.cutoff_len,
                     image_max_pixels=args.image_max_pixels, aug_min_scale=args.aug_min_scale,
                     aug_max_scale=args.aug_max_scale, seed=args.seed,
                     max_samples=args.max_samples)
    dataset = PreprocessedDataset(cfg)
    dataset.set_epoch(args.epoch)
    start = time.perf_counter()
    lengths = dataset.lengths()
    record = {"dataset": args.dataset, "epoch": args.epoch,
              "fingerprint": dataset.fingerprint(),
              **summary(lengths, args.short_threshold),
              "seconds": round(time.perf_counter() - start, 2)}
    if args.hist is not None:
        write_histogram(lengths, args.hist, f"{args.dataset}: CV {record['cv']:.2f}")
        record["histogram"] = str(args.hist)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
