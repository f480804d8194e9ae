"""bench.inflight_bytes counts a sample's bytes as it travels: a patch's pixels are 768
bytes as uint8 (one of the two identical temporal frames, DataConfig.pixels) and
2 x 768 float32 values as the processor returns them; the other tensors are the same."""

from bench.inflight_bytes import sample_bytes

PATCH_U8, PATCH_F32 = 768, 2 * 768 * 4


def test_uint8_pixels_carry_an_eighth_of_the_float32_bytes() -> None:
    small = sample_bytes(80, 256 * 256, 2048, "uint8")
    large = sample_bytes(80, 256 * 256, 2048, "float32")
    assert len(small) == len(large) == 80
    for u8, f32 in zip(small, large, strict=True):
        patches, rest = divmod(f32 - u8, PATCH_F32 - PATCH_U8)
        assert rest == 0 and patches > 0  # every ShareGPT4o sample has an image
        assert u8 > patches * PATCH_U8  # and ids, labels, masks, grids beside its pixels
