"""MMMU multiple-choice accuracy by answer-letter log-likelihood, with images.

lm-eval's ``hf-multimodal`` model has no log-likelihood with images, so this is our own
scorer, following ODB's protocol ("MMMU-MC-choice-likelihood-v1"): the user turn holds
the row's images and then the question with lettered options and "Answer with the option
letter only."; one forward over the chat-templated prompt (generation prompt added); the
score of a letter is the log-probability of its first token at the last position; the
prediction is the best-scoring valid letter (A.. up to the option count, A-H when the
options are missing or too many). Rows whose answer is not a single letter A-H (open
questions) are excluded and counted. Accuracy is reported overall, per category and per
subject.

    python -m eval.mmmu_mc --checkpoint runs/x/final --out results/eval/x/mmmu_mc.json
    python -m eval.mmmu_mc --checkpoint runs/x/final --source eval/fixtures/mmmu \\
        --out results/eval/x/mmmu_mc_local.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from eval import mmmu_data


def letter_token_ids(tokenizer, letters: str = mmmu_data.LETTERS) -> dict[str, int]:
    """First token id of each letter (as ODB scores it)."""
    return {L: tokenizer(L, add_special_tokens=False)["input_ids"][0] for L in letters}


@torch.no_grad()
def letter_logprobs(model, inputs: dict, letter_ids: dict[str, int]) -> dict[str, float]:
    """Log-probability of each letter's first token as the next token after ``inputs``."""
    logits = model(**inputs).logits[0, -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return {L: float(logprobs[i]) for L, i in letter_ids.items()}


def predict(scores: dict[str, float], valid: str) -> str:
    """The best-scoring valid letter (the first one on ties)."""
    return max(valid, key=lambda L: (scores[L], -valid.index(L)))


def add_mmmu_args(parser: argparse.ArgumentParser) -> None:
    from eval.config import DTYPES, MMMU_HUB_ID

    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, help="result JSON path")
    parser.add_argument("--source", default=MMMU_HUB_ID, help="hub id or local folder")
    parser.add_argument("--split", default="validation", choices=("validation", "dev"))
    parser.add_argument("--subjects", nargs="*", default=[], help="default: all available")
    parser.add_argument("--image-max-pixels", type=int, default=768 * 768)
    parser.add_argument("--image-min-pixels", type=int, default=64 * 32 * 32)
    parser.add_argument("--limit", type=int, default=0, help="rows per subject (0 = all)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=DTYPES)


def config_kwargs(args: argparse.Namespace) -> dict:
    return vars(args) | {"subjects": tuple(args.subjects)}


def score_row(model, tokenizer, image_processor, row: dict, letter_ids: dict, device) -> dict:
    """One row's prediction record: ``{"id", "answer", "pred", "logprobs"}``.

    ``row`` must have a letter answer (`mmmu_data.answer_letter` not None); ``logprobs``
    holds the row's valid letters only.
    """
    inputs = {
        k: v.to(device) for k, v in mmmu_data.mc_inputs(tokenizer, image_processor, row).items()
    }
    scores = letter_logprobs(model, inputs, letter_ids)
    valid = mmmu_data.valid_letters(row)
    return {
        "id": row["id"],
        "answer": mmmu_data.answer_letter(row),
        "pred": predict(scores, valid),
        "logprobs": {L: scores[L] for L in valid},
    }


def run(cfg, model_and_processors=None) -> dict:
    """Score MMMU-MC for ``cfg.checkpoint``; write and return the record.

    ``model_and_processors`` (model, tokenizer, image processor, meta) replaces loading
    the checkpoint, e.g. to score a model whose logits a test has rigged.

    Raises:
        ValueError: no row with a letter answer was read.
    """
    from tqdm.auto import tqdm

    from eval.checkpoint import load_checkpoint

    started = time.perf_counter()
    model, tokenizer, image_processor, meta = model_and_processors or load_checkpoint(
        cfg.checkpoint, dtype=cfg.torch_dtype, device=cfg.device
    )
    mmmu_data.set_image_budget(image_processor, cfg)
    letter_ids = letter_token_ids(tokenizer)
    correct: dict[str, list[bool]] = defaultdict(list)
    excluded, predictions = 0, []
    for subject, row in tqdm(list(mmmu_data.iter_rows(cfg)), desc="MMMU-MC", unit="item"):
        if mmmu_data.answer_letter(row) is None:
            excluded += 1
            continue
        prediction = score_row(model, tokenizer, image_processor, row, letter_ids, cfg.device)
        correct[subject].append(prediction["pred"] == prediction["answer"])
        predictions.append(prediction)
    if not predictions:
        raise ValueError(
            f"No MMMU row with a letter answer in {cfg.source} "
            f"({excluded} excluded); check --source, --subjects and --split"
        )
    return mmmu_data.write_record(
        cfg,
        benchmark="mmmu_mc",
        task="mmmu_mc_likelihood",
        meta=meta,
        model=model,
        correct=correct,
        excluded=excluded,
        metrics={"protocol": "MMMU-MC-choice-likelihood-v1"},
        predictions=predictions,
        started=started,
    )


def main(argv: list[str] | None = None) -> dict:
    from eval.config import MMMUConfig

    parser = argparse.ArgumentParser(
        prog="python -m eval.mmmu_mc", description=__doc__.splitlines()[0]
    )
    add_mmmu_args(parser)
    record = run(MMMUConfig(**config_kwargs(parser.parse_args(argv))))
    print(
        json.dumps(
            {
                k: record[k]
                for k in ("benchmark", "accuracy", "items_scored", "items_excluded", "scale")
            }
        )
    )
    return record


if __name__ == "__main__":
    main()
