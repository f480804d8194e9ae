"""Seeded proxy datasets in the real schemas, calibrated to the paper's length statistics.

The CPU path has no hub, so each paper dataset is replaced by a generated proxy written in
the dataset's *real* on-disk schema (so the real loader and preprocessing run unchanged):

- ``ultrachat``: UltraChat 200k rows ``{prompt, prompt_id, messages: [{role, content}]}``
  (JSON lines; the hub ships parquet with the same columns);
- ``llava``: LLaVA-Instruct-150K, one JSON array of ``{id, image, conversations:
  [{from, value}]}`` with ``<image>`` in the first human turn and images under
  ``train2017/``;
- ``sharegpt4o``: LLaVA-OneVision ``sharegpt4o`` rows ``{id, image, conversations,
  data_source}`` (``image`` is a path here, a decoded image on the hub);
- ``mmmix``: the MM-Mix "TMDB" directory: ``records.jsonl`` of ``{id, source,
  conversations, images, upstream}``, ``metadata.json`` and ``images/``.

Text is word salad over a fixed synthetic vocabulary; the tokenizer trained on it
(`experiments.data.assets`) maps nearly every word to one token, so a word count is a
token count. Post-pipeline length is then modelled as text words + 5 template tokens per
message + (Qwen-VL image tokens + 2) per image, clipped at the cutoff. Each proxy has one
dispersion knob, solved by bisection on the *same seeded draws* (common random numbers),
so the realised CV of the written sample hits the target for any size and seed, not only
in expectation. The measured CV after the real pipeline is checked by the tests.

A "leverage" family (MM-Mix schema, text only) sweeps CV and the short-sample fraction
``f_s`` independently for the short-sample-leverage ablation.

    python -m experiments.data.proxies --out data/proxies          # the four defaults
    python -m experiments.data.proxies --out data/proxies --leverage-cv 0.6 0.8 \
        --leverage-fs 0.2 0.5
"""

import argparse
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

GENERATOR_VERSION = 1
TEMPLATE_TOKENS_PER_MESSAGE = 5  # <|im_start|> role \n ... <|im_end|> \n
VISION_WRAP_TOKENS = 2  # <|vision_start|> ... <|vision_end|>
PATCH_SIZE = 16
MERGE_SIZE = 2
DEFAULT_MIN_PIXELS = 64 * 32 * 32  # the Qwen3-VL processor default floor (64 tokens)
LF_MAX_PIXELS = 768 * 768  # LLaMA-Factory's image_max_pixels default (589,824)
LARGE_MAX_PIXELS = 3072 * 3072  # 9,437,184: what ShareGPT4o's CV of 1.00 needs
SHORT_THRESHOLD = 256  # a sample is "short" when its post-pipeline length is below this

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


# --------------------------------------------------------------------------- sample plans


@dataclass
class SamplePlan:
    """What one record will hold: messages as (role, words, image_first) and image sizes."""

    messages: list[tuple[str, int]]
    images: list[tuple[int, int]] = field(default_factory=list)  # (h, w)
    kind: str = ""
    image_after_text: bool = False  # LLaVA puts <image> after the question in some rows


def _lognormal(z: np.ndarray, mean: float, cv: float) -> np.ndarray:
    """Integer lognormal with the given mean and CV, driven by standard normals ``z``."""
    sigma = math.sqrt(math.log1p(cv * cv))
    mu = math.log(mean) - sigma * sigma / 2
    return np.maximum(1, np.rint(np.exp(mu + sigma * z))).astype(np.int64)


def _model_length(plan: SamplePlan, max_pixels: int, cutoff: int) -> int:
    words = sum(n for _, n in plan.messages)
    vision = sum(image_tokens(h, w, max_pixels) + VISION_WRAP_TOKENS for h, w in plan.images)
    return min(cutoff, words + TEMPLATE_TOKENS_PER_MESSAGE * len(plan.messages) + vision)


class _Draws:
    """Standard-normal / uniform draws taken once, so a knob moves lengths continuously."""

    def __init__(self, seed: int, name: str) -> None:
        self.rng = np.random.default_rng([seed, _stable_int(name)])


