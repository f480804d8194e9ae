"""The proxies on disk: calibrated plans written as records in each dataset's real schema.

Text is word salad over a fixed synthetic vocabulary, drawn from a seeded stream
independent of the calibration knob; images are single-colour palette PNGs of the
planned sizes.
"""

import hashlib
import json
from pathlib import Path

import numpy as np
from PIL import Image

from experiments.data.proxy_lengths import SamplePlan
from experiments.data.proxy_plans import MMMIX_SOURCES, stable_int

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


class TextSource:
    """Word salad of an exact word count from a seeded stream independent of the knob."""

    def __init__(self, seed: int, name: str) -> None:
        self.words = np.array(vocabulary())
        self.rng = np.random.default_rng([seed, stable_int(name + "/text")])

    def text(self, n_words: int) -> str:
        return " ".join(self.words[self.rng.integers(0, len(self.words), n_words)])


def _write_png(path: Path, h: int, w: int, colour: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Palette mode: one byte per pixel keeps large images fast to write and small on disk.
    Image.new("P", (w, h), colour).save(path, compress_level=1)


def _conversation(plan: SamplePlan, texts: TextSource, image_tag: bool) -> list[dict]:
    conv = []
    for j, (role, n) in enumerate(plan.messages):
        value = texts.text(n)
        if j == 0 and image_tag:
            value = f"{value}\n<image>" if plan.image_after_text else f"<image>\n{value}"
        conv.append({"from": "human" if role == "user" else "gpt", "value": value})
    return conv


def _write_ultrachat(root: Path, plans: list[SamplePlan], texts: TextSource) -> Path:
    path = root / "train.jsonl"
    with path.open("w") as f:
        for plan in plans:
            messages = [{"role": r, "content": texts.text(n)} for r, n in plan.messages]
            prompt = messages[0]["content"]
            row = {"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                   "messages": messages}
            f.write(json.dumps(row) + "\n")
    return path


def _write_llava(root: Path, plans: list[SamplePlan], texts: TextSource) -> Path:
    rows = []
    for i, plan in enumerate(plans):
        image = f"{i:012d}.png"
        _write_png(root / "train2017" / image, *plan.images[0], colour=i % 256)
        rows.append({"id": f"{i:012d}", "image": image,
                     "conversations": _conversation(plan, texts, image_tag=True)})
    path = root / "llava_instruct_150k.json"
    path.write_text(json.dumps(rows))
    return path


def _write_sharegpt4o(root: Path, plans: list[SamplePlan], texts: TextSource) -> Path:
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


def _write_mmmix(root: Path, plans: list[SamplePlan], texts: TextSource) -> Path:
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


WRITERS = {"ultrachat": _write_ultrachat, "llava": _write_llava,
            "sharegpt4o": _write_sharegpt4o, "mmmix": _write_mmmix}

