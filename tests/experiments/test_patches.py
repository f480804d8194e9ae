"""uint8 patches without the float round trip: the processor's integers, exactly, or no
patcher at all."""

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from experiments.data.assets import build_image_processor
from experiments.data.patches import Uint8Patcher
from experiments.data.pipeline import PreprocessedDataset
from experiments.data.pixels import PixelCodec


def _image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng([width, height, seed])
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _processor_integers(processor, images):
    """The processor's un-normalised output as the uint8 form holds it (one frame)."""
    out = processor(images=images, return_tensors="pt", do_rescale=False, do_normalize=False)
    codec = PixelCodec.for_processor(processor)
    return codec.encode(out["pixel_values"]), out["image_grid_thw"]


@pytest.mark.parametrize("max_pixels", [768 * 768, 64 * 64 * 32])
def test_patches_equal_the_processor_integers(max_pixels: int) -> None:
    """Scaled down past the budget, up to the minimum, resized to the factor, left as
    they are; one image or several at once."""
    processor = build_image_processor(max_pixels)
    patcher = Uint8Patcher.for_processor(processor)
    assert patcher is not None and patcher.max_pixels == max_pixels
    sizes = [(1500, 700), (40, 1000), (20, 30), (321, 257), (256, 512)]
    for width, height in sizes:
        image = _image(width, height)
        pixels, grid = patcher([image])
        expected, expected_grid = _processor_integers(processor, [image])
        assert pixels.dtype == torch.uint8 and pixels.shape[1] == 3 * 16 * 16
        assert torch.equal(pixels, expected), (width, height)
        assert torch.equal(grid, expected_grid)
    images = [_image(w, h, seed=1) for w, h in sizes]
    pixels, grid = patcher(images)
    expected, expected_grid = _processor_integers(processor, images)
    assert torch.equal(pixels, expected)
    assert torch.equal(grid, expected_grid)


def test_a_processor_it_does_not_reproduce_gets_none() -> None:
    processor = build_image_processor(768 * 768)

    class OtherBackend:
        backend = "torchvision"

    class OtherLayout:
        """The PIL processor with its patch rows in another order."""

        backend, size, resample = "pil", processor.size, processor.resample
        patch_size, merge_size = processor.patch_size, processor.merge_size
        temporal_patch_size = processor.temporal_patch_size

        def __call__(self, images, **kwargs):
            out = dict(processor(images=images, **kwargs))
            out["pixel_values"] = out["pixel_values"].flip(0)
            return out

    class DistinctFrames(OtherLayout):
        """Frames that differ: one of them cannot stand for both."""

        def __call__(self, images, **kwargs):
            out = dict(processor(images=images, **kwargs))
            pixels = out["pixel_values"].clone()
            pixels[:, 256:512] = 255 - pixels[:, 256:512]  # channel 0, second frame
            out["pixel_values"] = pixels
            return out

    class NoGeometry:
        backend = "pil"

    assert Uint8Patcher.for_processor(OtherBackend()) is None
    assert Uint8Patcher.for_processor(OtherLayout()) is None
    assert Uint8Patcher.for_processor(DistinctFrames()) is None
    assert Uint8Patcher.for_processor(NoGeometry()) is None


def test_the_pipeline_patches_uint8_only(datasets_by_name: dict) -> None:
    ds = datasets_by_name["sharegpt4o"]
    assert ds.uint8_patcher is not None
    assert ds.uint8_patcher.max_pixels == ds.cfg.image_max_pixels
    floats = PreprocessedDataset(dataclasses.replace(ds.cfg, pixels="float32"))
    assert floats.uint8_patcher is None and floats.pixel_codec is None