def _stable_int(text: str) -> int:
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
        return np.array([_model_length(p, cfg.image_max_pixels, cfg.cutoff_len)
                         for p in planner(knob)])

    knob = _bisect(lambda k: coefficient_of_variation(lengths(k)), cfg.target_cv, 0.01, 3.0,
                   cfg.name)
    plans = planner(knob)
    return knob, plans, lengths(knob)


# --------------------------------------------------------------------------- materialise

_ONSETS = "b c d f g h j k l m n p r s t v w z ch sh th st".split()
_VOWELS = "a e i o u ai ea ou".split()


def vocabulary(size: int = 2000) -> list[str]:
    """A fixed list of distinct pronounceable lowercase pseudo-words."""
    syllables = [o + v for o in _ONSETS for v in _VOWELS]
    rng = np.random.default_rng(12345)
    words: dict[str, None] = {}
    while len(words) < size:
        k = int(rng.integers(1, 4))
        words["".join(syllables[i] for i in rng.integers(0, len(syllables), k))] = None
    return list(words)


class _TextSource:
    """Word salad of an exact word count from a seeded stream independent of the knob."""

    def __init__(self, seed: int, name: str) -> None:
        self.words = np.array(vocabulary())
        self.rng = np.random.default_rng([seed, _stable_int(name + "/text")])

    def text(self, n_words: int) -> str:
        return " ".join(self.words[self.rng.integers(0, len(self.words), n_words)])


_PROMPTS = {
    "ultrachat": "",
    "llava": "",
    "sharegpt4o": "describe this image in detail",
    "ocr": "what is the text in the image",
    "vqa": "answer the question about the image",
    "caption": "write a detailed caption",
}


