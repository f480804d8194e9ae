"""Training throughput of ODB vs fixed-batch Standard on one GPU (or the CPU, tiny).

A GPU-proxy check until the real train entry point exists: a randomly initialised
Qwen3 text model (``transformers`` class, about 0.15B parameters by default) trains with
AdamW in bf16 on synthetic token sequences whose lengths follow one of the paper-shaped
distributions (``bench.distributions``). Both methods see the same samples and the same
token budget; Standard uses the largest fixed batch that never exceeds the budget at the
cutoff length (what users pick to avoid OOM). Throughput is literal: emitted samples
over wall-clock training time, after a short warm-up on separate data.

    python -m bench.gpu_train_throughput --dataset sharegpt4o --samples 3000 --out r.json
    python -m bench.gpu_train_throughput --tiny --samples 64      # CPU smoke run

Numbers from a random-init proxy model are systems numbers, not the paper's results.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.utils.data import DataLoader

import odb
from bench import _io
from bench.distributions import CUTOFF, lengths


class TokenDataset:
    """Sample ``i``: random token ids of the drawn length; the first quarter is prompt."""

    def __init__(self, sizes: list[int], vocab: int, seed: int) -> None:
        self.sizes, self.vocab, self.seed = sizes, vocab, seed

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        ids = torch.randint(3, self.vocab, (self.sizes[index],), generator=generator)
        labels = ids.clone()
        labels[: len(ids) // 4] = -100
        return {"input_ids": ids, "labels": labels}


def build_model(tiny: bool, device: torch.device) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if tiny:
        cfg = Qwen3Config(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=CUTOFF,
        )
    else:
        cfg = Qwen3Config(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=CUTOFF,
        )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype)
    model.config._attn_implementation = "sdpa"
    return model


def train(model: torch.nn.Module, batches: Any, device: torch.device) -> dict[str, float]:
    """Run one pass; return literal counts and the wall time."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    samples = real = padded = steps = 0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    for batch in batches:
        info = odb.pop_step_info(batch) if odb.STEP_INFO_KEY in batch else None
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        n_items = info.loss_normalizer if info else int((batch["labels"][:, 1:] != -100).sum())
        loss = model(**batch, num_items_in_batch=n_items).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        samples += batch["input_ids"].shape[0] if info is None else info.local_samples
        real += int(batch["attention_mask"].sum())
        padded += batch["input_ids"].numel()
        steps += 1
        if steps % 50 == 0:
            _io.progress(
                f"{steps} steps, {samples / (time.perf_counter() - started):.1f} samples/s"
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    return {
        "samples": samples,
        "steps": steps,
        "wall_s": round(wall, 3),
        "samples_per_s": round(samples / wall, 2),
        "real_tokens_per_s": round(real / wall),
        "padding_efficiency": round(real / padded, 4),
        "peak_memory_gib": round(peak, 2),
    }


def loaders(dataset: TokenDataset, budget: int, workers: int) -> dict[str, Any]:
    standard_batch = max(1, budget // CUTOFF)
    return {
        "standard": DataLoader(
            dataset,
            batch_size=standard_batch,
            shuffle=True,
            num_workers=workers,
            collate_fn=odb.PadCollate(),
            generator=torch.Generator().manual_seed(0),
        ),
        "odb": odb.ODBLoader(dataset, token_budget=budget, num_workers=workers),
    }


def main() -> None:
    parser = _io.parser(__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sharegpt4o")
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="tiny model (CPU smoke run)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.tiny, device)
    vocab = model.config.vocab_size
    sizes = [int(x) for x in lengths(args.dataset, args.samples, seed=1)]
    warm = TokenDataset([int(x) for x in lengths(args.dataset, 32, seed=2)], vocab, seed=2)
    train(model, loaders(warm, args.budget, 0)["odb"], device)  # kernels, allocator
    results = {}
    for name, loader in loaders(
        TokenDataset(sizes, vocab, seed=1), args.budget, args.workers
    ).items():
        _io.progress(f"{name}: training on {len(sizes)} samples")
        results[name] = train(model, loader, device)
    speedup = results["odb"]["samples_per_s"] / results["standard"]["samples_per_s"]
    on_gpu = device.type == "cuda"
    scale = "GPU proxy (random-init Qwen3 text model)" if on_gpu else "CPU-proxy scale"
    machine = dict(
        _io.machine(),
        scale=scale,
        accelerator=torch.cuda.get_device_name() if on_gpu else "none (CPU)",
    )
    _io.emit(
        {
            "benchmark": "gpu_train_throughput",
            "machine": machine,
            "dataset": args.dataset,
            "budget": args.budget,
            "standard_batch_size": max(1, args.budget // CUTOFF),
            "samples": args.samples,
            "parameters": sum(p.numel() for p in model.parameters()),
            "results": results,
            "odb_speedup_vs_standard": round(speedup, 3),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
