"""The shipped task fixtures are what ``python -m experiments.data.task_fixtures`` writes,
in the real formats (cais/mmlu fields; MMMU/MMMU features with decoded images)."""

import json
from pathlib import Path

from datasets import load_dataset

from eval.mmmu_data import REQUIRED_FIELDS, answer_letter, options_of
from experiments.data import task_fixtures as make_fixtures

SHIPPED = Path(__file__).parents[2] / "eval" / "fixtures"


def test_regenerated_fixtures_match_the_shipped_ones(tmp_path) -> None:
    make_fixtures.main(["--out", str(tmp_path)])
    for path in sorted((tmp_path / "mmlu").rglob("*.jsonl")):
        assert path.read_text() == (SHIPPED / path.relative_to(tmp_path)).read_text()
    for path in sorted((tmp_path / "mmmu").rglob("*.parquet")):
        new, old = (
            load_dataset("parquet", data_files=str(p), split="train")
            for p in (path, SHIPPED / path.relative_to(tmp_path))
        )
        assert new.features == old.features
        for column, feature in new.features.items():  # every column, images by pixels
            if type(feature).__name__ == "Image":
                assert [_pixels(im) for im in new[column]] == [
                    _pixels(im) for im in old[column]
                ], f"{path.name} {column}"
            else:
                assert new[column] == old[column], f"{path.name} {column}"


def _pixels(image) -> tuple | None:
    return None if image is None else (image.size, image.mode, image.tobytes())


def test_fixture_rows_have_the_real_fields() -> None:
    for path in (SHIPPED / "mmlu").rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert set(row) == {"question", "subject", "choices", "answer"}
            assert len(row["choices"]) == 4 and row["answer"] in range(4)
    rows = load_dataset(
        "parquet", data_files=str(SHIPPED / "mmmu" / "Math" / "*.parquet"), split="train"
    )
    assert set(REQUIRED_FIELDS) <= set(rows.column_names)
    assert rows.features["image_1"].__class__.__name__ == "Image"
    assert [answer_letter(r) for r in rows] == ["A", "B", "C", None]
    assert [len(options_of(r)) for r in rows] == [4, 3, 5, 0]
