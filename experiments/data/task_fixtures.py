"""Write the small local task files the CPU path evaluates on, in the real formats.

- ``mmlu/<subject>/{dev,test}.jsonl``: ``cais/mmlu`` fields (``question``, ``subject``,
  ``choices`` [4 strings], ``answer`` [int 0-3]); 5 dev rows (the shots) and 3 test rows
  for one subject of each MMLU category.
- ``mmmu/<Subject>/validation-00000-of-00001.parquet``: ``MMMU/MMMU``'s layout and
  features (``id``, ``question`` with ``<image i>`` tags, ``options`` as the string repr
  of a list, ``explanation``, ``image_1``..``image_7`` as ``datasets.Image``,
  ``img_type``, ``answer``, ``topic_difficulty``, ``question_type``, ``subfield``); three
  multiple-choice rows per subject keyed A, B and C (one with two images) and one
  open-question row with a numeric answer, which the MC scorer must exclude.

`write_mmlu_hub` and `write_mmmu_subjects` write the same rows in the hub repositories'
own layouts (parquet per subject folder), for the hub mirror of
`experiments.rehearsal.hub_mirror`.

The questions are synthetic; the files exist so the real code paths run offline. Scores
on them are pipeline checks. Deterministic: the same command writes the same rows.

    python -m experiments.data.task_fixtures --out eval/fixtures
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

MMLU_SUBJECTS = {  # one subject per MMLU category
    "abstract_algebra": "stem",
    "high_school_geography": "social_sciences",
    "philosophy": "humanities",
    "nutrition": "other",
}
MMMU_SUBJECTS = ("Art", "Accounting", "Math", "Computer_Science")
MAX_IMAGES = 7


def _mmlu_rows(subject: str, n: int, offset: int) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = 3 + i + offset, 5 + 2 * i
        answer = (i + offset) % 4
        wrong = [a + b + d for d in (1, 2, 3)]
        choices = [str(w) for w in wrong]
        choices.insert(answer, str(a + b))
        rows.append(
            {
                "question": f"In a {subject.replace('_', ' ')} exercise, what is {a} + {b}?",
                "subject": subject,
                "choices": choices,
                "answer": answer,
            }
        )
    return rows


def write_mmlu(out: Path) -> list[Path]:
    paths = []
    for k, subject in enumerate(MMLU_SUBJECTS):
        for split, n, offset in (("dev", 5, 0), ("test", 3, 5 + k)):
            path = out / "mmlu" / subject / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in _mmlu_rows(subject, n, offset)))
            paths.append(path)
    return paths


MMLU_HUB_SPLITS = (("dev", 5, 0), ("validation", 4, 9), ("test", 3, 5))


def write_mmlu_hub(root: Path) -> list[Path]:
    """``root/<subject>/{dev,validation,test}-00000-of-00001.parquet``: the layout and
    features of the ``cais/mmlu`` hub repository (``answer`` a ``ClassLabel`` A-D, stored
    as its integer index), with the rows of the jsonl fixtures (test rows as `write_mmlu`)."""
    from datasets import ClassLabel, Dataset, Features, Sequence, Value

    features = Features({"question": Value("string"), "subject": Value("string"),
                         "choices": Sequence(Value("string")),
                         "answer": ClassLabel(names=["A", "B", "C", "D"])})
    paths = []
    for k, subject in enumerate(MMLU_SUBJECTS):
        for split, n, offset in MMLU_HUB_SPLITS:
            rows = _mmlu_rows(subject, n, offset + k if split == "test" else offset)
            path = root / subject / f"{split}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            Dataset.from_list(rows, features=features).to_parquet(str(path))
            paths.append(path)
    return paths


def _png(h: int, w: int, colour: tuple[int, int, int]) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


def _mmmu_rows(subject: str, k: int, split: str = "validation") -> list[dict]:
    def row(i: int, question: str, options: list[str], answer: str, qtype: str, images: int):
        record = {
            "id": f"{split}_{subject}_{i}",
            "question": question,
            "options": str(options),
            "explanation": "",
            "img_type": str(["Diagrams"] * images),
            "answer": answer,
            "topic_difficulty": ["Easy", "Medium", "Hard"][i % 3],
            "question_type": qtype,
            "subfield": subject.replace("_", " "),
        }
        for j in range(1, MAX_IMAGES + 1):
            colour = (40 * k % 256, 60 * i % 256, 30 * j % 256)
            record[f"image_{j}"] = _png(48 + 8 * i, 64 + 4 * j, colour) if j <= images else None
        return record

    topic = subject.replace("_", " ").lower()
    return [
        row(
            1,
            f"<image 1> Which {topic} label fits the figure?",
            ["circle", "square", "triangle", "hexagon"],
            "A",
            "multiple-choice",
            1,
        ),
        row(
            2,
            f"Compare <image 1> and <image 2>. Which {topic} statement holds?",
            ["they match", "the first is larger", "the second is larger"],
            "B",
            "multiple-choice",
            2,
        ),
        row(
            3,
            f"<image 1> What does this {topic} chart show most clearly?",
            ["a rise", "a fall", "a plateau", "a cycle", "no trend"],
            "C",
            "multiple-choice",
            1,
        ),
        row(4, f"<image 1> How many items does the {topic} figure show?", [], "42", "open", 1),
    ]


def write_mmmu(out: Path) -> list[Path]:
    """The shipped MMMU fixtures: ``out/mmmu/<Subject>/validation-00000-of-00001.parquet``."""
    return write_mmmu_subjects(out / "mmmu", ("validation",))


def write_mmmu_subjects(root: Path, splits: tuple[str, ...]) -> list[Path]:
    """``root/<Subject>/<split>-00000-of-00001.parquet`` for each split: the layout and
    features of the ``MMMU/MMMU`` hub repository (every split holds the same rows, with
    ids prefixed by the split)."""
    from datasets import Dataset, Features, Image, Value

    string = Value("string")
    features = Features(
        {
            "id": string,
            "question": string,
            "options": string,
            "explanation": string,
            **{f"image_{j}": Image() for j in range(1, MAX_IMAGES + 1)},
            "img_type": string,
            "answer": string,
            "topic_difficulty": string,
            "question_type": string,
            "subfield": string,
        }
    )
    paths = []
    for k, subject in enumerate(MMMU_SUBJECTS):
        for split in splits:
            rows = _mmmu_rows(subject, k, split)
            table = {name: [r[name] for r in rows] for name in features}
            path = root / subject / f"{split}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            Dataset.from_dict(table, features=features).to_parquet(str(path))
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.data.task_fixtures", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parents[2] / "eval" / "fixtures")
    args = parser.parse_args(argv)
    paths = write_mmlu(args.out) + write_mmmu(args.out)
    for p in paths:
        print(p)
    return paths


if __name__ == "__main__":
    main()
