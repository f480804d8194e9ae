"""MMMU-MC: the command on full and LoRA checkpoints, a rigged model, a hand-computed score."""

import json
from pathlib import Path

import pytest
import torch

from eval import mmmu_data, mmmu_mc
from eval.checkpoint import load_checkpoint
from eval.config import MMMUConfig
from eval.results import PIPELINE_CHECK, validate_result
from tests.eval.conftest import MAX_PIXELS

FIXTURES = Path(__file__).parents[2] / "eval" / "fixtures" / "mmmu"
BUDGET = ["--image-max-pixels", str(MAX_PIXELS), "--image-min-pixels", str(64 * 32 * 32)]


def _config(out: Path, checkpoint: Path) -> MMMUConfig:
    return MMMUConfig(str(checkpoint), str(out), source=str(FIXTURES), image_max_pixels=MAX_PIXELS)


def test_command_writes_a_valid_record(checkpoint, tmp_path) -> None:
    out = tmp_path / "mmmu_mc.json"
    mmmu_mc.main(
        ["--checkpoint", str(checkpoint), "--out", str(out), "--source", str(FIXTURES), *BUDGET]
    )
    record = json.loads(out.read_text())
    validate_result(record)
    assert record["scale"] == PIPELINE_CHECK and record["checkpoint"]["run_id"]
    # 4 subjects x (3 letter rows + 1 open row, excluded and counted)
    assert (record["items_scored"], record["items_excluded"]) == (12, 4)
    assert set(record["per_category"]) == {
        "Art and Design",
        "Business",
        "Science",
        "Tech and Engineering",
    }


def test_rigged_model_scores_its_letter_only(full_checkpoint, tmp_path) -> None:
    model, tok, ip, meta = load_checkpoint(full_checkpoint)
    b = mmmu_mc.letter_token_ids(tok)["B"]

    def favour_b(module, args, output):  # next-token logits rigged towards "B"
        output[..., b] += 100.0
        return output

    model.lm_head.register_forward_hook(favour_b)
    record = mmmu_mc.run(_config(tmp_path / "r.json", full_checkpoint), (model, tok, ip, meta))
    preds = record["metrics"]["predictions"]
    assert {p["pred"] for p in preds} == {"B"}
    keyed_b = [p for p in preds if p["answer"] == "B"]
    assert len(keyed_b) == 4 and len(preds) == 12
    assert record["accuracy"] == pytest.approx(4 / 12)
    for subject in record["metrics"]["per_subject"].values():
        assert subject == {"accuracy": pytest.approx(1 / 3), "items": 3}


def test_hand_computed_log_likelihood(full_checkpoint, tmp_path) -> None:
    model, tok, ip, meta = load_checkpoint(full_checkpoint)
    cfg = _config(tmp_path / "h.json", full_checkpoint)
    record = mmmu_mc.run(cfg, (model, tok, ip, meta))
    item = record["metrics"]["predictions"][1]  # two images
    row = next(r for _, r in mmmu_data.iter_rows(cfg) if r["id"] == item["id"])
    assert len(mmmu_data.row_images(row)) == 2
    inputs = mmmu_data.mc_inputs(tok, ip, row)
    with torch.no_grad():  # by hand: last hidden state . lm_head rows, log-sum-exp in float64
        hidden = model.model(**inputs).last_hidden_state[0, -1].double()
        logits = model.lm_head.weight.double() @ hidden
    for letter, score in item["logprobs"].items():
        token = tok(letter, add_special_tokens=False)["input_ids"][0]
        expected = float(logits[token] - torch.logsumexp(logits, 0))
        assert score == pytest.approx(expected, abs=1e-6)
    assert item["pred"] == max(item["logprobs"], key=item["logprobs"].get)


def test_missing_fields_and_files_fail_clearly(tmp_path) -> None:
    from datasets import Dataset

    bad = tmp_path / "mmmu" / "Art"
    bad.mkdir(parents=True)
    Dataset.from_dict({"id": ["x"], "question": ["q"]}).to_parquet(
        str(bad / "validation-00000-of-00001.parquet")
    )
    with pytest.raises(ValueError, match=r"lack field\(s\) \['options', 'answer'"):
        mmmu_data.load_subject(str(tmp_path / "mmmu"), "Art", "validation")
    with pytest.raises(FileNotFoundError, match="No validation-\\*.parquet for subject Math"):
        mmmu_data.load_subject(str(tmp_path / "mmmu"), "Math", "validation")
    with pytest.raises(ValueError, match="subject must be one of"):
        MMMUConfig("c", "o.json", subjects=("Astrology",))
