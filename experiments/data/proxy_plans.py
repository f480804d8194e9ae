"""Seeded sample plans of the proxies, and the knob that calibrates each to its target CV.

A plan says what each record will hold (messages as word counts, image sizes) before any
text or image exists. Each proxy has one dispersion knob, solved by bisection on the
*same seeded draws* (common random numbers), so the realised CV of the sample hits the
target for any size and seed, not only in expectation. `experiments.data.proxy_files`
writes the calibrated plans in the real schemas.
"""

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from experiments.data.proxy_lengths import (
    SHORT_THRESHOLD,
    TEMPLATE_TOKENS_PER_MESSAGE,
    SamplePlan,
    coefficient_of_variation,
    model_length,
)

LF_MAX_PIXELS = 768 * 768  # LLaMA-Factory's image_max_pixels default (589,824)
LARGE_MAX_PIXELS = 3072 * 3072  # 9,437,184: what ShareGPT4o's CV of 1.00 needs
TARGET_CV = {"ultrachat": 0.48, "llava": 0.29, "sharegpt4o": 1.00, "mmmix": 0.80}
PROXY_NAMES = tuple(TARGET_CV)

# COCO train2017 image sizes (h, w) and their shares, from the reference notes.
_COCO_SIZES = [
    ((480, 640), 0.30), ((427, 640), 0.22), ((640, 480), 0.12), ((640, 427), 0.08),
    ((375, 500), 0.08), ((640, 640), 0.05), ((424, 640), 0.08), ((512, 640), 0.07),
]


@dataclass(frozen=True)
class ProxyConfig:
    """Size, seed and budget of one proxy.

    Attributes:
        name: one of ``PROXY_NAMES``.
        num_samples: records to write.
        seed: seeds every draw; equal configs write byte-identical files.
        image_max_pixels: the processor's pixel budget the calibration assumes; the
            preprocessing config must use the same value to reproduce the target CV.
        cutoff_len: post-pipeline lengths are clipped here.
        target_cv: CV the knob is solved for (defaults to the paper's value).

    Example:
        >>> ProxyConfig("llava", num_samples=100).image_max_pixels
        589824
    """

    name: str
    num_samples: int = 2000
    seed: int = 0
    image_max_pixels: int = 0  # 0 = the per-dataset default (see default_max_pixels)
    cutoff_len: int = 16384
    target_cv: float = 0.0  # 0 = TARGET_CV[name]

    def __post_init__(self) -> None:
        if self.name not in PROXY_NAMES:
            raise ValueError(f"Unknown proxy {self.name!r}; choose one of {PROXY_NAMES}")
        if self.num_samples < 2:
            raise ValueError(f"num_samples must be >= 2, got {self.num_samples}")
        if self.image_max_pixels == 0:
            object.__setattr__(self, "image_max_pixels", default_max_pixels(self.name))
        if self.target_cv == 0.0:
            object.__setattr__(self, "target_cv", TARGET_CV[self.name])


def default_max_pixels(name: str) -> int:
    """Pixel budget per proxy: LLaMA-Factory's default, except ShareGPT4o (see module doc)."""
    return LARGE_MAX_PIXELS if name == "sharegpt4o" else LF_MAX_PIXELS


def _lognormal(z: np.ndarray, mean: float, cv: float) -> np.ndarray:
    """Integer lognormal with the given mean and CV, driven by standard normals ``z``."""
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(1, np.rint(np.exp(mu + sigma * z))).astype(np.int64)


class _Draws:
    """Standard-normal / uniform draws taken once, so a knob moves lengths continuously."""

    def __init__(self, seed: int, name: str) -> None:
        self.rng = np.random.default_rng([seed, stable_int(name)])


