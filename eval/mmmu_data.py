"""MMMU rows, prompts, model inputs and the result record, shared by the multiple-choice
and generated-answer evaluators.

Rows come from ``MMMU/MMMU`` (one hub config per subject) or from a local folder in the
same layout (``<Subject>/<split>-*.parquet`` with the same features), both through
``datasets.load_dataset``, so the offline fixtures run the cluster's code. Subjects and
their six categories are lm-eval's (``lm_eval/tasks/mmmu``). Model inputs are built the
way the Qwen3-VL processor builds them: the chat template renders each image as
``<|vision_start|><|image_pad|><|vision_end|>`` and the pad is expanded to the image's
``grid_t * grid_h * grid_w / merge**2`` tokens.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

CATEGORY_SUBJECTS = {
    "Art and Design": ("Art", "Art_Theory", "Design", "Music"),
    "Business": ("Accounting", "Economics", "Finance", "Manage", "Marketing"),
    "Health and Medicine": (
        "Basic_Medical_Science",
        "Clinical_Medicine",
        "Diagnostics_and_Laboratory_Medicine",
        "Pharmacy",
        "Public_Health",
    ),
    "Humanities and Social Science": ("History", "Literature", "Sociology", "Psychology"),
    "Science": ("Biology", "Chemistry", "Geography", "Math", "Physics"),
    "Tech and Engineering": (
        "Agriculture",
        "Architecture_and_Engineering",
        "Computer_Science",
        "Electronics",
        "Energy_and_Power",
        "Materials",
        "Mechanical_Engineering",
    ),
}
SUBJECT_CATEGORY = {s: c for c, subjects in CATEGORY_SUBJECTS.items() for s in subjects}
MAX_IMAGES = 7
REQUIRED_FIELDS = (
    "id",
    "question",
    "options",
    "answer",
    "question_type",
    *(f"image_{i}" for i in range(1, MAX_IMAGES + 1)),
)
LETTERS = "ABCDEFGH"  # ODB's MMMU-MC protocol scores at most eight options


def load_subject(source: str, subject: str, split: str):
    """One subject's rows as a ``datasets.Dataset`` (images decoded to PIL).

    Raises:
        FileNotFoundError: a local ``source`` lacks the subject's split files.
        ValueError: the rows lack MMMU fields.
    """
    from datasets import load_dataset

    root = Path(source)
    if root.exists():
        files = sorted((root / subject).glob(f"{split}-*.parquet"))
        if not files:
            raise FileNotFoundError(
                f"No {split}-*.parquet for subject {subject} under {root / subject}; write "
                "the fixtures with python -m experiments.data.task_fixtures or pick --subjects "
                "present"
            )
        rows = load_dataset("parquet", data_files={split: [str(f) for f in files]}, split=split)
        where = str(root / subject)
    else:
        rows = load_dataset(source, subject, split=split)
        where = f"{source}:{subject}/{split}"
    missing = [f for f in REQUIRED_FIELDS if f not in rows.column_names]
    if missing:
        raise ValueError(
            f"MMMU task file(s) {where} lack field(s) {missing}; MMMU rows need "
            f"{list(REQUIRED_FIELDS)}"
        )
    return rows


def local_subjects(source: str) -> tuple[str, ...]:
    """Subjects present in a local folder (all 30 for the hub)."""
    root = Path(source)
    if not root.exists():
        return tuple(SUBJECT_CATEGORY)
    return tuple(s for s in SUBJECT_CATEGORY if (root / s).is_dir())


def iter_rows(cfg):
    """(subject, row) over ``cfg.subjects`` (default: all available), ``cfg.limit`` per
    subject."""
    for subject in cfg.subjects or local_subjects(cfg.source):
        rows = load_subject(cfg.source, subject, cfg.split)
        n = min(cfg.limit, len(rows)) if cfg.limit else len(rows)
        for i in range(n):
            yield subject, rows[i]


def options_of(row: dict) -> list[str]:
    """The row's options (MMMU stores them as the string repr of a Python list)."""
    value = row["options"]
    options = ast.literal_eval(value) if isinstance(value, str) and value.strip() else value
    return list(options or [])


def answer_letter(row: dict) -> str | None:
    """The gold letter, or None when the answer is not a single letter A-H (excluded)."""
    answer = str(row["answer"]).strip()
    return answer if len(answer) == 1 and answer in LETTERS else None


def valid_letters(row: dict) -> str:
    """A.. up to the option count; all of A-H when options are missing or too many."""
    n = len(options_of(row))
    return LETTERS[:n] if 0 < n <= len(LETTERS) else LETTERS


