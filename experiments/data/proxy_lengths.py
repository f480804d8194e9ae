"""The proxies' length model: what one record's post-pipeline length is, in tokens.

Text is word salad that the proxy tokenizer maps one word to one token, so a record's
length is its text words + ``TEMPLATE_TOKENS_PER_MESSAGE`` per message + (Qwen-VL image
tokens + ``VISION_WRAP_TOKENS``) per image, clipped at the cutoff. The generators
(`experiments.data.proxy_plans`) calibrate against this model; the tests check it against
the real pipeline.
"""

import math
from dataclasses import dataclass, field

import numpy as np

TEMPLATE_TOKENS_PER_MESSAGE = 5  # <|im_start|> role \n ... <|im_end|> \n
VISION_WRAP_TOKENS = 2  # <|vision_start|> ... <|vision_end|>
PATCH_SIZE = 16
MERGE_SIZE = 2
DEFAULT_MIN_PIXELS = 64 * 32 * 32  # the Qwen3-VL processor default floor (64 tokens)
SHORT_THRESHOLD = 256  # a sample is "short" when its post-pipeline length is below this


def smart_resize(h: int, w: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen-VL resize rule (factor patch*merge = 32); equal to transformers' (a test checks)."""
    factor = PATCH_SIZE * MERGE_SIZE
    h_bar, w_bar = round(h / factor) * factor, round(w / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        h_bar = max(factor, math.floor(h / beta / factor) * factor)
        w_bar = max(factor, math.floor(w / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        h_bar = math.ceil(h * beta / factor) * factor
        w_bar = math.ceil(w * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(h: int, w: int, max_pixels: int, min_pixels: int = DEFAULT_MIN_PIXELS) -> int:
    """Number of ``<|image_pad|>`` tokens for an ``h x w`` image (no vision start/end)."""
    h_bar, w_bar = smart_resize(h, w, min_pixels, max_pixels)
    return (h_bar // (PATCH_SIZE * MERGE_SIZE)) * (w_bar // (PATCH_SIZE * MERGE_SIZE))


def coefficient_of_variation(lengths: np.ndarray) -> float:
    """Population CV (std / mean) of a length array."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return float(lengths.std() / lengths.mean())


@dataclass
class SamplePlan:
    """What one record will hold: messages as (role, words, image_first) and image sizes."""

    messages: list[tuple[str, int]]
    images: list[tuple[int, int]] = field(default_factory=list)  # (h, w)
    kind: str = ""
    image_after_text: bool = False  # LLaVA puts <image> after the question in some rows


def model_length(plan: SamplePlan, max_pixels: int, cutoff: int) -> int:
    """Modelled post-pipeline length of one planned record."""
    words = sum(n for _, n in plan.messages)
    vision = sum(image_tokens(h, w, max_pixels) + VISION_WRAP_TOKENS for h, w in plan.images)
    return min(cutoff, words + TEMPLATE_TOKENS_PER_MESSAGE * len(plan.messages) + vision)


def summary(lengths: np.ndarray, short_threshold: int = SHORT_THRESHOLD) -> dict:
    """mean / p50 / p95 / p99 / max / CV / f_s of a length array (f_s: share below the
    threshold)."""
    x = np.asarray(lengths, dtype=np.float64)
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"n": int(x.size), "mean": round(float(x.mean()), 2), "p50": float(p50),
            "p95": float(p95), "p99": float(p99), "max": float(x.max()),
            "cv": round(coefficient_of_variation(x), 4),
            "f_s": round(float((x < short_threshold).mean()), 4),
            "short_threshold": short_threshold}

