"""Staging through the mirror branch: a small hub-layout mirror (`experiments.rehearsal.
hub_mirror`) is staged with the paper's spec by the same code that stages from the hub
(only the fetch differs, a thin `snapshot_download` call), and every staged dataset is
then read offline by the training pipeline and the evaluators' loaders."""

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from eval import mmlu, mmmu_data
from experiments.data.hub_records import HUB_CLIENT_VERSION, write_records
from experiments.data.pipeline import PreprocessedDataset
from experiments.data.records import DataConfig, data_files
from experiments.data.stage import check_repo, stage
from experiments.data.stage_spec import RepoSpec, StageSpec
from experiments.rehearsal.hub_mirror import MMMIX_CONFIGS, build_mirror

RECORDS = 20
# The paper grid's needs: what config/paper.yaml's stage.spec carries.
# The paper workflow's own stage spec: what `snakemake --profile slurm stage` fetches.
PAPER_SPEC = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "config" / "paper.yaml").read_text())["stage"]["spec"]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hub") / "mirror"
    build_mirror(out, records=RECORDS, seed=0)
    return out


@pytest.fixture(scope="module")
def cache(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "cache"
    stage(StageSpec.from_dict(PAPER_SPEC), out, mirror)
    return out


def _files(root: Path) -> set[str]:
    """Data files under ``root``: not our markers, not the hub client's bookkeeping."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".staged") and ".cache" not in
            p.relative_to(root).parts}


def test_mirror_is_laid_out_as_the_hub(mirror: Path) -> None:
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationCastError

    data = mirror / "datasets"
    assert {"train_sft-00000-of-00003.parquet", "test_sft-00000-of-00001.parquet"} <= {
        p.name for p in (data / "HuggingFaceH4/ultrachat_200k/data").iterdir()}
    names = zipfile.ZipFile(mirror / "urls/train2017.zip").namelist()
    assert len(names) == RECORDS and names[0] == "train2017/000000033471.jpg"
    share = load_dataset("parquet", split="train", data_files=str(
        data / "lmms-lab/LLaVA-OneVision-Data/sharegpt4o/*.parquet"))
    assert set(share.column_names) == {"id", "image", "conversations", "data_source"}
    assert type(share.features["image"]).__name__ == "Image"
    assert set(MMMIX_CONFIGS.values()) < {p.name for p in
                                          (data / "lmms-lab/LLaVA-OneVision-Data").iterdir()}
    with pytest.raises(DatasetGenerationCastError, match="same columns"):  # as on the hub
        load_dataset("json", split="train", data_files=sorted(
            str(p) for p in (data / "liuhaotian/LLaVA-Instruct-150K").glob("*.json")))
    with pytest.raises(FileExistsError, match="is not empty"):
        build_mirror(mirror, records=RECORDS, seed=0)


def test_stage_copies_exactly_the_selected_files(cache: Path) -> None:
    data = cache / "datasets"
    assert _files(data / "liuhaotian/LLaVA-Instruct-150K") == {"llava_instruct_150k.json"}
    assert {p.name.split("-")[0] for p in (data / "HuggingFaceH4/ultrachat_200k/data").iterdir()
            } == {"train_sft"}
    mmlu_dirs = {p.name for p in (data / "cais/mmlu").iterdir() if p.is_dir()}
    assert {".cache", "all", "auxiliary_train", "nutrition"} <= mmlu_dirs  # as on the hub
    assert not any(f.startswith("test-") for f in map(lambda p: p.name,
                                                       (data / "MMMU/MMMU").rglob("*")))
    assert len(list((cache / "coco/train2017").glob("*.jpg"))) == RECORDS
    model = cache / "models/Qwen/Qwen3-VL-2B-Instruct"
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= _files(model)
    manifest = json.loads((cache / "STAGED.json").read_text())
    assert manifest["files"] == len(_files(cache)) - 1  # all but the manifest itself
    assert [e["repo"] for e in manifest["entries"][:2]] == PAPER_SPEC["models"]


def test_mirror_staging_leaves_the_hub_clients_records(cache: Path) -> None:
    """Each staged repository holds the ``.cache/huggingface/`` that ``snapshot_download(
    local_dir=...)`` leaves: the repository's tree listing at its commit, and per staged
    file a metadata record (commit, etag, time) and its lock, which the hub client itself
    reads back as up to date; staging's own listing and the manifest skip them."""
    from huggingface_hub._local_folder import read_download_metadata
    from huggingface_hub._tree_cache import read_tree_cache

    manifest = json.loads((cache / "STAGED.json").read_text())
    for entry in (e for e in manifest["entries"] if "repo" in e):
        repo, source = Path(entry["path"]), Path(entry["from"])
        hub = repo / ".cache/huggingface"
        assert (hub / ".gitignore").read_text() == "*"
        assert (hub / "CACHEDIR.TAG").read_text().startswith("Signature: ")
        [listing] = (hub / "trees").iterdir()
        commit = listing.stem
        assert set(read_tree_cache(str(hub), commit)) == _files(source)  # the whole repo
        files = _files(repo)
        assert len(files) == entry["files"] and files <= _files(source)
        assert _files(hub / "download") == {f"{f}.{x}" for f in files for x in ("metadata", "lock")}
        for f in files:
            data = (repo / f).read_bytes()
            etag = (hashlib.sha256(data).hexdigest() if f.endswith((".parquet", ".safetensors"))
                    else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
            record = read_download_metadata(repo, f)
            assert (record.commit_hash, record.etag) == (commit, etag), f
        spec = RepoSpec(entry["repo"], entry["kind"], tuple(entry["allow"]),
                        tuple(entry["ignore"]))
        assert set(check_repo(spec, repo, "staged")) == files


def test_the_hub_client_is_the_version_the_records_track() -> None:
    """The mirror's records go through private writers of huggingface_hub: a new version
    must be checked and pinned (requirements/artifact.txt) before it is used."""
    import huggingface_hub

    pins = (Path(__file__).resolve().parents[2] / "requirements/artifact.txt").read_text()
    assert f"huggingface_hub=={HUB_CLIENT_VERSION}" in pins.splitlines()
    assert huggingface_hub.__version__ == HUB_CLIENT_VERSION


def test_another_hub_client_version_is_refused(monkeypatch, tmp_path: Path) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "__version__", "9.9.9")
    with pytest.raises(RuntimeError, match=rf"as of version {HUB_CLIENT_VERSION}, but 9.9.9 "
                                           r"is installed; install requirements/artifact"):
        write_records(tmp_path, [], tmp_path, [])
    assert not (tmp_path / ".cache").exists()


def test_staging_twice_does_nothing(cache: Path, mirror: Path, capsys) -> None:
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    first = json.loads((cache / "STAGED.json").read_text())
    assert stage(StageSpec.from_dict(PAPER_SPEC), cache, mirror) == first
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == before
    out = capsys.readouterr().out
    assert out.count("skipped") == len(first["entries"]) == 8
    assert "everything was staged already" in out


def test_a_pattern_that_matches_nothing_names_the_repo_and_pattern(mirror, tmp_path) -> None:
    spec = StageSpec.from_dict({"datasets": {"lmms-lab/LLaVA-OneVision-Data": {
        "allow": ["sharegpt4o/*.parquet", "sharegpt-4o/*.parquet"]}}})
    with pytest.raises(FileNotFoundError,
                       match=r"lmms-lab/LLaVA-OneVision-Data: allow pattern 'sharegpt-4o/\*"):
        stage(spec, tmp_path / "cache", mirror)
    assert not (tmp_path / "cache/STAGED.json").exists()
    with pytest.raises(FileNotFoundError, match="the mirror has no folder"):
        stage(StageSpec.from_dict({"models": ["Qwen/Qwen3-VL-4B"]}), tmp_path / "c", mirror)
    broken = tmp_path / "broken"
    shutil.copytree(mirror / "models/Qwen/Qwen3-VL-2B-Instruct",
                    broken / "models/Qwen/Qwen3-VL-2B-Instruct", ignore=shutil.ignore_patterns(
                        "*.safetensors"))
    with pytest.raises(FileNotFoundError, match=r"Qwen3-VL-2B-Instruct: model files "
                                                r"\['\*.safetensors'\] missing"):
        stage(StageSpec.from_dict({"models": ["Qwen/Qwen3-VL-2B-Instruct"]}), tmp_path / "d",
              broken)


def test_spec_errors() -> None:
    with pytest.raises(ValueError, match=r"Unknown stage spec key\(s\) \['dataset'\]"):
        StageSpec.from_dict({"dataset": {}})
    with pytest.raises(ValueError, match="unknown key"):
        StageSpec.from_dict({"datasets": {"cais/mmlu": {"patterns": ["*"]}}})
    with pytest.raises(ValueError, match="'<org>/<name>'"):
        StageSpec.from_dict({"models": ["Qwen3-VL-2B"]})
    with pytest.raises(ValueError, match="only .zip"):
        StageSpec.from_dict({"urls": {"x": {"url": "http://h/x.tar", "extract_to": "x"}}})


def _wheel(folder: Path, name: str = "flash_attn-0.0.1-py3-none-any.whl") -> Path:
    """A minimal pure-Python wheel of ``flash_attn``, laid out as pip installs wheels."""
    info = "flash_attn-0.0.1.dist-info"
    files = {"flash_attn/__init__.py": "__version__ = '0.0.1'\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: flash_attn\nVersion: 0.0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as zf:
        for member, text in files.items():
            zf.writestr(member, text)
    return folder / name


def test_a_wheel_is_staged_for_nodes_without_internet(tmp_path: Path) -> None:
    """A local wheel and a URL of one are copied into ``<cache>/wheels/``, recorded in
    the manifest, skipped the second time, and pip installs the staged file offline as
    docs/workflow.md says (``pip install --no-index <cache>/wheels/flash_attn-*.whl``)."""
    wheel = _wheel(tmp_path / "built")
    cache = tmp_path / "cache"
    spec = StageSpec.from_dict({"wheels": {"flash-attn": str(wheel)}})
    manifest = stage(spec, cache)
    staged = cache / "wheels" / wheel.name
    assert staged.read_bytes() == wheel.read_bytes()
    [entry] = manifest["entries"]
    assert (entry["wheel"], entry["source"], entry["path"], entry["files"], entry["bytes"]) == (
        "flash-attn", str(wheel), str(staged), 1, wheel.stat().st_size)
    assert stage(spec, cache) == manifest
    from_url = stage(StageSpec.from_dict({"wheels": {"flash_attn": wheel.as_uri()}}),
                     tmp_path / "cache2")
    assert Path(from_url["entries"][0]["path"]).read_bytes() == wheel.read_bytes()
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index",
                    "--disable-pip-version-check", "--target", str(site),
                    *map(str, (cache / "wheels").glob("flash_attn-*.whl"))],
                   check=True, capture_output=True)
    assert (site / "flash_attn/__init__.py").read_text() == "__version__ = '0.0.1'\n"


