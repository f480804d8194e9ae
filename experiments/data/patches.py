"""An image's uint8 patches straight from its pixels, as the Qwen-VL PIL processor lays them out.

The processor (``Qwen2VLImageProcessorPil``) resizes an image with PIL, then turns the
resized 0-255 integers into float32 and copies them into patch order (each patch
written ``temporal_patch_size`` times). With ``DataConfig.pixels = "uint8"`` the
pipeline only wants one frame of those integers back as uint8
(:meth:`experiments.data.pixels.PixelCodec.encode`), so the float round trip is wasted
work: it writes four bytes per value twice (the patch copy and the concatenation), every
frame, and then narrows them. :class:`Uint8Patcher` does the same resize and the same
patch order on the uint8 pixels themselves, one frame (measured on ShareGPT-4o at its
pixel budget: about 2x faster per sample, the resize being most of what is left).

The invariant: ``Uint8Patcher(images)`` equals ``codec.encode`` of the processor's
un-normalised output (``do_rescale=False, do_normalize=False``): the first frame of each
patch row as uint8, values and ``image_grid_thw``. :meth:`Uint8Patcher.for_processor`
checks it on probe images (and that the frames are identical) and returns None for a
processor it does not reproduce (another backend, another patch layout), so callers
fall back to the processor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

# Probe images (width, height): one below the minimum pixel count (scaled up), one
# resized to the patch factor (down in width, up in height), one that the project's
# processors leave as it is (on their 32-pixel factor, above their minimum).
_PROBE_SIZES = ((37, 23), (301, 177), (256, 288))


@dataclass(frozen=True)
class Uint8Patcher:
    """Resize + patchify of RGB images in uint8, the PIL processor's layout, one frame.

    Attributes:
        patch_size / merge_size: the processor's patch geometry.
        min_pixels / max_pixels: the processor's pixel budget (``size`` shortest /
            longest edge), which sets each image's resized size.
        resample: the PIL resampling filter the processor resizes with.
    """

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    resample: int

    def __call__(self, images: list[Image.Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """(``pixel_values`` uint8, patches x C*P*P; ``image_grid_thw`` int64, images x 3)
        of RGB ``images``, concatenated in order."""
        patches, grids = zip(*(self._one(image) for image in images), strict=True)
        pixels = patches[0] if len(patches) == 1 else np.concatenate(patches)
        return torch.from_numpy(pixels), torch.tensor(grids, dtype=torch.int64)

    def _one(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        p, m = self.patch_size, self.merge_size
        width, height = image.size
        new_h, new_w = smart_resize(height, width, factor=p * m, min_pixels=self.min_pixels,
                                    max_pixels=self.max_pixels)
        if (new_w, new_h) != (width, height):
            image = image.resize((new_w, new_h), resample=self.resample)
        hwc = np.asarray(image)
        channels = hwc.shape[2]
        grid_h, grid_w = new_h // p, new_w // p
        # (H, W, C) -> (gh/m, gw/m, m, m, C, p, p): merge blocks, then channel-major patches.
        blocks = hwc.reshape(grid_h // m, m, p, grid_w // m, m, p, channels)
        blocks = np.ascontiguousarray(blocks.transpose(0, 3, 1, 4, 6, 2, 5))
        return blocks.reshape(grid_h * grid_w, channels * p * p), (1, grid_h, grid_w)

    @classmethod
    def for_processor(cls, processor: Any) -> Uint8Patcher | None:
        """The patcher that reproduces ``processor``'s uint8 integers exactly, or None.

        None when the processor is not a PIL-backend Qwen-VL image processor or the probe
        images come out different (then call the processor itself).
        """
        if getattr(processor, "backend", None) != "pil":
            return None
        try:
            size = processor.size
            patcher = cls(int(processor.patch_size), int(processor.merge_size),
                          int(size["shortest_edge"]), int(size["longest_edge"]),
                          int(processor.resample))
            frames = int(processor.temporal_patch_size)
        except (AttributeError, KeyError, TypeError):
            return None
        for wh in _PROBE_SIZES:
            rng = np.random.default_rng(list(wh))
            image = Image.fromarray(rng.integers(0, 256, (wh[1], wh[0], 3), dtype=np.uint8))
            out = processor(images=[image], return_tensors="pt", do_rescale=False,
                            do_normalize=False)
            if not _reproduces(patcher([image]), out, frames):
                return None
        return patcher


def _reproduces(mine: tuple[torch.Tensor, torch.Tensor], out: Any, frames: int) -> bool:
    """Whether ``mine`` is the first frame of the processor's integers ``out``, and the
    processor's frames are identical (so the one kept stands for all of them)."""
    pixels, grid = mine
    integers = out["pixel_values"]
    if integers.shape != (pixels.shape[0], pixels.shape[1] * frames):
        return False
    per_frame = integers.reshape(pixels.shape[0], 3, frames, -1)
    return (torch.equal(per_frame, per_frame[:, :, :1].expand_as(per_frame))
            and torch.equal(pixels.to(integers.dtype), per_frame[:, :, 0].flatten(1))
            and torch.equal(grid, out["image_grid_thw"].to(torch.int64)))
