"""uint8 pixels: decoded on the device, they are the processor's float pixel_values bit
for bit, on the real proxies and the project's image processor."""

import dataclasses

import numpy as np
import pytest
import torch

from experiments.data.pipeline import PreprocessedDataset, collate
from experiments.data.pixels import PixelCodec, decode_batch


@pytest.fixture(scope="module")
def float_datasets(datasets_by_name: dict) -> dict[str, PreprocessedDataset]:
    """The image proxies with the processor's own float32 pixels."""
    return {name: PreprocessedDataset(dataclasses.replace(ds.cfg, pixels="float32"))
            for name, ds in datasets_by_name.items() if name != "ultrachat"}


@pytest.mark.parametrize("name", ["llava", "sharegpt4o", "mmmix"])
def test_decoded_uint8_equals_processor_floats(name: str, datasets_by_name: dict,
                                               float_datasets: dict) -> None:
    ds, reference = datasets_by_name[name], float_datasets[name]
    for i in range(3):
        sample, expected = ds[i], reference[i]
        assert sample["pixel_values"].dtype == torch.uint8
        assert expected["pixel_values"].dtype == torch.float32
        # a quarter of the bytes per value, and one of the processor's two identical frames
        assert sample["pixel_values"].nbytes * 8 == expected["pixel_values"].nbytes
        assert torch.equal(ds.pixel_codec.decode(sample["pixel_values"]),
                           expected["pixel_values"])
        for key in ("input_ids", "labels", "image_grid_thw"):
            assert torch.equal(sample[key], expected[key])


def test_decode_batch_of_a_collated_group(datasets_by_name: dict, float_datasets: dict) -> None:
    ds, reference = datasets_by_name["mmmix"], float_datasets["mmmix"]
    pad = ds.tokenizer.pad_token_id
    batch = collate([ds[i] for i in range(4)], pad)
    moved = decode_batch({k: v.to("cpu") for k, v in batch.items()}, ds.pixel_codec)
    expected = collate([reference[i] for i in range(4)], pad)
    assert torch.equal(moved["pixel_values"], expected["pixel_values"].to("cpu"))
    assert torch.equal(moved["input_ids"], expected["input_ids"])


def test_float_pixels_and_text_pass_through(datasets_by_name: dict) -> None:
    floats = {"pixel_values": torch.ones(2, 1536), "input_ids": torch.ones(1, 3)}
    assert decode_batch(floats, None)["pixel_values"] is floats["pixel_values"]
    text = {"input_ids": torch.ones(1, 3)}
    assert decode_batch(text, datasets_by_name["ultrachat"].pixel_codec) == text
    with pytest.raises(ValueError, match="no PixelCodec"):
        decode_batch({"pixel_values": torch.zeros(2, 768, dtype=torch.uint8)}, None)


def test_the_probe_picks_the_formula_of_each_backend() -> None:
    """A processor that computes like the torchvision backend (rescale folded into the
    normalisation) gets the fused formula; the project's PIL-backend processor the other."""

    class FusedBackend:
        image_mean, image_std, rescale_factor = (0.48, 0.45, 0.40), (0.27, 0.26, 0.28), 1 / 255

        def __call__(self, images, return_tensors, do_rescale=True, do_normalize=True):
            # One channel-major "patch" of the image's first 512 pixels.
            rgb = torch.from_numpy(np.array(images[0])).float().reshape(-1, 3)
            ints = rgb[:512].T.reshape(1, 1536)
            if not (do_rescale and do_normalize):
                return {"pixel_values": ints}
            mean = torch.tensor(self.image_mean, dtype=torch.float64) / self.rescale_factor
            std = torch.tensor(self.image_std, dtype=torch.float64) / self.rescale_factor
            x = ints.reshape(1, 3, -1)
            out = (x - mean.float().view(1, 3, 1)) / std.float().view(1, 3, 1)
            return {"pixel_values": out.reshape(1, 1536)}

    assert PixelCodec.for_processor(FusedBackend()).formula == "fused"


def test_a_processor_no_formula_reproduces_is_refused(datasets_by_name: dict) -> None:
    processor = datasets_by_name["mmmix"].image_processor

    class Shifted:
        image_mean, image_std = processor.image_mean, processor.image_std
        rescale_factor = processor.rescale_factor

        def __call__(self, images, return_tensors, **kwargs):
            out = processor(images=images, return_tensors=return_tensors, **kwargs)
            if kwargs:
                return out
            return {"pixel_values": out["pixel_values"] + 1e-3}

    with pytest.raises(ValueError, match="pixels to 'float32'"):
        PixelCodec.for_processor(Shifted())
