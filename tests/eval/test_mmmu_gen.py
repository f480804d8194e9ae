"""MMMU generated-answer: lm-eval's extraction on real-looking outputs, and the command."""

import json
from pathlib import Path

import pytest

from eval import mmmu_gen
from eval.results import PIPELINE_CHECK, validate_result
from tests.eval.conftest import MAX_PIXELS

FIXTURES = Path(__file__).parents[2] / "eval" / "fixtures" / "mmmu"
OPTIONS = ["they match", "the first is larger", "the second is larger"]


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("The answer is (B).", "B"),
        ("B", "B"),
        ("B.", "B"),
        ("(C) the second is larger", "C"),
        ("A or B? I would say B", "B"),  # several letters: the last one wins
        ("b) the first is larger", None),  # lower case, under 6 words: nothing found
        ("it is B, clearly", None),  # "B," is not " B ": lm-eval would guess at random
        ("I think that in the figure the second is larger than before", "C"),  # option text
        ("The figure shows a colourful pattern of shapes.", None),  # free text, no letter
        ("", None),
    ],
)
def test_extraction_table(response: str, expected: str | None) -> None:
    assert mmmu_gen.extract_choice(response, OPTIONS) == expected


def test_extraction_agrees_with_lm_eval_where_it_does_not_guess() -> None:
    from lm_eval.tasks.mmmu.utils import parse_multi_choice_response

    letters = ["A", "B", "C"]
    for response in ["(A) they match", "Answer: C", "it is B here", "The answer is A."]:
        ours = mmmu_gen.extract_choice(response, OPTIONS)
        index2ans = dict(zip(letters, OPTIONS, strict=True))
        assert ours == parse_multi_choice_response(response, letters, index2ans)


def test_open_answers_use_lm_eval_rules() -> None:
    row = {"question_type": "open", "answer": "42", "options": "[]"}
    assert mmmu_gen.score_response(row, "The answer is 42.")[0]
    assert not mmmu_gen.score_response(row, "The answer is 41.")[0]


def test_command_writes_a_valid_record(checkpoint, tmp_path) -> None:
    out = tmp_path / "mmmu_gen.json"
    mmmu_gen.main(
        [
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(out),
            "--source",
            str(FIXTURES),
            "--image-max-pixels",
            str(MAX_PIXELS),
            "--max-new-tokens",
            "3",
            "--subjects",
            "Math",
            "Art",
        ]
    )
    record = json.loads(out.read_text())
    validate_result(record)
    assert record["scale"] == PIPELINE_CHECK and record["benchmark"] == "mmmu_gen"
    assert record["items_scored"] == 8  # 2 subjects x (3 multiple-choice + 1 open)
    assert record["metrics"]["per_question_type"]["open"]["items"] == 2
    preds = record["metrics"]["predictions"]
    assert all(isinstance(p["response"], str) for p in preds)
    mc_unparsed = sum(p["pred"] is None for p in preds)
    assert record["metrics"]["unparsed"] == mc_unparsed
    assert record["metrics"]["accuracy_with_guessing"] >= record["accuracy"]
