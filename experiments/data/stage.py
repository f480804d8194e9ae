"""Stage every model, dataset and archive the paper grid needs into one site cache.

Compute nodes usually have no internet, and 16 ranks per job calling ``from_pretrained``
or ``load_dataset`` would each hit the hub. This module fetches everything once (on a
login node, or as a local Snakemake rule) into a cache laid out exactly as the hub
stores it::

    <cache>/models/<org>/<name>/...             config, weights, tokenizer, processor
    <cache>/datasets/<org>/<name>/<files>       only the files the allow patterns select
    <cache>/<extract_to>/...                    unpacked URL archives (COCO train2017)
    <cache>/wheels/<file>.whl                   wheels for nodes without internet
    <cache>/STAGED.json                         manifest: what, from where, files, bytes

after which every job runs with ``HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1`` and reads local
paths only. Two sources share every step but the fetch:

- the hub (default): ``huggingface_hub.snapshot_download(..., allow_patterns, local_dir)``
  and the archive's URL;
- a mirror folder (``--mirror``) laid out as ``<mirror>/models/<org>/<name>``,
  ``<mirror>/datasets/<org>/<name>`` and ``<mirror>/urls/<archive file name>`` (what
  ``experiments.rehearsal.hub_mirror`` writes), copied with the *same* allow/ignore
  patterns through the hub client's own matcher, and recorded in the same
  ``.cache/huggingface/`` records that ``snapshot_download(local_dir=...)`` leaves in
  each repository folder (`experiments.data.hub_records`), so a staged folder holds the
  same whatever its source; readers of staged folders skip hidden paths.

Contracts: every dataset allow pattern must match at least one file (a typo or a renamed
hub file fails here, naming the repository and the pattern, not on a compute node);
every model must have its config, weights, tokenizer and image-processor files. A
completed entry leaves a ``.staged.json`` marker and is skipped on the next run (change
its patterns and it is staged again), so staging twice does nothing the second time.

The spec (``stage.spec`` of the workflow config, passed as JSON)::

    models: [Qwen/Qwen3-VL-2B-Instruct, Qwen/Qwen3-VL-8B-Instruct]
    datasets:
      HuggingFaceH4/ultrachat_200k: {allow: ["data/train_sft-*.parquet"]}
      cais/mmlu: {allow: ["*/test-*.parquet", "*/dev-*.parquet"], ignore: ["all/*"]}
    urls:
      coco_train2017: {url: "http://images.cocodataset.org/zips/train2017.zip",
                       extract_to: coco}
    wheels:   # a local path or a URL of each wheel; never from a mirror
      flash_attn: /shared/wheels/flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl

A GPU node without internet installs a staged wheel with ``pip install --no-index
<cache>/wheels/flash_attn-*.whl`` (its requirements, torch and einops, are installed
already).

    python -m experiments.data.stage --cache /site/odb-cache --spec-json "$(cat spec.json)"
    python -m experiments.data.stage --cache /tmp/cache --mirror /tmp/mirror \\
        --spec-json "$(cat spec.json)"
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from experiments.data.hub_records import write_records

MARKER = ".staged.json"
MANIFEST = "STAGED.json"
WHEELS = "wheels"
# What from_pretrained reads from a model repository (README, .gitattributes left out).
MODEL_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja")
MODEL_REQUIRED = ("config.json", "tokenizer_config.json", "preprocessor_config.json")
_HIDDEN = (".cache/", MARKER)  # snapshot_download's metadata folder and our marker
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


# --------------------------------------------------------------------------- fetching


def fetch_from_hub(spec: RepoSpec, dest: Path) -> None:
    """Download ``spec``'s selected files into ``dest`` (the hub's own resumable client)."""
    from huggingface_hub import snapshot_download

    snapshot_download(spec.repo, repo_type=spec.kind, allow_patterns=list(spec.allow),
                      ignore_patterns=list(spec.ignore) or None, local_dir=dest)


def selected(paths: Iterable[str], spec: RepoSpec) -> list[str]:
    """The repository paths ``spec`` selects, by the hub client's own matcher."""
    from huggingface_hub.utils import filter_repo_objects

    return sorted(filter_repo_objects(paths, allow_patterns=list(spec.allow),
                                      ignore_patterns=list(spec.ignore) or None))


def mirror_fetcher(mirror: Path) -> Callable[[RepoSpec, Path], None]:
    """A fetch function copying from ``mirror`` (the hub's layout) what the hub would send."""

    def fetch(spec: RepoSpec, dest: Path) -> None:
        root = mirror / spec.folder
        if not root.is_dir():
            raise FileNotFoundError(f"{spec.repo}: the mirror has no folder {root}; build it "
                                    f"with python -m experiments.rehearsal.hub_mirror")
        tree = _tree(root)
        files = selected(tree, spec)
        for rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest / rel)
        write_records(root, tree, dest, files)

    return fetch