def test_a_bad_wheel_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'flash.tar.gz' is not a wheel file"):
        StageSpec.from_dict({"wheels": {"flash_attn": "flash.tar.gz"}})
    with pytest.raises(ValueError, match=r"torch-2.13.0-cp311-cp311-linux_x86_64.whl is a "
                                         r"wheel of 'torch'"):
        StageSpec.from_dict({"wheels": {"flash_attn": "torch-2.13.0-cp311-cp311-linux_x86_64.whl"}})
    missing = tmp_path / "flash_attn-0.0.1-py3-none-any.whl"
    with pytest.raises(FileNotFoundError, match="wheel flash_attn: no file"):
        stage(StageSpec.from_dict({"wheels": {"flash_attn": str(missing)}}), tmp_path / "c")
    missing.write_text("<html>404</html>")  # what a wrong URL answers
    with pytest.raises(ValueError, match=r"is not a wheel \(no \*.dist-info/WHEEL"):
        stage(StageSpec.from_dict({"wheels": {"flash_attn": str(missing)}}), tmp_path / "c")
    assert not list((tmp_path / "c/wheels").glob("*.whl"))  # never left for pip to find


def staged_config(cache: Path, name: str) -> DataConfig:
    """The ``DataConfig`` of each staged training dataset (as the workflow sets it)."""
    data, processor = cache / "datasets", str(cache / "models/Qwen/Qwen3-VL-2B-Instruct")
    onevision = data / "lmms-lab/LLaVA-OneVision-Data"
    return {
        "ultrachat": DataConfig("ultrachat", str(
            data / "HuggingFaceH4/ultrachat_200k/data/train_sft-*.parquet"), processor),
        "llava": DataConfig("llava", str(data / "liuhaotian/LLaVA-Instruct-150K/"
                                                "llava_instruct_150k.json"), processor,
                            image_dir=str(cache / "coco/train2017")),
        "sharegpt4o": DataConfig("sharegpt4o", str(onevision / "sharegpt4o"), processor),
        "iiit5k": DataConfig("sharegpt4o", str(onevision / "iiit5k"), processor),
    }[name]


