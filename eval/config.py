"""The frozen, validated configuration of each evaluator (one per ``python -m eval.<name>``).

A bad setting fails when the object is built, with a message that names the value and
says what to change (the style of ``odb/core/config.py``). Nothing is read from the
environment. Each command line maps its flags one to one onto these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from odb.kit import check_int

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
VAL_LOSS_DATASETS: tuple[str, ...] = ("ultrachat", "llava", "sharegpt4o", "mmmix")
MMMU_HUB_ID = "MMMU/MMMU"


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_text(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class _Common:
    checkpoint: str
    out: str
    device: str = "cpu"
    dtype: DType = "float32"

    def __post_init__(self) -> None:
        _check_text("checkpoint", self.checkpoint)
        _check_text("out", self.out)
        _check_text("device", self.device)
        _check_choice("dtype", self.dtype, DTYPES)

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)


@dataclass(frozen=True)
class ValLossConfig(_Common):
    """Validation loss on the held-out split of one training dataset.

    Attributes:
        checkpoint: checkpoint folder, model/adapter folder, HF folder or hub id.
        out: result JSON path.
        data_from_run: take the data settings (dataset, source, hub subset and split,
            image folder, cutoff, pixel budget, held-out split) from the ``data`` section
            of the training run's ``trainer_state.json``: the same dataset and pipeline
            the run trained on, exactly. The data fields below must then stay unset.
        dataset: record schema of the training data (as ``DataConfig.dataset``).
        source: the training data (local file/folder or hub id), as in training.
        holdout_samples: size of the held-out split: the last records, as in training.
        max_samples: records read before the split (0 = all), as in training.
        token_budget: padded tokens per forward (speed only; the loss does not depend on it).
        image_max_pixels / cutoff_len: the preprocessing settings of the training run.
        processor: tokenizer + image processor folder; default: the checkpoint's own.
        device / dtype: where and in which precision the model runs.

    Example:
        >>> ValLossConfig("runs/x/final", "out.json", dataset="mmmix", source="d",
        ...               holdout_samples=0)
        Traceback (most recent call last):
        ValueError: holdout_samples must be >= 1, got 0
    """

    data_from_run: bool = False
    dataset: str = "mmmix"
    source: str = ""
    holdout_samples: int = 0
    max_samples: int = 0
    token_budget: int = 16384
    image_max_pixels: int = 768 * 768
    cutoff_len: int = 16384
    processor: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("dataset", self.dataset, VAL_LOSS_DATASETS)
        if self.data_from_run:
            if self.source or self.holdout_samples:
                raise ValueError(
                    "data_from_run reads the data settings from the run's trainer_state.json; "
                    f"leave source ({self.source!r}) and holdout_samples "
                    f"({self.holdout_samples}) unset"
                )
        else:
            _check_text("source", self.source)
            check_int("holdout_samples", self.holdout_samples, 1)
        check_int("max_samples", self.max_samples, 0)
        check_int("token_budget", self.token_budget, 1)
        check_int("image_max_pixels", self.image_max_pixels, 1)
        check_int("cutoff_len", self.cutoff_len, 16)


@dataclass(frozen=True)
class MMLUConfig(_Common):
    """MMLU through lm-eval's task machinery and its ``hf`` model (``HFLM``).

    Attributes:
        task: lm-eval task or group; ``mmlu`` (the standard group, from the hub) or, with
            ``task_files``, ``mmlu_local``.
        task_files: folder of local MMLU files in the ``cais/mmlu`` fields
            (``<subject>/{test,dev}.jsonl``, or the hub's ``<subject>/{test,dev}-*.parquet``
            as staged); builds the ``mmlu_local`` group. None: the hub.
        num_fewshot: shots (from the ``dev`` split, first n, as lm-eval's MMLU does).
        apply_chat_template: render prompts with the tokenizer's chat template.
        batch_size: HFLM batch size.
        limit: items per subject task (0 = all; >0 is for smoke runs only).

    Example:
        >>> MMLUConfig("Qwen/Qwen3-VL-2B-Instruct", "mmlu.json", num_fewshot=-1)
        Traceback (most recent call last):
        ValueError: num_fewshot must be >= 0, got -1
    """

    task: str = "mmlu"
    task_files: str | None = None
    num_fewshot: int = 0
    apply_chat_template: bool = False
    batch_size: int = 8
    limit: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_text("task", self.task)
        check_int("num_fewshot", self.num_fewshot, 0)
        check_int("batch_size", self.batch_size, 1)
        check_int("limit", self.limit, 0)
        if not isinstance(self.apply_chat_template, bool):
            raise TypeError(f"apply_chat_template must be a bool, got {self.apply_chat_template!r}")
        if self.task_files is not None and self.task != "mmlu_local":
            raise ValueError(
                f"task_files builds the task 'mmlu_local', but task={self.task!r}; "
                f"set task='mmlu_local' or drop task_files"
            )
        if self.task == "mmlu_local" and self.task_files is None:
            raise ValueError("task='mmlu_local' needs task_files (the local MMLU folder)")


@dataclass(frozen=True)
class MMMUConfig(_Common):
    """MMMU multiple-choice by answer-letter log-likelihood (our scorer, with images).

    Attributes:
        source: ``MMMU/MMMU`` (the hub) or a local folder in the hub layout
            (``<Subject>/<split>-*.parquet``).
        split: ``validation`` (the paper's) or ``dev``.
        subjects: subject configs to read (empty: all 30).
        image_max_pixels / image_min_pixels: the image processor's pixel budget.
        limit: rows per subject (0 = all; >0 is for smoke runs only).
    """

    source: str = MMMU_HUB_ID
    split: str = "validation"
    subjects: tuple[str, ...] = ()
    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 64 * 32 * 32
    limit: int = 0

    def __post_init__(self) -> None:
        from eval.mmmu_data import SUBJECT_CATEGORY

        super().__post_init__()
        _check_text("source", self.source)
        _check_choice("split", self.split, ("validation", "dev"))
        if not isinstance(self.subjects, tuple):
            raise TypeError(f"subjects must be a tuple of subject names, got {self.subjects!r}")
        for s in self.subjects:
            _check_choice("subject", s, tuple(SUBJECT_CATEGORY))
        check_int("image_max_pixels", self.image_max_pixels, 1)
        check_int("image_min_pixels", self.image_min_pixels, 1)
        if self.image_min_pixels > self.image_max_pixels:
            raise ValueError(
                f"Need image_min_pixels <= image_max_pixels, got "
                f"{self.image_min_pixels} and {self.image_max_pixels}"
            )
        check_int("limit", self.limit, 0)


@dataclass(frozen=True)
class MMMUGenConfig(MMMUConfig):
    """MMMU generated-answer: greedy generation, then lm-eval's MMMU answer extraction.

    Attributes:
        max_new_tokens: generation length (lm-eval's ``mmmu_val`` uses 512).
    """

    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("max_new_tokens", self.max_new_tokens, 1)
