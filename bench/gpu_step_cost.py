"""Fit the step-cost model on the real Qwen3-VL-2B architecture and check it on the proxies.

For the day a GPU is lent (sized for at most 8 minutes on one H100): the Qwen3-VL-2B
architecture (``experiments.train.model.ARCHITECTURES``, the ``transformers`` classes,
random weights, bf16, gradient checkpointing, frozen vision tower, AdamW) trains timed
steps over a grid of tokens per step, sample lengths and images; the two constants of
:mod:`odb.planning.step_cost` are fitted on those timings alone; then, on each of the four
proxies, the same model trains a seeded subset under Standard (one sample a step) and ODB
(budget 16384), every step timed, and the predicted speed-up of ODB over Standard is
printed beside the measured one. ``--tiny`` runs the same wiring with a tiny config on
CPU (the suite's test; its numbers mean nothing).

    python -m bench.gpu_step_cost --out docs/gpu/step_cost.json        # one GPU
    python -m bench.gpu_step_cost --tiny                               # CPU wiring
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from bench import _io
from experiments.data.proxy_plans import PROXY_NAMES
from experiments.plan_schedules import Samples, proxy_samples, schedule
from experiments.train.model import ARCHITECTURES, set_trainable
from odb.planning.hardware import GPUS, gpu
from odb.planning.models import Architecture, architecture, from_hf_config
from odb.planning.step_cost import (
    FITTED,
    Constants,
    Setup,
    Step,
    StepModel,
    fit_constants,
    schedule_terms,
)

QWEN_IDS = {"image_token_id": 151655, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653, "video_token_id": 151656}  # fmt: skip
_TINY_TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=32768,
                  rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3],
                                "mrope_interleaved": True})  # fmt: skip
_TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                    out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                    temporal_patch_size=2, deepstack_visual_indexes=[0])  # fmt: skip
PATCH_DIM = 3 * 2 * 16 * 16  # channels x temporal patch x patch x patch


def build(tiny: bool, device: torch.device) -> tuple[Any, dict[str, int], Architecture]:
    """The model (train mode, checkpointing, vision frozen), its special ids, its shapes."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    if tiny:
        text, vision, tied = dict(_TINY_TEXT), dict(_TINY_VISION), True
        ids = {k: 508 + i for i, k in enumerate(QWEN_IDS)}
    else:
        arch = ARCHITECTURES["qwen3-vl-2b"]
        text, vision, tied = dict(arch["text"]), dict(arch["vision"]), arch["tie_word_embeddings"]
        ids = dict(QWEN_IDS)
    text.update(pad_token_id=0, eos_token_id=1)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied,
                           **ids)  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration(config).to(dtype)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    set_trainable(model, train_vision=False)
    shapes = from_hf_config(config.to_dict(), "the timed model's config")
    return model.train(), ids, shapes


def _grid_hw(tokens: int) -> tuple[int, int]:
    """A merged-token grid ``a x b = tokens`` as square as divisors allow."""
    a = int(math.isqrt(tokens))
    while tokens % a:
        a -= 1
    return a, tokens // a


