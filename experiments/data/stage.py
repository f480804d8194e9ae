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
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from experiments.data.stage_fetch import (
    MARKER,
    archive_from_mirror,
    archive_from_url,
    download_url,
    extract,
    fetch_from_hub,
    mirror_fetcher,
    selected,
    tree_files,
)
from experiments.data.stage_spec import RepoSpec, StageSpec, UrlSpec, WheelSpec

MANIFEST = "STAGED.json"
WHEELS = "wheels"
MODEL_REQUIRED = ("config.json", "tokenizer_config.json", "preprocessor_config.json")


# --------------------------------------------------------------------------- checks


def check_repo(spec: RepoSpec, dest: Path, origin: str) -> list[str]:
    """The staged files of ``spec`` in ``dest``; raises when a pattern selected nothing
    (datasets) or a file ``from_pretrained`` needs is missing (models)."""
    files = tree_files(dest) if dest.is_dir() else []
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
        origin, fetch_repo, fetch_url = "https://huggingface.co", fetch_from_hub, archive_from_url
    else:
        origin = str(mirror.resolve())
        fetch_repo, fetch_url = mirror_fetcher(mirror), archive_from_mirror(mirror)
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
