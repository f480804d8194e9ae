"""What to stage: the models, dataset files, URL archives and wheels of one spec, validated.

``StageSpec.from_dict`` reads ``stage.spec`` of the workflow config (see
`experiments.data.stage` for its layout); every entry is checked on construction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# What from_pretrained reads from a model repository (README, .gitattributes left out).
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja")
RepoKind = Literal["model", "dataset"]


@dataclass(frozen=True)
class RepoSpec:
    """One hub repository to stage: its id, kind and file patterns (hub syntax:
    ``fnmatch`` on the path inside the repository)."""

    repo: str
    kind: RepoKind
    allow: tuple[str, ...]
    ignore: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in RepoKind.__args__:
            raise ValueError(f"kind must be one of {RepoKind.__args__}, got {self.kind!r}")
        if self.repo.count("/") != 1 or not all(self.repo.split("/")):
            raise ValueError(f"Repository ids are '<org>/<name>', got {self.repo!r}")
        if not self.allow:
            raise ValueError(f"{self.repo}: give at least one allow pattern")

    @property
    def folder(self) -> str:
        """Where it lives, in the cache and in a mirror: ``models/<org>/<name>`` etc."""
        return f"{self.kind}s/{self.repo}"


@dataclass(frozen=True)
class UrlSpec:
    """One archive to download and unpack into ``<cache>/<extract_to>``."""

    name: str
    url: str
    extract_to: str

    def __post_init__(self) -> None:
        if not self.url.endswith(".zip"):
            raise ValueError(f"url {self.name}: only .zip archives are supported, got "
                             f"{self.url!r}")
        if Path(self.extract_to).is_absolute() or ".." in Path(self.extract_to).parts:
            raise ValueError(f"url {self.name}: extract_to must be a folder inside the "
                             f"cache, got {self.extract_to!r}")

    @property
    def archive(self) -> str:
        """The archive's file name (``train2017.zip``), as kept in a mirror's ``urls/``."""
        return self.url.rsplit("/", 1)[-1]


def _dist(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427: ``flash_attn``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass(frozen=True)
class WheelSpec:
    """One wheel to copy into ``<cache>/wheels/``: ``source`` is a local path or a URL of
    a ``.whl`` file of the distribution ``name`` (e.g. flash-attn built for the nodes'
    CUDA, torch and Python)."""

    name: str
    source: str

    def __post_init__(self) -> None:
        parts = self.file.removesuffix(".whl").split("-")
        if not self.file.endswith(".whl") or len(parts) not in (5, 6):
            raise ValueError(f"wheel {self.name}: {self.source!r} is not a wheel file "
                             f"(<dist>-<version>-<python>-<abi>-<platform>.whl)")
        if _dist(parts[0]) != _dist(self.name):
            raise ValueError(f"wheel {self.name}: {self.file} is a wheel of {parts[0]!r}; "
                             f"name the entry after its distribution or fix the source")

    @property
    def file(self) -> str:
        """The wheel's file name, as kept in ``<cache>/wheels/``."""
        return self.source.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class StageSpec:
    """Everything to stage. Build it from the workflow config with `from_dict`.

    Example:
        >>> spec = StageSpec.from_dict({"models": ["Qwen/Qwen3-VL-2B-Instruct"],
        ...     "datasets": {"cais/mmlu": {"allow": ["*/test-*.parquet"]}}})
        >>> [r.folder for r in spec.repos]
        ['models/Qwen/Qwen3-VL-2B-Instruct', 'datasets/cais/mmlu']
    """

    repos: tuple[RepoSpec, ...]
    urls: tuple[UrlSpec, ...] = field(default=())
    wheels: tuple[WheelSpec, ...] = field(default=())

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> StageSpec:
        """Parse ``{models: [ids], datasets: {id: {allow, ignore}}, urls: {name: {url,
        extract_to}}, wheels: {name: path or URL}}``; unknown keys raise (so a misspelt
        key is never ignored)."""
        unknown = set(spec) - {"models", "datasets", "urls", "wheels"}
        if unknown:
            raise ValueError(f"Unknown stage spec key(s) {sorted(unknown)}; the spec has "
                             f"models, datasets, urls and wheels")
        repos = [RepoSpec(m, "model", MODEL_PATTERNS) for m in spec.get("models", [])]
        for repo, entry in spec.get("datasets", {}).items():
            extra = set(entry) - {"allow", "ignore"}
            if extra:
                raise ValueError(f"dataset {repo}: unknown key(s) {sorted(extra)}; give "
                                 f"allow (and optionally ignore) pattern lists")
            repos.append(RepoSpec(repo, "dataset", tuple(entry.get("allow", ())),
                                  tuple(entry.get("ignore", ()))))
        for name, entry in spec.get("urls", {}).items():
            if set(entry) != {"url", "extract_to"}:
                raise ValueError(f"url {name}: give exactly url and extract_to, got "
                                 f"{sorted(entry)}")
        urls = [UrlSpec(name, **entry) for name, entry in spec.get("urls", {}).items()]
        wheels = [WheelSpec(name, str(source))
                  for name, source in spec.get("wheels", {}).items()]
        return cls(tuple(repos), tuple(urls), tuple(wheels))