def make_batch(step: Step, ids: dict[str, int], vocab: int, device: torch.device) -> dict[str, Any]:
    """A padded batch of random tokens with each sample's images (random pixels)."""
    rows, pixels, grids = [], [], []
    gen = torch.Generator().manual_seed(len(step))
    for length, images in step:
        seq: list[int] = []
        for patches in images:
            a, b = _grid_hw(max(1, patches // 4))
            seq += [ids["vision_start_token_id"]] + [ids["image_token_id"]] * (a * b)
            seq += [ids["vision_end_token_id"]]
            pixels.append(torch.randn(4 * a * b, PATCH_DIM, generator=gen))
            grids.append([1, 2 * a, 2 * b])
        text = max(1, length - len(seq))
        seq += torch.randint(2, min(vocab, 500), (text,), generator=gen).tolist()
        rows.append(seq)
    width = max(len(r) for r in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    labels = input_ids.masked_fill(mask == 0, -100).masked_fill(
        input_ids >= min(ids.values()), -100
    )
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "labels": labels}
    if pixels:
        batch["mm_token_type_ids"] = (input_ids == ids["image_token_id"]).long()
        batch["pixel_values"] = torch.cat(pixels)
        batch["image_grid_thw"] = torch.tensor(grids)
    return {k: v.to(device) for k, v in batch.items()}


def timed_step(model: Any, optimizer: Any, batch: dict[str, Any], device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    sync()
    start = time.perf_counter()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if "pixel_values" in batch:
        batch = dict(batch, pixel_values=batch["pixel_values"].to(dtype))
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start


def grid_steps(tiny: bool) -> list[Step]:
    """Tokens per step x sample length, text only and with one image a sample."""
    tokens = (128, 1024) if tiny else (2048, 8192, 16384)
    lengths = (32, 256) if tiny else (256, 1024, 4096)
    steps: list[Step] = [[(n, ())] * max(1, t // n) for t in tokens for n in lengths]
    for image_tokens in (16,) if tiny else (256, 1024):
        for t in tokens:
            n = image_tokens + 66
            steps.append([(n, (4 * image_tokens,))] * max(1, t // n))
    return steps


def _shrink(samples: Samples) -> Samples:
    """CPU wiring: lengths and images cut to what a tiny model on 2 cores runs fast."""
    images = tuple(tuple(min(p, 16) for p in im) for im in samples.images)
    lengths = tuple(min(n, 128) for n in samples.lengths)
    return Samples(samples.name, lengths, images)


def proxy_check(model: Any, optimizer: Any, ids: dict[str, int], setup: Setup,
                constants: Constants, tiny: bool, n: int, device: torch.device
                ) -> dict[str, Any]:  # fmt: skip
    """Measured and predicted speed-ups of ODB over Standard on every proxy."""
    out = {}
    budget = 512 if tiny else 16384
    vocab = model.config.text_config.vocab_size
    for name in PROXY_NAMES:
        full = proxy_samples(name)  # 2,000 calibrated samples; their first n: a seeded subset
        samples = Samples(name, full.lengths[:n], full.images[:n])
        samples = _shrink(samples) if tiny else samples
        seconds, predicted = {}, {}
        for method in ("standard", "odb"):
            sched = schedule(samples, method, 1, budget=budget)
            steps = [s for s in sched[0] if s]
            seconds[method] = sum(timed_step(model, optimizer,
                                             make_batch(s, ids, vocab, device), device)
                                  for s in steps)  # fmt: skip
            predicted[method] = StepModel(setup, constants).epoch_seconds(sched)
        measured = seconds["standard"] / seconds["odb"]
        pred = predicted["standard"] / predicted["odb"]
        out[name] = {"measured_speedup": round(measured, 3), "predicted_speedup": round(pred, 3),
                     "error": round((pred - measured) / measured, 3),
                     "measured_s": {k: round(v, 3) for k, v in seconds.items()}}  # fmt: skip
    return out


def table_gpu(device: torch.device) -> str:
    if device.type != "cuda":
        return "h100"  # CPU wiring: a nominal GPU (the numbers mean nothing)
    name = torch.cuda.get_device_name(device).lower()
    return next((k for k in sorted(GPUS, key=len, reverse=True) if k in name), "h100")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = _io.parser(__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the CPU wiring (tiny config)")
    parser.add_argument("--samples", type=int, default=48, help="samples of each proxy")
    parser.add_argument("--repeats", type=int, default=2, help="timings of each grid step")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    model, ids, shapes = build(args.tiny, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    setup = Setup(shapes if args.tiny else architecture("qwen3-vl-2b"), gpu(table_gpu(device)),
                  "ddp", 1)  # fmt: skip
    vocab = model.config.text_config.vocab_size
    observations = []
    for k, step in enumerate(grid_steps(args.tiny)):
        batch = make_batch(step, ids, vocab, device)
        if k == 0:
            timed_step(model, optimizer, batch, device)  # warm-up: allocator, kernels
        times = [timed_step(model, optimizer, batch, device) for _ in range(args.repeats)]
        observations.append((schedule_terms(setup, [[step]]), statistics.median(times)))
        _io.progress(f"grid step {k}: {sum(n for n, _ in step)} tokens, {times}")
    try:
        constants, fit_error = fit_constants(observations), None
    except ValueError as error:  # noisy CPU timings of a tiny model can defeat the fit
        constants, fit_error = FITTED, str(error)
    result = {
        "benchmark": "gpu_step_cost", "device": str(device), "table_gpu": setup.gpu.name,
        "tiny": args.tiny, "constants": {"peak_mfu": round(constants.peak_mfu, 4),
                                         "step_overhead_s": round(constants.step_overhead_s, 5)},
        "grid_points": len(observations),
        "fit_error": fit_error,
        "proxies": proxy_check(model, optimizer, ids, setup, constants, args.tiny,
                               args.samples, device),
    }  # fmt: skip
    _io.emit(result, args.out)
    return result


if __name__ == "__main__":
    main()
