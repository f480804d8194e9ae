"""The grid's data variants and where every input lives: proxies, the site cache, staged models.

A variant is what a cell trains on (a dataset schema, a source, the settings that change
lengths), so one length cache serves every cell of a variant. On the CPU path sources are
the generated proxies; at paper scale they are files in the site cache (``stage.cache``)
or folders a builder rule writes, and a model or dataset the stage spec omits is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DataVariant:
    """What a cell trains on: a dataset schema, a source and the settings that change
    lengths (so one length cache serves every cell of a variant)."""

    key: str
    dataset: str
    source: str
    image_max_pixels: int
    aug: tuple[float, float] = (1.0, 1.0)
    extra: tuple[tuple[str, str], ...] = ()  # DataConfig fields beyond these (image_dir)
    tags: tuple[tuple[str, float], ...] = ()  # e.g. leverage cv and short fraction

    @property
    def augmented(self) -> bool:
        """Whether images are randomly rescaled (a scale range other than 1.0 to 1.0)."""
        return self.aug != (1.0, 1.0)


def processor(config: Mapping[str, Any]) -> str:
    """The tokenizer + image processor: the local tiny one on proxies, else the model's."""
    if config["data"]["source"] == "proxies":
        return "results/data/assets/processor"
    return staged_model(config, config["model"]["processor"])


def stage_cache(config: Mapping[str, Any]) -> str:
    """The site cache every paper-scale job reads (``stage.cache``)."""
    if "stage" not in config:
        raise ValueError("data.source=staged needs a `stage` section naming the site cache "
                         "(stage.cache) and what to stage into it; see config/paper.yaml")
    return str(config["stage"]["cache"]).rstrip("/")


def staged_model(config: Mapping[str, Any], repo: str) -> str:
    """Where a model repository lives once staged; refuses one the stage spec omits."""
    if repo not in config["stage"]["spec"].get("models", []):
        raise ValueError(f"model {repo} is not staged: add it to stage.spec.models in the "
                         "workflow config")
    return f"{stage_cache(config)}/models/{repo}"


def staged(config: Mapping[str, Any], text: str) -> str:
    """``text`` with ``{cache}`` replaced by the site cache (when there is one)."""
    return text.replace("{cache}", stage_cache(config)) if "{cache}" in text else text


def _staged_source(config: Mapping[str, Any], name: str, spec: Mapping[str, Any]) -> str:
    """A dataset's files in the site cache, or the folder its builder rule writes."""
    if spec.get("build"):
        return str(spec["build"])
    repos = config["stage"]["spec"].get("datasets", {})
    if spec.get("hub") not in repos or not spec.get("files"):
        raise ValueError(f"data.datasets.{name}: a staged dataset needs `hub` (a repository "
                         "listed in stage.spec.datasets) and `files` (its pattern inside it), "
                         "or `build` (the folder a rule makes)")
    return f"{stage_cache(config)}/datasets/{spec['hub']}/{spec['files']}"


def _source(config: Mapping[str, Any], name: str, spec: Mapping[str, Any]) -> str:
    if config["data"]["source"] == "proxies":
        return f"results/data/proxies/{name}"
    return _staged_source(config, name, spec)


def _extra(config: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The image folder of a staged dataset (relative paths are inside the site cache)."""
    if config["data"]["source"] == "proxies" or not spec.get("image_dir"):
        return ()
    folder = str(spec["image_dir"])
    if not folder.startswith("/"):
        folder = f"{stage_cache(config)}/{folder}"
    return (("image_dir", folder),)


def variants(config: Mapping[str, Any]) -> dict[str, DataVariant]:
    """Every data variant of the config: its datasets, the staleness ablation's augmented
    copies and the leverage mixes."""
    out = {}
    for name, spec in config["data"]["datasets"].items():
        out[name] = DataVariant(
            name,
            name,
            _source(config, name, spec),
            int(spec["image_max_pixels"]),
            extra=_extra(config, spec),
        )
    stale = config["ablations"]["staleness"]
    for name in stale["datasets"]:
        base = out[name]
        key = f"{name}-aug{stale['aug'][0]}-{stale['aug'][1]}"
        # its own record count: stale-cache violations are rare events, an epoch needs more
        records = (("max_samples", int(stale["max_samples"])),) if stale.get("max_samples") else ()
        out[key] = DataVariant(
            key,
            base.dataset,
            base.source,
            base.image_max_pixels,
            (float(stale["aug"][0]), float(stale["aug"][1])),
            base.extra + records,
        )
    lev = config["ablations"]["leverage"]
    mmmix = config["data"]["datasets"]["mmmix"]
    for cv, fs in itertools.product(lev["cvs"], lev["short_fractions"]):
        key = leverage_name(cv, fs)
        out[key] = DataVariant(
            key,
            "mmmix",
            f"results/data/leverage/{key}",
            int(mmmix["image_max_pixels"]),
            tags=(("cv", float(cv)), ("short_fraction", float(fs))),
        )
    return out


def leverage_name(cv: float, fs: float) -> str:
    """The folder ``experiments.data.proxies`` writes a leverage mix to."""
    return f"leverage_cv{cv:.2f}_fs{fs:.2f}"
