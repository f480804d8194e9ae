"""Fetching what a spec names: from the hub, from a mirror folder, or from a URL.

The two sources share every step but the fetch: a mirror is copied with the *same*
allow/ignore patterns through the hub client's own matcher and gets the same
``.cache/huggingface/`` records that ``snapshot_download(local_dir=...)`` leaves, so a
staged folder holds the same whatever its source.
"""

from __future__ import annotations

import shutil
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from experiments.data.hub_records import write_records
from experiments.data.stage_spec import RepoSpec, UrlSpec

MARKER = ".staged.json"  # left by a completed entry
_HIDDEN = (".cache/", MARKER)  # snapshot_download's metadata folder and our marker


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
        tree = tree_files(root)
        files = selected(tree, spec)
        for rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, dest / rel)
        write_records(root, tree, dest, files)

    return fetch


def tree_files(root: Path) -> list[str]:
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


def extract(archive: Path, dest: Path) -> list[str]:
    """Unpack a zip archive into ``dest``; returns the member files (the archive's own
    top folder is kept: COCO's ``train2017.zip`` unpacks to ``dest/train2017/``)."""
    with zipfile.ZipFile(archive) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        if not names:
            raise ValueError(f"Archive {archive} holds no files; fetch it again")
        zf.extractall(dest)
    return names


def archive_from_url(spec: UrlSpec, cache: Path) -> Path:
    """Download ``spec``'s archive into the cache (once); its path."""
    archive = cache / "downloads" / spec.archive
    if not archive.exists():  # kept after unpacking: a rerun never downloads it again
        print(f"[stage] url {spec.name}: downloading {spec.url}", flush=True)
        download_url(spec.url, archive)
    return archive


def archive_from_mirror(mirror: Path) -> Callable[[UrlSpec, Path], Path]:
    """A fetch that takes each archive from ``<mirror>/urls/``."""
    def fetch(spec: UrlSpec, cache: Path) -> Path:
        archive = mirror / "urls" / spec.archive
        if not archive.is_file():
            raise FileNotFoundError(f"url {spec.name}: the mirror has no {archive}; build it "
                                    f"with python -m experiments.rehearsal.hub_mirror")
        return archive

    return fetch