def row_images(row: dict) -> list:
    """The row's images in field order (``image_1`` .. ``image_7``), RGB."""
    images = [row[f"image_{i}"] for i in range(1, MAX_IMAGES + 1)]
    return [im.convert("RGB") for im in images if im is not None]


def mc_prompt(row: dict) -> str:
    """ODB's MMMU-MC prompt: the question, the lettered options, the instruction."""
    lines = [str(row["question"])]
    lines += [f"({LETTERS[i]}) {opt}" for i, opt in enumerate(options_of(row)[: len(LETTERS)])]
    lines.append("Answer with the option letter only.")
    return "\n".join(lines)


def encode(tokenizer, image_processor, content: list[dict], images: list) -> dict:
    """Model inputs (batch of one) for a user turn ``content`` (chat-template items:
    ``{"type": "image"}`` / ``{"type": "text", "text": ...}``) followed by the assistant
    prompt. ``images`` fill the image items in order.
    """
    from experiments.data.assets import IMAGE_PAD

    n_items = sum(item["type"] == "image" for item in content)
    if n_items != len(images):
        raise ValueError(f"{n_items} image items in the prompt but {len(images)} images")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    batch: dict[str, torch.Tensor] = {}
    if images:
        vision = image_processor(images=images, return_tensors="pt")
        counts = (vision["image_grid_thw"].prod(-1) // image_processor.merge_size**2).tolist()
        if ids.count(pad) != len(counts):
            raise ValueError(
                f"The chat template rendered {ids.count(pad)} image pads for "
                f"{len(counts)} images; check the tokenizer's chat template"
            )
        expanded: list[int] = []
        for t in ids:
            expanded += [t] * counts.pop(0) if t == pad else [t]
        ids = expanded
        batch = {"pixel_values": vision["pixel_values"], "image_grid_thw": vision["image_grid_thw"]}
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == pad).long(),
    } | batch


def mc_inputs(tokenizer, image_processor, row: dict) -> dict:
    """MMMU-MC inputs: the images first, then the prompt text (ODB's protocol)."""
    images = row_images(row)
    content = [{"type": "image"}] * len(images) + [{"type": "text", "text": mc_prompt(row)}]
    return encode(tokenizer, image_processor, content, images)


def accuracy_table(correct_by_key: dict[str, list[bool]]) -> dict:
    """``{key: {"accuracy", "items"}}`` in sorted key order, from correctness lists.

    Example:
        >>> accuracy_table({"b": [True, False], "a": [True]})
        {'a': {'accuracy': 1.0, 'items': 1}, 'b': {'accuracy': 0.5, 'items': 2}}
    """
    return {
        k: {"accuracy": sum(v) / len(v), "items": len(v)} for k, v in sorted(correct_by_key.items())
    }


def per_category(correct_by_subject: dict[str, list[bool]]) -> dict:
    """``{category: {"accuracy", "items"}}`` from per-subject correctness lists."""
    out = {}
    for category, subjects in CATEGORY_SUBJECTS.items():
        flags = [f for s in subjects for f in correct_by_subject.get(s, [])]
        if flags:
            out[category] = {"accuracy": sum(flags) / len(flags), "items": len(flags)}
    return out


def set_image_budget(image_processor, cfg) -> None:
    """Apply the config's pixel budget (``size`` is the knob transformers 5 honours)."""
    image_processor.size = {
        "longest_edge": cfg.image_max_pixels,
        "shortest_edge": cfg.image_min_pixels,
    }


def write_record(
    cfg,
    *,
    benchmark: str,
    task: str,
    meta,
    model,
    correct: dict[str, list[bool]],
    excluded: int,
    metrics: dict,
    predictions: list[dict],
    started: float,
) -> dict:
    """Build an MMMU evaluator's result record, validate it, write it to ``cfg.out``.

    What both evaluators share is set here: zero-shot with the chat template, the split
    and source of ``cfg``, ``items_scored`` and ``accuracy`` over ``correct`` (per-subject
    correctness lists, at least one item), ``per_category``, and ``metrics`` followed by
    ``per_subject`` and ``predictions``. ``metrics`` holds what is the evaluator's own.

    Returns:
        The record as written.
    """
    from eval.results import result_record, write_result

    scored = sum(len(v) for v in correct.values())
    record = result_record(
        benchmark,
        config=cfg,
        meta=meta,
        model=model,
        task=task,
        split=cfg.split,
        shots=0,
        chat_template=True,
        items_scored=scored,
        items_excluded=excluded,
        accuracy=sum(sum(v) for v in correct.values()) / scored,
        per_category=per_category(correct),
        metrics=metrics | {"per_subject": accuracy_table(correct), "predictions": predictions},
        source=cfg.source,
        local_data=cfg.source != "MMMU/MMMU",
        started=started,
    )
    write_result(record, cfg.out)
    return record
