"""The licence and the citation: one licence everywhere, a CITATION.cff GitHub can read.

- LICENSE is the Apache License 2.0, and pyproject.toml and CITATION.cff declare the same
  SPDX identifier, so the wheel's metadata, the repository and the citation agree;
- CITATION.cff is valid against the Citation File Format 1.2.0 schema
  (tests/data/cff-1.2.0.schema.json, the schema published by the citation-file-format
  project, as shipped in cffconvert 2.0.0) and cites the paper as its preferred citation.
"""

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
SPDX = "Apache-2.0"


def _citation() -> dict:
    # CFF dates are YAML dates; the schema wants their ISO string, as cffconvert reads them.
    return json.loads(json.dumps(yaml.safe_load((ROOT / "CITATION.cff").read_text()), default=str))


def test_licence_file_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"], text[:200]


def test_pyproject_and_citation_declare_the_licence() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == SPDX
    assert meta["license-files"] == ["LICENSE"]
    assert _citation()["license"] == SPDX


def test_citation_is_valid_cff_1_2() -> None:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(_citation()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_citation_prefers_the_paper() -> None:
    cited = _citation()["preferred-citation"]
    assert cited["type"] == "article"
    assert cited["title"] == "Online Dynamic Batching with Formal Guarantees for LLM Training"


@pytest.mark.parametrize("broken", [{"cff-version": "9.9"}, {"authors": []}, {"licence": SPDX}])
def test_the_schema_check_catches_a_broken_citation(broken: dict) -> None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    assert list(validator.iter_errors({**_citation(), **broken}))
