"""Bytes ODB's requests in flight hold at a prefetch depth, on the ShareGPT4o proxy
through the real Qwen3-VL pipeline at the paper's settings (why config/paper.yaml runs
depth 16, not the authors' 512).

Every preprocessed sample's tensors are counted exactly (``nbytes``; ``pixel_values`` as
the samples carry them, ``DataConfig.pixels``), over a seeded proxy of ``--samples``
records with the paper's pixel budget and cutoff; then the bytes of ``workers x depth``
samples in flight per rank (each worker's prefetch queue) and per node of ``--ranks``.
Bytes do not depend on the machine's speed; the proxy's image sizes follow the
ShareGPT4o shape the proxies were calibrated to (``experiments/data/proxies.py``).

    .venv/bin/python -m bench.inflight_bytes --out results/bench/inflight_bytes.json
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from bench import _io

PAPER_MAX_PIXELS = 589_824  # experiments/configs/scale/paper.yaml
PAPER_CUTOFF = 16_384


def sample_bytes(num_samples: int, max_pixels: int, cutoff: int, pixels: str) -> list[int]:
    """Bytes of every tensor of each of ``num_samples`` preprocessed ShareGPT4o samples."""
    from experiments.data.assets import build_image_processor, corpus_from_proxies, train_tokenizer
    from experiments.data.pipeline import PreprocessedDataset
    from experiments.data.proxies import write_proxy
    from experiments.data.proxy_plans import ProxyConfig
    from experiments.data.records import DataConfig

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_proxy(ProxyConfig("sharegpt4o", num_samples=num_samples, seed=0), root / "sharegpt4o")
        processor = root / "processor"
        train_tokenizer(corpus_from_proxies(root), processor)
        build_image_processor(max_pixels).save_pretrained(processor)
        ds = PreprocessedDataset(DataConfig("sharegpt4o", str(root / "sharegpt4o"), str(processor),
                                            image_max_pixels=max_pixels, cutoff_len=cutoff,
                                            pixels=pixels))
        out = []
        for i in range(len(ds)):
            out.append(sum(_nbytes(v) for v in ds[i].values()))
            if (i + 1) % 50 == 0:
                _io.progress(f"{i + 1}/{len(ds)} samples")
        return out


def _nbytes(value: object) -> int:
    if isinstance(value, torch.Tensor):
        return value.nbytes
    parts = getattr(value, "parts", None)  # odb.TensorParts
    return sum(p.nbytes for p in parts) if parts is not None else 0


def main() -> None:
    parser = _io.parser(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers per rank")
    parser.add_argument("--ranks", type=int, default=8, help="ranks per node")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 4, 8, 16, 64, 512])
    parser.add_argument("--pixels", choices=["uint8", "float32"], default="uint8")
    args = parser.parse_args()
    sizes = np.array(sample_bytes(args.samples, PAPER_MAX_PIXELS, PAPER_CUTOFF, args.pixels))
    mean = float(sizes.mean())
    gib = 2.0 ** 30
    _io.emit({
        "benchmark": "inflight_bytes", "scale": "CPU-proxy (ShareGPT4o proxy, paper pixels)",
        "machine": _io.machine(), "samples": int(sizes.size), "pixels": args.pixels,
        "image_max_pixels": PAPER_MAX_PIXELS, "cutoff_len": PAPER_CUTOFF,
        "sample_mb": {"mean": mean / 2**20, "p50": float(np.median(sizes)) / 2**20,
                      "p90": float(np.percentile(sizes, 90)) / 2**20,
                      "max": float(sizes.max()) / 2**20},
        "workers": args.workers, "ranks_per_node": args.ranks,
        "in_flight": [{"depth": d, "samples_per_rank": args.workers * d,
                       "gib_per_rank": args.workers * d * mean / gib,
                       "gib_per_node": args.ranks * args.workers * d * mean / gib}
                      for d in args.depths],
    }, args.out)


if __name__ == "__main__":
    main()
