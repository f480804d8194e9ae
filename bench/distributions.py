"""Seeded post-pipeline length distributions shaped like the paper's four datasets.

Lengths are what ``length_fn`` sees after the whole pipeline (chat template,
tokenisation, visual-token expansion, cutoff), clipped to ``CUTOFF = 8192``.

========== ======= ====== =================================================================
name       mean    CV     shape
========== ======= ====== =================================================================
ultrachat  ~1400   0.48   text-only multi-turn chat: lognormal, [32, 8192]
llava      ~750    0.29   one COCO-like image (Qwen3-VL patch 16, merge 2: 192-345 visual
                          tokens) + a lognormal text part (instruction and answer)
sharegpt4o ~1500   1.00   GPT-4o conversations, images or not: lognormal with a long tail,
                          [32, 8192] (about 1% of the mass sits at the cutoff)
mmmix      ~250    0.80   OCR + VQA + captioning mix, bimodal: a fraction f_s = 0.60 of
                          *short* samples (< 256 tokens: lognormal around 110, in
                          [16, 255]) and 0.40 long ones (256 + a lognormal of mean 200,
                          sigma calibrated: mean ~455, tail to a few thousand)
========== ======= ====== =================================================================

The free shape parameters (the lognormal sigma, and mu to keep the mean) are calibrated
numerically, *after* clipping and rounding, on a fixed common-random-numbers sample, so
a realised sample of a few thousand lengths lands within sampling noise of the target
CV; :func:`summary` reports the realised values. The generators are pure numpy and
seeded: ``lengths(name, n, seed)`` is reproducible.

Run ``python -m bench.distributions`` to print each distribution's realised statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from bench import _io

CUTOFF = 8192
SHORT_THRESHOLD = 256
"""A sample is *short* when its length is below this (the MM-Mix short mode)."""

_CAL_N = 100_000
_CAL_SEED = 20240


@dataclass(frozen=True)
class Spec:
    """Target statistics of one distribution."""

    name: str
    mean: float
    cv: float
    note: str


SPECS: dict[str, Spec] = {
    "ultrachat": Spec("ultrachat", 1400, 0.48, "text-only chat; lognormal in [32, 8192]"),
    "llava": Spec("llava", 750, 0.29, "image (192-345 visual tokens) + lognormal text"),
    "sharegpt4o": Spec("sharegpt4o", 1500, 1.00, "lognormal, long tail, clipped at 8192"),
    "mmmix": Spec(
        "mmmix",
        250,
        0.80,
        "bimodal: f_s=0.60 short (<256, ~110) + 0.40 long (256 + lognormal, ~455)",
    ),
}
NAMES = tuple(SPECS)

# LLaVA: visual tokens of COCO-like images after Qwen3-VL's resize (patch 16, merge 2:
# one token per 32x32 pixels): 640x480 -> 20*15, 640x427 -> 20*13, 500x375 -> 16*12,
# 480x640 -> 15*20, 640x540 -> 20*17 (rounded to the 32-pixel grid).
_LLAVA_IMAGE_TOKENS = np.array([300, 260, 192, 300, 345])
_LLAVA_IMAGE_P = np.array([0.45, 0.25, 0.10, 0.15, 0.05])
_LLAVA_TEXT_MEAN = 450.0

_MMMIX_SHORT_FRACTION = 0.60
_MMMIX_SHORT = (110.0, 0.45, 16, SHORT_THRESHOLD - 1)  # mean, sigma, lo, hi
_MMMIX_LONG_EXTRA_MEAN = 200.0  # long = 256 + lognormal with this mean


def _clipped_lognormal(z: np.ndarray, mu: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.rint(np.exp(mu + sigma * z)), lo, hi)


def _mu_for_mean(z: np.ndarray, sigma: float, mean: float, lo: int, hi: int) -> float:
    """mu such that the clipped lognormal on ``z`` has the given mean (bisection)."""
    a, b = np.log(mean) - 3 * sigma - 3, np.log(mean) + 3
    for _ in range(50):
        m = 0.5 * (a + b)
        if _clipped_lognormal(z, m, sigma, lo, hi).mean() < mean:
            a = m
        else:
            b = m
    return 0.5 * (a + b)


def _bisect_sigma(cv_of_sigma, target: float, lo: float = 0.01, hi: float = 3.0) -> float:
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if cv_of_sigma(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


@cache
def _params(name: str) -> dict[str, float]:
    """Calibrate the free parameters of ``name`` (cached per process)."""
    spec = SPECS[name]
    rng = np.random.default_rng(_CAL_SEED)
    z = rng.standard_normal(_CAL_N)
    if name in ("ultrachat", "sharegpt4o"):

        def cv_of(sigma: float) -> float:
            mu = _mu_for_mean(z, sigma, spec.mean, 32, CUTOFF)
            return _cv(_clipped_lognormal(z, mu, sigma, 32, CUTOFF))

        sigma = _bisect_sigma(cv_of, spec.cv)
        return {"mu": _mu_for_mean(z, sigma, spec.mean, 32, CUTOFF), "sigma": sigma}
    if name == "llava":
        image = rng.choice(_LLAVA_IMAGE_TOKENS, size=_CAL_N, p=_LLAVA_IMAGE_P)

        def cv_of(sigma: float) -> float:
            mu = _mu_for_mean(z, sigma, _LLAVA_TEXT_MEAN, 8, CUTOFF)
            return _cv(np.minimum(image + _clipped_lognormal(z, mu, sigma, 8, CUTOFF), CUTOFF))

        sigma = _bisect_sigma(cv_of, spec.cv)
        return {"mu": _mu_for_mean(z, sigma, _LLAVA_TEXT_MEAN, 8, CUTOFF), "sigma": sigma}
    if name == "mmmix":
        s_mean, s_sigma, s_lo, s_hi = _MMMIX_SHORT
        s_mu = _mu_for_mean(z, s_sigma, s_mean, s_lo, s_hi)
        is_short = rng.random(_CAL_N) < _MMMIX_SHORT_FRACTION
        z2 = rng.standard_normal(_CAL_N)
        short = _clipped_lognormal(z2, s_mu, s_sigma, s_lo, s_hi)
        hi = CUTOFF - SHORT_THRESHOLD

        def build(sigma: float) -> np.ndarray:
            mu = _mu_for_mean(z, sigma, _MMMIX_LONG_EXTRA_MEAN, 0, hi)
            long = SHORT_THRESHOLD + _clipped_lognormal(z, mu, sigma, 0, hi)
            return np.where(is_short, short, long)

        sigma = _bisect_sigma(lambda s: _cv(build(s)), spec.cv)
        return {
            "short_mu": s_mu,
            "short_sigma": s_sigma,
            "mu": _mu_for_mean(z, sigma, _MMMIX_LONG_EXTRA_MEAN, 0, hi),
            "sigma": sigma,
        }
    raise KeyError(f"unknown distribution {name!r}; choose from {NAMES}")


def lengths(name: str, n: int, seed: int = 0) -> np.ndarray:
    """``n`` seeded post-pipeline lengths (int64, in ``[1, CUTOFF]``) of distribution ``name``."""
    if name not in SPECS:
        raise KeyError(f"unknown distribution {name!r}; choose from {NAMES}")
    p = _params(name)
    rng = np.random.default_rng([seed, NAMES.index(name)])
    z = rng.standard_normal(n)
    if name in ("ultrachat", "sharegpt4o"):
        out = _clipped_lognormal(z, p["mu"], p["sigma"], 32, CUTOFF)
    elif name == "llava":
        image = rng.choice(_LLAVA_IMAGE_TOKENS, size=n, p=_LLAVA_IMAGE_P)
        out = np.minimum(image + _clipped_lognormal(z, p["mu"], p["sigma"], 8, CUTOFF), CUTOFF)
    else:
        _, _, s_lo, s_hi = _MMMIX_SHORT
        is_short = rng.random(n) < _MMMIX_SHORT_FRACTION
        short = _clipped_lognormal(
            rng.standard_normal(n), p["short_mu"], p["short_sigma"], s_lo, s_hi
        )
        long = SHORT_THRESHOLD + _clipped_lognormal(
            z, p["mu"], p["sigma"], 0, CUTOFF - SHORT_THRESHOLD
        )
        out = np.where(is_short, short, long)
    return out.astype(np.int64)


def summary(x: np.ndarray) -> dict[str, float]:
    """Realised statistics of a length sample."""
    x = np.asarray(x, dtype=np.float64)
    return {
        "n": int(x.size),
        "mean": round(float(x.mean()), 1),
        "cv": round(_cv(x), 3),
        "min": int(x.min()),
        "p50": int(np.percentile(x, 50)),
        "p90": int(np.percentile(x, 90)),
        "p99": int(np.percentile(x, 99)),
        "max": int(x.max()),
        "short_fraction": round(float((x < SHORT_THRESHOLD).mean()), 3),
        "at_cutoff_fraction": round(float((x >= CUTOFF).mean()), 4),
    }


def main() -> None:
    p = _io.parser("Realised statistics of the four length distributions.")
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = {
        "benchmark": "distributions",
        "cutoff": CUTOFF,
        "short_threshold": SHORT_THRESHOLD,
        "mmmix_short_fraction_f_s": _MMMIX_SHORT_FRACTION,
        "distributions": {},
    }
    for name in NAMES:
        _io.progress(f"calibrating and drawing {name}")
        spec = SPECS[name]
        stats = summary(lengths(name, args.n, args.seed))
        big = summary(lengths(name, 200_000, args.seed + 1))
        out["distributions"][name] = {
            "target_mean": spec.mean,
            "target_cv": spec.cv,
            "shape": spec.note,
            "params": {k: round(v, 4) for k, v in _params(name).items()},
            "realised": stats,
            "realised_200k": {
                "mean": big["mean"],
                "cv": big["cv"],
                "short_fraction": big["short_fraction"],
            },
            "cv_ok": abs(stats["cv"] - spec.cv) <= 0.03,
        }
    _io.emit(out, args.out)


if __name__ == "__main__":
    main()
