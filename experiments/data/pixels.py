"""Image pixels travel as uint8 and become the processor's float values on the device.

A Qwen-VL image processor resizes an image (the values stay 0-255 integers), then
rescales and normalises it into float32 ``pixel_values`` (patches x 1536). Those floats
are a fixed function of the integers, so a sample can carry the integers as uint8 (a
quarter of the bytes through the DataLoader workers' shared memory, the grouping
buffer, the hand-off and the host-to-device copy) and the trainer recovers the floats
after ``.to(device)``, where the arithmetic is free.

Each patch row of a Qwen-VL processor holds its pixels ``temporal_patch_size`` times (an
image is a video of identical frames to the model's 3-D patch embedding), so the uint8
form keeps one frame and :meth:`PixelCodec.decode` writes the frames back: half the bytes
again, an eighth of the float32 form in all (patches x 768 instead of x 1536).

The invariant: ``codec.decode(codec.encode(integers)) == processor(image)["pixel_values"]``
bit for bit. Backends compute the floats differently (the PIL backend rescales, then
normalises; the torchvision backend fuses both into one normalisation), so
:meth:`PixelCodec.for_processor` probes the processor on a test image and picks the
formula that reproduces its output exactly; when none does, it refuses rather than
train on different inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image

PixelFormat = Literal["uint8", "float32"]
Formula = Literal["rescale_then_normalize", "fused"]
FORMULAS: tuple[Formula, ...] = ("rescale_then_normalize", "fused")
# Probe images: sizes that the processor resizes (not multiples of its 32-pixel factor;
# the small one below its minimum pixel count), so the probe covers resampling too.
_PROBE_SIZES = ((37, 23), (301, 177))


@dataclass(frozen=True)
class PixelCodec:
    """uint8 <-> the processor's float ``pixel_values``, exact.

    Attributes:
        formula: how the processor turns integers into floats (see the module docstring).
        rescale: the processor's ``rescale_factor`` (1/255).
        mean / std: the processor's per-channel ``image_mean`` / ``image_std``.
        frames: identical frames per patch row in the processor's output (its
            ``temporal_patch_size``); the uint8 form holds one of them.

    Example:
        >>> codec = PixelCodec("rescale_then_normalize", 1 / 255, (0.5,) * 3, (0.5,) * 3, 2)
        >>> floats = codec.decode(torch.tensor([[0, 255] * 384], dtype=torch.uint8))
        >>> floats.shape, floats[0, :2].tolist()
        (torch.Size([1, 1536]), [-1.0, 1.0])
    """

    formula: Formula
    rescale: float
    mean: tuple[float, ...]
    std: tuple[float, ...]
    frames: int = 1

    def __post_init__(self) -> None:
        if self.formula not in FORMULAS:
            raise ValueError(f"Unknown formula {self.formula!r}; choose one of {FORMULAS}")
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"mean and std need one value per channel, got {self.mean} "
                             f"and {self.std}")
        if self.frames < 1:
            raise ValueError(f"frames is the processor's temporal_patch_size (>= 1), got "
                             f"{self.frames}")

    def encode(self, integers: torch.Tensor) -> torch.Tensor:
        """uint8 of a processor's un-normalised output (integers 0-255 held as floats),
        one frame of each patch row (rows ``C x frames x P x P`` -> ``C x P x P``)."""
        rows, channels = integers.shape[0], len(self.mean)
        one_frame = integers.reshape(rows, channels, self.frames, -1)[:, :, 0]
        return one_frame.to(torch.uint8).reshape(rows, -1)

    def decode(self, pixels: torch.Tensor) -> torch.Tensor:
        """The processor's float32 ``pixel_values`` from :meth:`encode`'s uint8, on
        ``pixels``' device: rows ``C x P x P`` in, ``C x frames x P x P`` out."""
        if pixels.dtype != torch.uint8:
            raise TypeError(f"decode takes the uint8 pixels of encode, got {pixels.dtype}")
        channels = len(self.mean)
        x = pixels.reshape(pixels.shape[0], channels, -1)
        mean = torch.tensor(self.mean, dtype=torch.float64, device=pixels.device)
        std = torch.tensor(self.std, dtype=torch.float64, device=pixels.device)
        mean, std = mean.view(1, channels, 1), std.view(1, channels, 1)
        if self.formula == "rescale_then_normalize":
            # The PIL backend: rescale in float64, cast, then normalise in float32.
            y = (x.double() * self.rescale).float()
            out = (y - mean.float()) / std.float()
        else:
            # The torchvision backend folds the rescale into the normalisation.
            out = (x.float() - (mean / self.rescale).float()) / (std / self.rescale).float()
        rows = pixels.shape[0]
        frames = out.unsqueeze(2).expand(rows, channels, self.frames, out.shape[-1])
        return frames.reshape(rows, -1)

    @classmethod
    def for_processor(cls, processor: Any) -> PixelCodec:
        """The codec that reproduces ``processor``'s ``pixel_values`` bit for bit.

        Raises:
            ValueError: no formula reproduces the processor's output exactly (or its
                un-normalised output is not 0-255 integers); use ``pixels="float32"``.
        """
        mean = _per_channel(processor.image_mean)
        std = _per_channel(processor.image_std)
        probes = [_probe(processor, size) for size in _PROBE_SIZES]
        for integers, _ in probes:
            if not torch.equal(integers, integers.round().clamp(0, 255)):
                raise ValueError(f"{type(processor).__name__} without rescale/normalise does "
                                 "not return 0-255 integers, so its pixels cannot travel as "
                                 "uint8; set the data config's pixels to 'float32'")
        frames = int(getattr(processor, "temporal_patch_size", 1))
        for formula in FORMULAS:
            codec = cls(formula, float(processor.rescale_factor), mean, std, frames)
            if all(torch.equal(codec.decode(codec.encode(i)), f) for i, f in probes):
                return codec
        raise ValueError(f"No formula in {FORMULAS} reproduces the float pixel_values of "
                         f"{type(processor).__name__} exactly; set the data config's "
                         "pixels to 'float32'")


def decode_batch(batch: Mapping[str, Any], codec: PixelCodec | None) -> dict[str, Any]:
    """``batch`` with uint8 ``pixel_values`` decoded (call after moving it to the device).

    Float pixels, text-only batches and ``codec=None`` pass through unchanged.
    """
    out = dict(batch)
    pixels = out.get("pixel_values")
    if isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8:
        if codec is None:
            raise ValueError("The batch's pixel_values are uint8 but no PixelCodec was "
                             "given to decode them; pass the dataset's pixel_codec")
        out["pixel_values"] = codec.decode(pixels)
    return out


def _per_channel(value: Any) -> tuple[float, ...]:
    values = [value] * 3 if np.isscalar(value) else list(value)
    return tuple(float(v) for v in values)


def _probe(processor: Any, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(un-normalised, float) ``pixel_values`` of one seeded random image of ``size``."""
    rng = np.random.default_rng(list(size))
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    floats = processor(images=[image], return_tensors="pt")["pixel_values"]
    integers = processor(images=[image], return_tensors="pt", do_rescale=False,
                         do_normalize=False)["pixel_values"]
    return integers, floats