def _tree(root: Path) -> list[str]:
    """Repository-relative paths of the files under ``root`` (no hidden bookkeeping)."""
    paths = (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return [p for p in paths if not p.startswith(_HIDDEN)]


def download_url(url: str, dest: Path) -> None:
    """Stream ``url`` into ``dest`` (via ``dest.part``, renamed when complete)."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url) as response, part.open("wb") as out:
        total, done, step = int(response.headers.get("Content-Length", 0)), 0, 1 << 30
        while chunk := response.read(1 << 22):
            out.write(chunk)
            done += len(chunk)
            if done // step != (done - len(chunk)) // step:
                print(f"[stage]   {dest.name}: {done >> 20} of {total >> 20} MiB", flush=True)
    part.rename(dest)


# --------------------------------------------------------------------------- checks


def check_repo(spec: RepoSpec, dest: Path, origin: str) -> list[str]:
    """The staged files of ``spec`` in ``dest``; raises when a pattern selected nothing
    (datasets) or a file ``from_pretrained`` needs is missing (models)."""
    files = _tree(dest) if dest.is_dir() else []
    if spec.kind == "dataset":
        for pattern in spec.allow:
            one = RepoSpec(spec.repo, spec.kind, (pattern,), spec.ignore)
            if not selected(files, one):
                raise FileNotFoundError(
                    f"{spec.repo}: allow pattern {pattern!r} matched no file in {origin} "
                    f"(ignore patterns {list(spec.ignore)}); fix the pattern in the stage "
                    f"spec")
        return files
    missing = [f for f in MODEL_REQUIRED if f not in files]
    if not any(f.endswith(".safetensors") for f in files):
        missing.append("*.safetensors")
    if missing:
        raise FileNotFoundError(f"{spec.repo}: model files {missing} missing in {origin}; "
                                f"is {spec.repo!r} the right repository id?")
    return files


def _marker(spec: RepoSpec) -> dict:
    return {"repo": spec.repo, "kind": spec.kind, "allow": list(spec.allow),
            "ignore": list(spec.ignore)}


def _is_complete(path: Path, want: dict) -> dict | None:
    """The marker record at ``path`` of an entry staged with ``want``'s settings, or None."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if {k: record.get(k) for k in want} == want else None


def _bytes(root: Path, files: list[str]) -> int:
    return sum((root / f).stat().st_size for f in files)


# --------------------------------------------------------------------------- staging


def stage_repo(spec: RepoSpec, cache: Path, fetch: Callable[[RepoSpec, Path], None],
               origin: str) -> dict:
    """Stage one repository into ``cache/<kind>s/<org>/<name>`` unless already complete;
    returns its manifest entry."""
    dest = cache / spec.folder
    want = _marker(spec)
    done = _is_complete(dest / MARKER, want)
    if done is not None:
        print(f"[stage] {spec.kind} {spec.repo}: complete ({done['files']} files), skipped",
              flush=True)
        return done | {"skipped": True}
    print(f"[stage] {spec.kind} {spec.repo}: fetching {list(spec.allow)} from {origin}",
          flush=True)
    start = time.perf_counter()
    dest.mkdir(parents=True, exist_ok=True)
    fetch(spec, dest)
    files = check_repo(spec, dest, f"{origin}/{spec.folder}")
    record = want | {"from": f"{origin}/{spec.folder}", "path": str(dest), "files": len(files),
                     "bytes": _bytes(dest, files),
                     "seconds": round(time.perf_counter() - start, 2)}
    (dest / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    print(f"[stage] {spec.kind} {spec.repo}: {record['files']} files, "
          f"{record['bytes'] / 2**20:.1f} MiB in {record['seconds']} s", flush=True)
    return record | {"skipped": False}


def extract(archive: Path, dest: Path) -> list[str]:
    """Unpack a zip archive into ``dest``; returns the member files (the archive's own
    top folder is kept: COCO's ``train2017.zip`` unpacks to ``dest/train2017/``)."""
    with zipfile.ZipFile(archive) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        if not names:
            raise ValueError(f"Archive {archive} holds no files; fetch it again")
        zf.extractall(dest)
    return names


def stage_url(spec: UrlSpec, cache: Path, fetch: Callable[[UrlSpec, Path], Path]) -> dict:
    """Fetch one archive and unpack it into ``cache/<extract_to>`` unless already done."""
    dest = cache / spec.extract_to
    marker = dest / f".staged-{spec.name}.json"
    want = {"name": spec.name, "url": spec.url, "extract_to": spec.extract_to}
    done = _is_complete(marker, want)
    if done is not None:
        print(f"[stage] url {spec.name}: complete ({done['files']} files), skipped", flush=True)
        return done | {"skipped": True}
    start = time.perf_counter()
    archive = fetch(spec, cache)
    print(f"[stage] url {spec.name}: unpacking {archive}", flush=True)
    names = extract(archive, dest)
    record = want | {"from": str(archive), "path": str(dest),
                     "files": len(names), "bytes": _bytes(dest, names),
                     "seconds": round(time.perf_counter() - start, 2)}
    marker.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[stage] url {spec.name}: {len(names)} files unpacked into {dest} in "
          f"{record['seconds']} s", flush=True)
    return record | {"skipped": False}


def _check_wheel(path: Path, spec: WheelSpec) -> None:
    """Refuse (and remove) a file that is no wheel, e.g. an error page a URL answered."""
    names = zipfile.ZipFile(path).namelist() if zipfile.is_zipfile(path) else []
    if not any(n.count("/") == 1 and n.endswith(".dist-info/WHEEL") for n in names):
        path.unlink()
        raise ValueError(f"wheel {spec.name}: {spec.source} is not a wheel (no "
                         f"*.dist-info/WHEEL inside); check the path or URL")


def stage_wheel(spec: WheelSpec, cache: Path) -> dict:
    """Copy or download one wheel into ``cache/wheels/`` unless already done; returns its
    manifest entry. Wheels come from their own source, with or without a mirror."""
    dest = cache / WHEELS / spec.file
    marker = cache / WHEELS / f".staged-{spec.name}.json"
    want = {"wheel": spec.name, "source": spec.source}
    done = _is_complete(marker, want)
    if done is not None:
        print(f"[stage] wheel {spec.name}: complete ({spec.file}), skipped", flush=True)
        return done | {"skipped": True}
    start = time.perf_counter()
    if "://" in spec.source:
        print(f"[stage] wheel {spec.name}: downloading {spec.source}", flush=True)
        download_url(spec.source, dest)
    else:
        if not Path(spec.source).is_file():
            raise FileNotFoundError(f"wheel {spec.name}: no file {spec.source}; give the "
                                    f"path (or URL) of the .whl in stage.spec.wheels")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.source, dest)
    _check_wheel(dest, spec)
    record = want | {"path": str(dest), "files": 1, "bytes": dest.stat().st_size,
                     "seconds": round(time.perf_counter() - start, 2)}
    marker.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[stage] wheel {spec.name}: {dest}; install it on a node with pip install "
          f"--no-index {dest}", flush=True)
    return record | {"skipped": False}


