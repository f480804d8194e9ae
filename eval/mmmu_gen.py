"""MMMU generated-answer accuracy: greedy generation, then lm-eval's MMMU answer extraction.

lm-eval's ``mmmu_val`` needs the ``hf-multimodal`` model (``AutoModelForImageTextToText``
built from a hub name, with the hub dataset); here the loaded checkpoint generates in our
own loop and the prompt, the images and the scoring are lm-eval's own functions
(``lm_eval.tasks.mmmu.utils``): ``doc_to_text`` ("... Answer with the option's letter
from the given choices directly.", ``<image i>`` -> ``<image>``), ``doc_to_image`` (the
images the tags name, in order), images placed where their tags are (hf-multimodal's
``interleave``), greedy decoding up to ``max_new_tokens`` (lm-eval: 512), then
``parse_multi_choice_response`` / ``parse_open_response`` with ``eval_multi_choice`` /
``eval_open``. Every row is scored, multiple-choice and open, as in ``mmmu_val``.

One deliberate difference, so format drift is visible: where a multiple-choice response
contains no letter and no option text, lm-eval guesses a letter at random; we count the
row as wrong and report it under ``metrics.unparsed`` (``metrics.accuracy_with_guessing``
adds the expected value of lm-eval's guess, 1/#options per such row).

    python -m eval.mmmu_gen --checkpoint runs/x/final --out results/eval/x/mmmu_gen.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from eval import mmmu_data

_STRIP = [",", ".", "!", "?", ";", ":", "'"]


def _mmmu_utils():
    from lm_eval.tasks.mmmu import utils

    return utils


def _has_candidate(response: str, all_choices: list[str], index2ans: dict) -> bool:
    """Whether lm-eval's ``parse_multi_choice_response`` finds a candidate (instead of
    falling back to a random letter): the same three checks, in the same order."""
    for char in _STRIP:
        response = response.strip(char)
    response = f" {response} "
    if any(f"({c})" in response or f" {c} " in response for c in all_choices):
        return True
    return len(response.split()) > 5 and any(
        str(ans).lower() in response.lower() for ans in index2ans.values()
    )


def extract_choice(response: str, options: list[str]) -> str | None:
    """The letter lm-eval's MMMU extraction reads from ``response``; None where lm-eval
    would guess at random (no letter and no option text found).

    Example:
        >>> extract_choice("The answer is (B).", ["x", "y", "z"])
        'B'
        >>> extract_choice("Not sure.", ["x", "y", "z"]) is None
        True
    """
    letters = [chr(ord("A") + i) for i in range(len(options))]
    index2ans = dict(zip(letters, options, strict=True))
    if not _has_candidate(response, letters, index2ans):
        return None
    return _mmmu_utils().parse_multi_choice_response(response, letters, index2ans)


def score_response(row: dict, response: str) -> tuple[bool, str | None]:
    """(correct, extracted answer) with lm-eval's MMMU rules; None = nothing extracted."""
    utils = _mmmu_utils()
    if row["question_type"] == "multiple-choice":
        pred = extract_choice(response, mmmu_data.options_of(row))
        return pred is not None and utils.eval_multi_choice(row["answer"], pred), pred
    parsed = utils.parse_open_response(response)
    return bool(utils.eval_open(row["answer"], parsed)), "; ".join(map(str, parsed))


def gen_inputs(tokenizer, image_processor, row: dict) -> dict:
    """lm-eval's prompt and images, each image placed at its ``<image>`` tag."""
    utils = _mmmu_utils()
    text, images = utils.doc_to_text(row), [im.convert("RGB") for im in utils.doc_to_image(row)]
    pieces = text.split("<image>")
    content: list[dict] = []
    for i, piece in enumerate(pieces):
        if i:
            content.append({"type": "image"})
        if piece:
            content.append({"type": "text", "text": piece})
    return mmmu_data.encode(tokenizer, image_processor, content, images)


@torch.no_grad()
def generate(model, tokenizer, inputs: dict, max_new_tokens: int) -> str:
    """Greedy continuation of ``inputs``, decoded without special tokens."""
    out = model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def answer_row(model, tokenizer, image_processor, row: dict, cfg) -> dict:
    """Generate ``row``'s answer and score it: ``{"id", "answer", "response", "pred",
    "correct"}``; ``pred`` None = nothing extracted (counted wrong)."""
    inputs = {k: v.to(cfg.device) for k, v in gen_inputs(tokenizer, image_processor, row).items()}
    response = generate(model, tokenizer, inputs, cfg.max_new_tokens)
    ok, pred = score_response(row, response)
    return {
        "id": row["id"],
        "answer": row["answer"],
        "response": response,
        "pred": pred,
        "correct": ok,
    }


def run(cfg) -> dict:
    """Generate and score MMMU for ``cfg.checkpoint``; write and return the record.

    Raises:
        ValueError: no row was read.
    """
    from tqdm.auto import tqdm

    from eval.checkpoint import load_checkpoint

    started = time.perf_counter()
    model, tokenizer, image_processor, meta = load_checkpoint(
        cfg.checkpoint, dtype=cfg.torch_dtype, device=cfg.device
    )
    mmmu_data.set_image_budget(image_processor, cfg)
    correct: dict[str, list[bool]] = defaultdict(list)
    by_type: dict[str, list[bool]] = defaultdict(list)
    unparsed, guess_credit, predictions = 0, 0.0, []
    for subject, row in tqdm(list(mmmu_data.iter_rows(cfg)), desc="MMMU generate", unit="item"):
        prediction = answer_row(model, tokenizer, image_processor, row, cfg)
        if prediction["pred"] is None:  # lm-eval would guess: credit its expected value
            unparsed += 1
            guess_credit += 1 / max(1, len(mmmu_data.options_of(row)))
        correct[subject].append(prediction["correct"])
        by_type[row["question_type"]].append(prediction["correct"])
        predictions.append(prediction)
    if not predictions:
        raise ValueError(f"No MMMU rows read from {cfg.source}; check --source and --subjects")
    hits = sum(p["correct"] for p in predictions)
    return mmmu_data.write_record(
        cfg,
        benchmark="mmmu_gen",
        task="mmmu_val_generate",
        meta=meta,
        model=model,
        correct=correct,
        excluded=0,
        metrics={
            "unparsed": unparsed,
            "accuracy_with_guessing": (hits + guess_credit) / len(predictions),
            "per_question_type": mmmu_data.accuracy_table(by_type),
        },
        predictions=predictions,
        started=started,
    )


def main(argv: list[str] | None = None) -> dict:
    from eval.config import MMMUGenConfig
    from eval.mmmu_mc import add_mmmu_args, config_kwargs

    parser = argparse.ArgumentParser(
        prog="python -m eval.mmmu_gen", description=__doc__.splitlines()[0]
    )
    add_mmmu_args(parser)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    record = run(MMMUGenConfig(**config_kwargs(parser.parse_args(argv))))
    print(json.dumps({k: record[k] for k in ("benchmark", "accuracy", "items_scored", "scale")}))
    return record


if __name__ == "__main__":
    main()
