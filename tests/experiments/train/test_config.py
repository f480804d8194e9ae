"""The train config: every shipped layer loads; bad keys and values are named."""

import re
from pathlib import Path

import pytest

from experiments.train.config import TrainConfig
from experiments.train.config_build import ConfigError
from experiments.train.config_files import load_config, parse_override
from tests.experiments.train.conftest import CONFIGS

QUICK = CONFIGS / "cpu_quick.yaml"
LAYERS = sorted(p for p in CONFIGS.rglob("*.yaml") if p != QUICK)


def test_quick_config_loads() -> None:
    cfg = load_config([QUICK])
    assert (cfg.method.name, cfg.mode, cfg.strategy.name) == ("odb", "full", "ddp")
    assert cfg.data.holdout_samples == 32 and cfg.optim.lr == 1e-3


@pytest.mark.parametrize("layer", LAYERS, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_shipped_layer_composes_with_the_quick_config(layer: Path) -> None:
    cfg = load_config([QUICK, layer])
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # round trip through plain data


def test_overrides_win_and_are_typed() -> None:
    cfg = load_config([QUICK], ["method.name=standard", "optim.lr=2e-5", "optim.betas=[0.9, 0.95]",
                                "method.num_workers=3", "method.baseline.batch_size=4"])
    assert cfg.method.name == "standard" and cfg.optim.lr == 2e-5
    assert cfg.optim.betas == (0.9, 0.95) and cfg.method.num_workers == 3
    options = cfg.method.loader_options(2, 7, 1024)
    assert options == {"batch_size": 4, "num_workers": 3, "grad_accum_steps": 2, "seed": 7,
                       "cutoff_len": 1024}
    assert parse_override("a.b=true") == {"a": {"b": True}}


@pytest.mark.parametrize(("override", "message"), [
    ("method.nam=odb", "unknown key 'method.nam'"),
    ("methods.name=odb", "unknown key 'methods'"),
    ("method.name=fancy", r"method.name='fancy' is not allowed; choose one of"),
    ("optim.epochs=two", "optim.epochs must be an integer"),
    ("optim.lr=fast", "optim.lr must be a number"),
    ("optim.lr=0", "optim.lr must be > 0"),
    ("method.token_budget=0", "method.token_budget must be >= 1"),
    ("data.dataset=coco", r"data.dataset='coco' is not allowed"),
    ("data.cutoff_len=8", "data: cutoff_len must be >= 16"),
    ("method.odb.seed=3", "method.odb.seed is set by run.seed"),
    ("method.baseline.cutoff_len=3", "method.baseline.cutoff_len is set by data.cutoff_len"),
    ("method.baseline.batch_size=2", "batch_size means nothing to odb"),
    ("method.odb.polcy=paper", "unknown key 'method.odb.polcy'; ODBConfig fields"),
    ("method.odb.window_budgets=32",
     r"method.odb.window_budgets was renamed method.odb.buffer_budgets \(the grouping buffer"),
    ("strategy.zero_stage=3", "strategy.zero_stage must be 0, 1 or 2"),
    ("model.init=random", "model.init=random needs model.architecture"),
    ("data.holdout_samples=0", "validation.enabled needs a held-out split"),
    ("lora.target_modules=[]", "lora.target_modules must name at least one"),
    ("broken", "must look like section.key=value"),
])
def test_bad_config_names_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config([QUICK], [override])


def test_the_former_engine_section_is_refused_naming_strategy(tmp_path: Path) -> None:
    """``engine`` was renamed ``strategy``: a layer, an override or a mapping that still
    uses it fails, naming the new section; it is never read as an alias."""
    renamed = r"^engine was renamed strategy \(how the model trains across processes"
    with pytest.raises(ConfigError, match=renamed + r".*write strategy.zero_stage=1 instead "
                       r"of engine.zero_stage=1$"):
        load_config([QUICK], ["engine.zero_stage=1"])
    layer = tmp_path / "old.yaml"
    layer.write_text("engine:\n  name: deepspeed\n")
    with pytest.raises(ConfigError, match=renamed + r".*rename the section 'engine:' of "
                       rf"{re.escape(str(layer.resolve()))} to 'strategy:'$"):
        load_config([QUICK, layer])
    data = {**load_config([QUICK]).to_dict(), "engine": {"name": "ddp"}}
    with pytest.raises(ConfigError, match=renamed + ".*rename the key 'engine' to 'strategy'$"):
        TrainConfig.from_dict(data)
    assert TrainConfig.RENAMED_SECTIONS["engine"][0] == "strategy"


def test_packing_refuses_multimodal_data() -> None:
    with pytest.raises(ConfigError, match="packing is text-only"):
        load_config([QUICK], ["method.name=packing", "data.dataset=llava"])


def test_missing_required_key_and_include_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("include: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("include: [a.yaml]\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_config([tmp_path / "a.yaml"])
    (tmp_path / "c.yaml").write_text("model: {path: m}\n")
    with pytest.raises(ConfigError, match="missing key 'run'"):
        load_config([tmp_path / "c.yaml"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config([tmp_path / "nope.yaml"])


def test_preflight_takes_a_glob_over_staged_shards(tmp_path: Path) -> None:
    """A staged hub dataset is a glob over its shards (config/paper.yaml); the preflight
    took it for a missing file and stopped every staged run (found by the rehearsal)."""
    from experiments.train.run import preflight

    shards = tmp_path / "datasets/HuggingFaceH4/ultrachat_200k/data"
    shards.mkdir(parents=True)
    (shards / "train_sft-00000-of-00002.parquet").write_bytes(b"")
    overrides = [f"data.source={shards}/train_sft-*.parquet", f"data.processor={tmp_path}",
                 f"model.path={tmp_path}", "run.out_dir=x"]
    preflight(load_config([QUICK], overrides))
    missing = [f"data.source={shards}/test_sft-*.parquet", *overrides[1:]]
    with pytest.raises(ConfigError, match="test_sft-\\*.parquet does not exist"):
        preflight(load_config([QUICK], missing))


def test_the_former_train_section_is_refused_naming_optim() -> None:
    """The optimiser section was ``train`` (a word that also names the package, the whole
    run and the workflow's section): an override or a mapping that still uses it fails,
    naming ``optim``."""
    renamed = r"^train was renamed optim \(the optimiser and its schedule"
    with pytest.raises(ConfigError, match=renamed + r".*write optim.lr=1 instead of train.lr=1$"):
        load_config([QUICK], ["train.lr=1"])
    data = {**load_config([QUICK]).to_dict(), "train": {"lr": 1.0}}
    with pytest.raises(ConfigError, match=renamed + ".*rename the key 'train' to 'optim'$"):
        TrainConfig.from_dict(data)


def test_a_checkpoint_saved_before_the_rename_still_resumes(tmp_path: Path) -> None:
    """A checkpoint's config from before ``train`` became ``optim`` is read as ``optim``:
    the same settings resume, a different accumulation is refused by its new name."""
    from experiments.train.resume import check_resumable

    cfg = load_config([QUICK])
    saved = cfg.to_dict()
    saved["train"] = saved.pop("optim")
    check_resumable(saved, cfg, tmp_path)
    saved["train"] = {**saved["train"], "grad_accum_steps": cfg.optim.grad_accum_steps + 1}
    with pytest.raises(ConfigError, match="made with optim.grad_accum_steps="):
        check_resumable(saved, cfg, tmp_path)