def _archive_from_url(spec: UrlSpec, cache: Path) -> Path:
    archive = cache / "downloads" / spec.archive
    if not archive.exists():  # kept after unpacking: a rerun never downloads it again
        print(f"[stage] url {spec.name}: downloading {spec.url}", flush=True)
        download_url(spec.url, archive)
    return archive


def _archive_from_mirror(mirror: Path) -> Callable[[UrlSpec, Path], Path]:
    def fetch(spec: UrlSpec, cache: Path) -> Path:
        archive = mirror / "urls" / spec.archive
        if not archive.is_file():
            raise FileNotFoundError(f"url {spec.name}: the mirror has no {archive}; build it "
                                    f"with python -m experiments.rehearsal.hub_mirror")
        return archive

    return fetch


def stage(spec: StageSpec, cache: Path, mirror: Path | None = None) -> dict:
    """Stage ``spec`` into ``cache`` from the hub, or from ``mirror`` when given; writes
    and returns the manifest ``cache/STAGED.json``.

    Example:
        >>> manifest = stage(StageSpec.from_dict(spec), Path("cache"), Path("mirror"))
        ...                                                           # doctest: +SKIP
        >>> manifest["entries"][0]["files"]  # doctest: +SKIP
        7
    """
    start = time.perf_counter()
    if mirror is None:
        origin, fetch_repo, fetch_url = "https://huggingface.co", fetch_from_hub, _archive_from_url
    else:
        origin = str(mirror.resolve())
        fetch_repo, fetch_url = mirror_fetcher(mirror), _archive_from_mirror(mirror)
    cache.mkdir(parents=True, exist_ok=True)
    entries = [stage_repo(r, cache, fetch_repo, origin) for r in spec.repos]
    entries += [stage_url(u, cache, fetch_url) for u in spec.urls]
    entries += [stage_wheel(w, cache) for w in spec.wheels]
    if all(e["skipped"] for e in entries) and (cache / MANIFEST).exists():
        print(f"[stage] everything was staged already; {cache / MANIFEST} left as it is",
              flush=True)
        return json.loads((cache / MANIFEST).read_text())
    manifest = {"cache": str(cache.resolve()), "source": "hub" if mirror is None else
                str(mirror.resolve()), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "seconds": round(time.perf_counter() - start, 2),
                "files": sum(e["files"] for e in entries),
                "bytes": sum(e["bytes"] for e in entries), "entries": entries}
    (cache / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"[stage] {len(entries)} entries, {manifest['files']} files, "
          f"{manifest['bytes'] / 2**20:.1f} MiB staged in {cache} "
          f"({manifest['seconds']} s); manifest {cache / MANIFEST}", flush=True)
    return manifest


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m experiments.data.stage",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the site cache folder")
    parser.add_argument("--mirror", type=Path, default=None,
                        help="stage from this hub-layout folder instead of the hub")
    parser.add_argument("--spec-json", required=True,
                        help="the stage spec: {models, datasets, urls, wheels} (see the "
                             "module doc)")
    args = parser.parse_args(argv)
    return stage(StageSpec.from_dict(json.loads(args.spec_json)), args.cache, args.mirror)


if __name__ == "__main__":
    main()
