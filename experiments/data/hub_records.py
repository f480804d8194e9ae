"""The records ``snapshot_download(local_dir=...)`` leaves in a repository folder, written
for files that came from a hub-layout mirror instead of the hub.

huggingface_hub keeps, in ``<local_dir>/.cache/huggingface/``, a ``.gitignore`` (``*``),
a ``CACHEDIR.TAG``, the repository's tree listing at the commit it downloaded
(``trees/<commit>.json``) and, per downloaded file, ``download/<path>.metadata`` (commit,
etag, time) with its ``.lock``. A staged folder must hold the same whatever its source,
so that what reads it meets, in the rehearsal, what it meets on a cluster.

No public API writes these records, so this module calls the hub client's own private
writers, and only at `HUB_CLIENT_VERSION` (requirements/artifact.txt pins it; another
version is refused, naming what to check). A mirror has no git: a file's blob id is the
git blob hash of its content (of its LFS pointer for the suffixes the hub's default
``.gitattributes`` stores in LFS), its etag what the hub would send (the LFS sha256, or
the blob id), and the commit a sha1 of the tree listing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

HUB_CLIENT_VERSION = "2.4.0"
# Of the hub's default LFS patterns, the suffixes the mirror holds.
LFS_SUFFIXES = (".parquet", ".safetensors")


def _check_version() -> None:
    import huggingface_hub

    if huggingface_hub.__version__ != HUB_CLIENT_VERSION:
        raise RuntimeError(
            f"experiments.data.hub_records writes snapshot_download's .cache/huggingface "
            f"records through huggingface_hub's private _local_folder and _tree_cache as of "
            f"version {HUB_CLIENT_VERSION}, but {huggingface_hub.__version__} is installed; "
            f"install requirements/artifact.txt's pin, or check those writers in the new "
            f"version and update HUB_CLIENT_VERSION and the pins together")


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_entry(path: Path) -> dict:
    """The hub's ``/tree`` fields of one file: ``size``, ``blob_id`` and, for an LFS file,
    ``lfs_sha256`` and ``lfs_size``."""
    data = path.read_bytes()
    if path.suffix not in LFS_SUFFIXES:
        return {"size": len(data), "blob_id": _git_blob(data)}
    sha = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
    return {"size": len(data), "blob_id": _git_blob(pointer.encode()), "lfs_sha256": sha,
            "lfs_size": len(data)}


def write_records(source: Path, tree: list[str], dest: Path, files: list[str]) -> str:
    """Record in ``dest`` that ``files`` (already copied there) were downloaded from the
    repository whose folder ``source`` holds the files ``tree``; returns the commit.

    Example:
        >>> write_records(mirror / "datasets/cais/mmlu", all_paths, cache_repo, copied)
        ...                                                     # doctest: +SKIP
        '3c1f...'

    Raises:
        RuntimeError: the installed huggingface_hub is not `HUB_CLIENT_VERSION`.
    """
    _check_version()
    from huggingface_hub._local_folder import write_download_metadata
    from huggingface_hub._tree_cache import (
        TreeCacheEntry,
        tree_cache_folder_for_local_dir,
        write_tree_cache,
    )

    entries = {rel: tree_entry(source / rel) for rel in sorted(tree)}
    commit = hashlib.sha1(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    write_tree_cache(tree_cache_folder_for_local_dir(str(dest)), commit,
                     {rel: TreeCacheEntry.from_json(e) for rel, e in entries.items()})
    for rel in files:
        etag = entries[rel].get("lfs_sha256") or entries[rel]["blob_id"]
        write_download_metadata(dest, rel, commit_hash=commit, etag=etag)
    return commit