def _write_png(path: Path, h: int, w: int, colour: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Palette mode: one byte per pixel keeps large images fast to write and small on disk.
    Image.new("P", (w, h), colour).save(path, compress_level=1)


def _conversation(plan: SamplePlan, texts: _TextSource, image_tag: bool) -> list[dict]:
    conv = []
    for j, (role, n) in enumerate(plan.messages):
        value = texts.text(n)
        if j == 0 and image_tag:
            value = f"{value}\n<image>" if plan.image_after_text else f"<image>\n{value}"
        conv.append({"from": "human" if role == "user" else "gpt", "value": value})
    return conv


def _write_ultrachat(root: Path, plans: list[SamplePlan], texts: _TextSource) -> Path:
    path = root / "train.jsonl"
    with path.open("w") as f:
        for plan in plans:
            messages = [{"role": r, "content": texts.text(n)} for r, n in plan.messages]
            prompt = messages[0]["content"]
            row = {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                   "messages": messages}
            f.write(json.dumps(row) + "\n")
    return path


def _write_llava(root: Path, plans: list[SamplePlan], texts: _TextSource) -> Path:
    rows = []
    for i, plan in enumerate(plans):
        image = f"{i:012d}.png"
        _write_png(root / "train2017" / image, *plan.images[0], colour=i % 256)
        rows.append({"id": f"{i:012d}", "image": image,
                     "conversations": _conversation(plan, texts, image_tag=True)})
    path = root / "llava_instruct_150k.json"
    path.write_text(json.dumps(rows))
    return path


def _write_sharegpt4o(root: Path, plans: list[SamplePlan], texts: _TextSource) -> Path:
    path = root / "train.jsonl"
    with path.open("w") as f:
        for i, plan in enumerate(plans):
            image = f"images/sharegpt4o_{i:06d}.png"
            _write_png(root / image, *plan.images[0], colour=i % 256)
            row = {"id": f"sharegpt4o_{i:06d}", "image": image,
                   "conversations": _conversation(plan, texts, image_tag=True),
                   "data_source": "sharegpt4o"}
            f.write(json.dumps(row) + "\n")
    return path


def _write_mmmix(root: Path, plans: list[SamplePlan], texts: _TextSource) -> Path:
    rng = np.random.default_rng(len(plans))
    path = root / "records.jsonl"
    with path.open("w") as f:
        for i, plan in enumerate(plans):
            sources = MMMIX_SOURCES.get(plan.kind, ("leverage",))
            source = sources[int(rng.integers(0, len(sources)))]
            images = []
            for k, (h, w) in enumerate(plan.images):
                images.append(f"images/{source}/{i:08d}_{k}.png")
                _write_png(root / images[-1], h, w, colour=i % 256)
            row = {"id": f"{source}_{i:08d}", "source": source,
                   "conversations": _conversation(plan, texts, image_tag=bool(images)),
                   "images": images,
                   "upstream": {"dataset": "synthetic-proxy", "config": source, "index": i}}
            f.write(json.dumps(row) + "\n")
    (root / "metadata.json").write_text(json.dumps({"num_records": len(plans)}) + "\n")
    return path


_WRITERS = {"ultrachat": _write_ultrachat, "llava": _write_llava,
            "sharegpt4o": _write_sharegpt4o, "mmmix": _write_mmmix}


def write_proxy(cfg: ProxyConfig, out_dir: Path, keep: int = 0) -> dict:
    """Calibrate and write one proxy under ``out_dir``; returns its metadata record.

    ``keep`` > 0 writes only the first ``keep`` records of the calibrated sample: a few
    records drawn from the distribution that ``cfg.num_samples`` records calibrate (a
    small sample alone often cannot reach the target CV); ``model_stats`` then describes
    the written records.

    Example:
        >>> meta = write_proxy(ProxyConfig("ultrachat", 50), Path(tmp))  # doctest: +SKIP
        >>> meta["data_file"]  # doctest: +SKIP
        '.../train.jsonl'
    """
    if not 0 <= keep <= cfg.num_samples:
        raise ValueError(f"keep must be in [0, num_samples={cfg.num_samples}], got {keep}")
    start = time.perf_counter()
    knob, plans, lengths = calibrate(cfg)
    if keep:
        plans, lengths = plans[:keep], lengths[:keep]
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = _WRITERS[cfg.name](out_dir, plans, _TextSource(cfg.seed, cfg.name))
    meta = {
        "generator_version": GENERATOR_VERSION, "config": asdict(cfg),
        "data_file": str(data_file), "knob": {KNOB_NAMES[cfg.name]: round(knob, 6)},
        "model_stats": summary(lengths), "seconds": round(time.perf_counter() - start, 2),
    }
    if keep:
        meta["kept"] = keep
    (out_dir / "proxy_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


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


# --------------------------------------------------------------------------- leverage


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
    rng = np.random.default_rng([cfg.seed, _stable_int("leverage")])
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


def write_leverage(cfg: LeverageConfig, out_dir: Path, cutoff_len: int = 16384) -> dict:
    """Calibrate and write one leverage mix (MM-Mix TMDB layout) under ``out_dir``."""
    planner = _plan_leverage(cfg)

    def lengths(t: float) -> np.ndarray:
        return np.array([_model_length(p, 0, cutoff_len) for p in planner(t)])

    t = _bisect(lambda x: coefficient_of_variation(lengths(x)), cfg.cv, 0.0, 2.0, cfg.name)
    out_dir.mkdir(parents=True, exist_ok=True)
    data_file = _write_mmmix(out_dir, planner(t), _TextSource(cfg.seed, cfg.name))
    meta = {"generator_version": GENERATOR_VERSION, "config": asdict(cfg),
            "data_file": str(data_file), "knob": {"path_t": round(t, 6)},
            "model_stats": summary(lengths(t))}
    (out_dir / "proxy_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="root folder of the proxies")
    parser.add_argument("--datasets", nargs="*", default=list(PROXY_NAMES), choices=PROXY_NAMES)
    parser.add_argument("--num-samples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--leverage-cv", type=float, nargs="*", default=[])
    parser.add_argument("--leverage-fs", type=float, nargs="*", default=[])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = {}
    for name in args.datasets:
        cfg = ProxyConfig(name, num_samples=args.num_samples, seed=args.seed)
        report[name] = write_proxy(cfg, args.out / name)
    for cv in args.leverage_cv:
        for fs in args.leverage_fs:
            cfg = LeverageConfig(cv, fs, num_samples=args.num_samples, seed=args.seed)
            report[cfg.name] = write_leverage(cfg, args.out / "leverage" / cfg.name)
    report["total_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