def stable_int(text: str) -> int:
    """A stable 32-bit integer of ``text`` (a seed component; Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def _stratified(rng: np.random.Generator, labels: list[str], shares: list[float],
                n: int) -> np.ndarray:
    """Exactly ``round(share * n)`` of each label, in random order: the mix (and with it
    the short-sample share) does not drift with the seed or the size."""
    counts = np.floor(np.array(shares) * n).astype(int)
    counts[np.argmax(shares)] += n - counts.sum()
    return rng.permutation(np.repeat(np.array(labels), counts))


def _pairs(users: np.ndarray, assistants: np.ndarray, starts: np.ndarray) -> list[list]:
    bounds = list(starts) + [len(users)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        msgs: list[tuple[str, int]] = []
        for u, v in zip(users[a:b], assistants[a:b], strict=True):
            msgs += [("user", int(u)), ("assistant", int(v))]
        out.append(msgs)
    return out


def _plan_ultrachat(cfg: ProxyConfig) -> Callable[[float], list[SamplePlan]]:
    rng = _Draws(cfg.seed, cfg.name).rng
    turns = 1 + rng.poisson(3.0, cfg.num_samples)
    zu, za = rng.standard_normal(turns.sum()), rng.standard_normal(turns.sum())
    starts = np.concatenate([[0], np.cumsum(turns)[:-1]])

    def plan(knob: float) -> list[SamplePlan]:
        msgs = _pairs(_lognormal(zu, 70, 0.9), _lognormal(za, 300, knob), starts)
        return [SamplePlan(m, kind="chat") for m in msgs]

    return plan


def _plan_llava(cfg: ProxyConfig) -> Callable[[float], list[SamplePlan]]:
    rng = _Draws(cfg.seed, cfg.name).rng
    n = cfg.num_samples
    sizes = [s for s, _ in _COCO_SIZES]
    size_idx = rng.choice(len(sizes), n, p=[p for _, p in _COCO_SIZES])
    kinds = _stratified(rng, ["conversation", "detail", "complex"], [0.37, 0.15, 0.48], n)
    turns = np.where(kinds == "conversation", 1 + rng.poisson(3.0, n), 1)
    zq, za = rng.standard_normal(turns.sum()), rng.standard_normal(turns.sum())
    after = rng.random(n) < 0.3
    starts = np.concatenate([[0], np.cumsum(turns)[:-1]])
    kind_of_pair = np.repeat(kinds, turns)
    q_params = {"conversation": (12, 0.5), "detail": (12, 0.4), "complex": (25, 0.4)}
    a_fixed = {"detail": (150, 0.3), "complex": (190, 0.35)}

    def plan(knob: float) -> list[SamplePlan]:
        q = np.zeros_like(zq, dtype=np.int64)
        a = np.zeros_like(za, dtype=np.int64)
        for kind, (m, c) in q_params.items():
            sel = kind_of_pair == kind
            q[sel] = _lognormal(zq[sel], m, c)
            am, ac = a_fixed.get(kind, (75, knob))
            a[sel] = _lognormal(za[sel], am, ac)
        msgs = _pairs(q, a, starts)
        return [
            SamplePlan(m, [sizes[i]], str(k), bool(f))
            for m, i, k, f in zip(msgs, size_idx, kinds, after, strict=True)
        ]

    return plan


def _area_to_size(area: np.ndarray, aspect: np.ndarray, max_pixels: int) -> list[tuple]:
    """(h, w) with w/h = aspect; areas over the budget are capped (same token count, and
    the files stay small)."""
    area = np.minimum(area, max_pixels)
    w = np.maximum(32, np.rint(np.sqrt(area * aspect)))
    h = np.maximum(32, np.rint(area / w))
    return [(int(a), int(b)) for a, b in zip(h, w, strict=True)]


def _plan_sharegpt4o(cfg: ProxyConfig) -> Callable[[float], list[SamplePlan]]:
    rng = _Draws(cfg.seed, cfg.name).rng
    n = cfg.num_samples
    z_area, z_aspect = rng.standard_normal(n), rng.standard_normal(n)
    q = _lognormal(rng.standard_normal(n), 10, 0.3)
    cap = _lognormal(rng.standard_normal(n), 320, 0.45)
    aspect = np.exp(0.15 + 0.35 * z_aspect)

    def plan(knob: float) -> list[SamplePlan]:
        area = _lognormal(z_area, 1.6e6, knob).astype(np.float64)
        sizes = _area_to_size(area, aspect, cfg.image_max_pixels)
        return [
            SamplePlan([("user", int(a)), ("assistant", int(b))], [s], "caption")
            for a, b, s in zip(q, cap, sizes, strict=True)
        ]

    return plan


MMMIX_SOURCES = {
    "ocr": ("iiit5k", "orand_car_a", "chinese_text_recognition"),
    "vqa": ("aokvqa", "vqa_like"),
    "caption": ("image_textualization", "sharegpt4o"),
}
MMMIX_SHARES = {"ocr": 0.40, "vqa": 0.08, "caption": 0.52}


def _plan_mmmix(cfg: ProxyConfig) -> Callable[[float], list[SamplePlan]]:
    rng = _Draws(cfg.seed, cfg.name).rng
    n = cfg.num_samples
    comp = _stratified(rng, list(MMMIX_SHARES), list(MMMIX_SHARES.values()), n)
    ocr_h, ocr_w = rng.integers(24, 80, n), rng.integers(80, 400, n)
    z_area, zq, za = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    q = {"ocr": _lognormal(zq, 15, 0.3), "vqa": _lognormal(zq, 40, 0.5),
         "caption": _lognormal(zq, 25, 0.5)}
    a_fixed = {"ocr": _lognormal(za, 5, 0.5), "vqa": _lognormal(za, 8, 0.8)}
    cap_sizes = _area_to_size(_lognormal(z_area, 0.9e6, 1.0).astype(float), np.full(n, 1.3),
                              cfg.image_max_pixels)

    def plan(knob: float) -> list[SamplePlan]:
        a_cap = _lognormal(za, 550, knob)
        out = []
        for i, c in enumerate(comp):
            if c == "ocr":
                size, answer = (int(ocr_h[i]), int(ocr_w[i])), a_fixed["ocr"][i]
            elif c == "vqa":
                size, answer = (480, 640), a_fixed["vqa"][i]
            else:
                size, answer = cap_sizes[i], a_cap[i]
            msgs = [("user", int(q[c][i])), ("assistant", int(answer))]
            out.append(SamplePlan(msgs, [size], str(c)))
        return out

    return plan


_PLANNERS = {"ultrachat": _plan_ultrachat, "llava": _plan_llava,
             "sharegpt4o": _plan_sharegpt4o, "mmmix": _plan_mmmix}
KNOB_NAMES = {"ultrachat": "assistant_cv", "llava": "conversation_answer_cv",
              "sharegpt4o": "image_area_cv", "mmmix": "caption_answer_cv"}


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, what: str) -> float:
    """Solve f(x) = target for an increasing f on [lo, hi]."""
    f_lo, f_hi = f(lo), f(hi)
    if not f_lo <= target <= f_hi:
        raise ValueError(
            f"{what}: target CV {target} is outside the reachable range [{f_lo:.3f}, {f_hi:.3f}]"
            " of this sample; pick a reachable target or more samples"
        )
    for _ in range(40):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-4:
            break
    return (lo + hi) / 2


def calibrate(cfg: ProxyConfig) -> tuple[float, list[SamplePlan], np.ndarray]:
    """Solve the proxy's knob for ``cfg.target_cv``; returns (knob, plans, model lengths)."""
    planner = _PLANNERS[cfg.name](cfg)

    def lengths(knob: float) -> np.ndarray:
        return np.array([model_length(p, cfg.image_max_pixels, cfg.cutoff_len)
                         for p in planner(knob)])

    knob = _bisect(lambda k: coefficient_of_variation(lengths(k)), cfg.target_cv, 0.01, 3.0,
                   cfg.name)
    plans = planner(knob)
    return knob, plans, lengths(knob)