@pytest.mark.parametrize("name", ["ultrachat", "llava", "sharegpt4o", "iiit5k"])
def test_staged_datasets_load_offline(cache: Path, name: str) -> None:
    ds = PreprocessedDataset(staged_config(cache, name))
    sample = ds[0]
    assert len(sample["input_ids"]) == ds.length(0)
    assert ("pixel_values" in sample) == (name != "ultrachat")
    if name == "ultrachat":
        assert len(ds) == RECORDS  # train_sft only: the test_sft shard was never staged


def test_a_staged_repository_folder_reads_its_data_files_only(cache: Path) -> None:
    """A repository folder as the source: its ``.staged.json`` marker and the hub
    client's ``.cache/`` are not data (a folder source once read the marker as json)."""
    repo = cache / "datasets/liuhaotian/LLaVA-Instruct-150K"
    processor = str(cache / "models/Qwen/Qwen3-VL-2B-Instruct")
    assert {".staged.json", ".cache"} <= {p.name for p in repo.iterdir()}
    data = [str(repo / "llava_instruct_150k.json")]
    assert data_files(DataConfig("llava", str(repo), processor)) == data
    assert data_files(DataConfig("llava", str(repo / "*"), processor)) == data


def test_a_glob_source_that_matches_nothing_fails(cache: Path) -> None:
    cfg = DataConfig("ultrachat", str(cache / "datasets/x/data/train_sft-*.parquet"),
                     str(cache / "models/Qwen/Qwen3-VL-2B-Instruct"))
    with pytest.raises(FileNotFoundError, match="No files match the source pattern"):
        PreprocessedDataset(cfg)


def test_evaluators_read_the_staged_mmlu_and_mmmu(cache: Path, tmp_path: Path) -> None:
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    tasks = mmlu.write_local_tasks(cache / "datasets/cais/mmlu", tmp_path)
    task = yaml.safe_load((tasks / "mmlu_local_nutrition.yaml").read_text())
    assert task["dataset_path"] == "parquet"
    rows = load_dataset("parquet", **task["dataset_kwargs"])
    assert (len(rows["test"]), len(rows["dev"])) == (3, 5)
    assert rows["test"].features["answer"].names == ["A", "B", "C", "D"]
    source = str(cache / "datasets/MMMU/MMMU")
    assert mmmu_data.local_subjects(source) == ("Art", "Accounting", "Math", "Computer_Science")
    row = mmmu_data.load_subject(source, "Math", "dev")[1]
    model = cache / "models/Qwen/Qwen3-VL-2B-Instruct"
    inputs = mmmu_data.mc_inputs(AutoTokenizer.from_pretrained(model),
                                 Qwen2VLImageProcessorPil.from_pretrained(model), row)
    assert inputs["image_grid_thw"].shape[0] == 2 and inputs["input_ids"].shape[0] == 1

