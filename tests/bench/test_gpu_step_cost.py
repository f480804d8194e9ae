"""The GPU step-cost command's wiring, run on CPU with a tiny Qwen3-VL config."""

from __future__ import annotations

import torch

from bench import gpu_step_cost


def test_a_batch_holds_each_image_as_its_grid_says() -> None:
    ids = {k: 508 + i for i, k in enumerate(gpu_step_cost.QWEN_IDS)}
    step = [(100, (4 * 12,)), (40, ()), (90, (4 * 7, 4 * 9))]
    batch = gpu_step_cost.make_batch(step, ids, 512, torch.device("cpu"))
    image_tokens = int((batch["input_ids"] == ids["image_token_id"]).sum())
    grids = batch["image_grid_thw"]
    assert image_tokens == int(grids.prod(dim=1).sum()) // 4 == 12 + 7 + 9
    assert batch["pixel_values"].shape == (4 * (12 + 7 + 9), gpu_step_cost.PATCH_DIM)
    assert batch["input_ids"].shape == (3, 100)  # padded to the longest row
    assert int(batch["attention_mask"].sum()) == 100 + 40 + 90
    assert int((batch["mm_token_type_ids"] == 1).sum()) == image_tokens


def test_the_cpu_wiring_fits_and_compares_on_the_four_proxies() -> None:
    result = gpu_step_cost.main(["--tiny", "--samples", "6", "--repeats", "1"])
    assert result["grid_points"] == len(gpu_step_cost.grid_steps(True))
    assert set(result["proxies"]) == {"ultrachat", "llava", "sharegpt4o", "mmmix"}
    for row in result["proxies"].values():
        assert row["measured_speedup"] > 0 and row["predicted_speedup"] > 0
        assert row["measured_s"]["standard"] > 0 and row["measured_s"]["odb"] > 0