@dataclass(frozen=True)
class LeverageConfig:
    """One synthetic mix of the short-sample-leverage ablation (MM-Mix schema, text only).

    A share ``f_s`` of samples is short (OCR-like: ~30 tokens, always below
    ``SHORT_THRESHOLD``); the rest is long with lengths ``>= SHORT_THRESHOLD``. The long
    component moves along one path (first its mean from 1.5x to 8x the threshold, then its
    dispersion) until the mix has the requested CV. Not every (cv, f_s) pair is
    reachable: a high short share forces a high CV; those raise ``ValueError``.

    Example:
        >>> LeverageConfig(cv=0.8, short_fraction=0.4).name
        'leverage_cv0.80_fs0.40'
    """

    cv: float
    short_fraction: float
    num_samples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.short_fraction < 1.0:
            raise ValueError(f"short_fraction must be in [0, 1), got {self.short_fraction}")
        if self.cv <= 0:
            raise ValueError(f"cv must be > 0, got {self.cv}")

    @property
    def name(self) -> str:
        return f"leverage_cv{self.cv:.2f}_fs{self.short_fraction:.2f}"


def _plan_leverage(cfg: LeverageConfig) -> Callable[[float], list[SamplePlan]]:
    rng = np.random.default_rng([cfg.seed, stable_int("leverage")])
    n = cfg.num_samples
    short = np.zeros(n, dtype=bool)
    short[rng.permutation(n)[: round(cfg.short_fraction * n)]] = True
    zq, za = rng.standard_normal(n), rng.standard_normal(n)
    sq, sa = _lognormal(zq, 15, 0.3), _lognormal(za, 5, 0.5)
    overhead = 2 * TEMPLATE_TOKENS_PER_MESSAGE + 20  # 20-word prompt on long samples

    def plan(t: float) -> list[SamplePlan]:
        mean = SHORT_THRESHOLD * 1.5 * (8 / 1.5) ** min(t, 1.0)
        cv = 0.25 + 2.25 * max(t - 1.0, 0.0)
        total = np.maximum(_lognormal(za, mean, cv), SHORT_THRESHOLD)
        answer = np.maximum(1, total - overhead)
        return [
            SamplePlan([("user", int(sq[i])), ("assistant", int(sa[i]))], kind="short")
            if short[i] else SamplePlan([("user", 20), ("assistant", int(answer[i]))], kind="long")
            for i in range(n)
        ]

    return plan


def calibrate_leverage(cfg: LeverageConfig, cutoff_len: int) -> tuple[float, list[SamplePlan],
                                                                       np.ndarray]:
    """Solve the leverage path position for ``cfg.cv``; returns (t, plans, model lengths)."""
    planner = _plan_leverage(cfg)

    def lengths(t: float) -> np.ndarray:
        return np.array([model_length(p, 0, cutoff_len) for p in planner(t)])

    t = _bisect(lambda x: coefficient_of_variation(lengths(x)), cfg.cv, 0.0, 2.0, cfg.name)
    return t, planner(t), lengths(t)
