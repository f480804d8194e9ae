"""The offline length cache of the GMT/BMT oracles: one full preprocessing pass, on disk.

GMT and BMT need every sample's post-pipeline length before the epoch starts, so they
pay for one full pass of the real pipeline up front (the cost ODB avoids). The cache
stores each sample's length and visual patches together with the dataset's
``fingerprint()`` (a hash of everything that changes lengths: data, template, tokenizer,
cutoff, processor, augmentation), the build time and the command that built it. A
cache whose fingerprint differs from the dataset's is refused with the command that
rebuilds it. Under random augmentation the cached length is one epoch's draw, only an
estimate for the others: the loaders count the resulting budget violations.

Any map-style dataset with a ``fingerprint()`` works. The command line builds the
dataset from a factory path, so this library never imports an experiment::

    python -m baselines.length_cache build --out results/cache/ultrachat.json \\
        --factory experiments.data.pipeline:PreprocessedDataset \\
        --kwargs '{"cfg": {"_target_": "experiments.data.records:DataConfig",
                   "dataset": "ultrachat", "source": "data/proxies/ultrachat",
                   "processor": "data/assets/processor"}}' --num-workers 4
    python -m baselines.length_cache info results/cache/ultrachat.json

A ``{"_target_": "module:callable", ...}`` value in ``--kwargs`` is replaced by the
callable's result on the other keys (recursively), as in Hydra.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from baselines.measure import default_length, default_patches
from baselines.targets import import_target, instantiate

__all__ = [
    "LengthCache",
    "StaleCacheError",
    "build",
    "main",
    "resolve_lengths",
]

FORMAT = "odb-length-cache"
VERSION = 1
_REBUILD_HINT = (
    "python -m baselines.length_cache build --out {path} --factory MODULE:CALLABLE "
    "--kwargs JSON (or baselines.length_cache.build(dataset).save(path))"
)


class StaleCacheError(ValueError):
    """A length cache does not describe the dataset it is used with."""


@dataclass(frozen=True)
class LengthCache:
    """Per-sample lengths and visual patches of one dataset, with its fingerprint.

    Attributes:
        fingerprint: The dataset's ``fingerprint()`` when the cache was built.
        lengths: Post-pipeline length of each sample, by dataset index.
        patches: Visual patches of each sample, by dataset index.
        epoch: Epoch whose augmentation draws the lengths are (None: not set).
        build_seconds: Wall time of the full preprocessing pass (the first, when timed
            more than once).
        build_timings: Wall time of every timed pass, first to last (``(build_seconds,)``
            for a single pass; a cache read from an older file gets that too).
        created: UTC time of the build (ISO 8601).
        command: The command line that rebuilds the cache ("" when built from Python).

    Example:
        >>> cache = LengthCache("abc", (3, 5), (0, 0))
        >>> cache.num_samples, cache.check_fingerprint("abc", 2)
        (2, None)
    """

    fingerprint: str
    lengths: tuple[int, ...] = field(repr=False)
    patches: tuple[int, ...] = field(repr=False)
    epoch: int | None = None
    build_seconds: float = 0.0
    created: str = ""
    command: str = ""
    build_timings: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.build_timings:
            object.__setattr__(self, "build_timings", (self.build_seconds,))
        if len(self.lengths) != len(self.patches):
            raise ValueError(
                f"a length cache needs one patch count per length, got {len(self.lengths)} "
                f"lengths and {len(self.patches)} patch counts"
            )

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def check_fingerprint(self, fingerprint: str, num_samples: int, where: str = "") -> None:
        """Raises :class:`StaleCacheError` unless the cache matches this dataset state."""
        rebuild = self.command or _REBUILD_HINT.format(path=where or "PATH")
        if fingerprint != self.fingerprint:
            raise StaleCacheError(
                f"length cache {where or ''} is stale: it was built for pipeline "
                f"fingerprint {self.fingerprint!r} but the dataset's is {fingerprint!r} "
                "(data, template, tokenizer, cutoff, processor or augmentation changed). "
                f"Rebuild it: {rebuild}"
            )
        if num_samples != self.num_samples:
            raise StaleCacheError(
                f"length cache {where or ''} holds {self.num_samples} samples but the dataset "
                f"has {num_samples}. Rebuild it: {rebuild}"
            )

    def check(self, dataset: Any, where: str = "") -> None:
        """Raises :class:`StaleCacheError` unless the cache was built for ``dataset``."""
        self.check_fingerprint(fingerprint_of(dataset), len(dataset), where)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "num_samples": self.num_samples,
            "epoch": self.epoch,
            "build_seconds": self.build_seconds,
            "build_timings": list(self.build_timings),
            "created": self.created,
            "command": self.command,
            "lengths": list(self.lengths),
            "patches": list(self.patches),
        }

    def save(self, path: str | Path) -> int:
        """Write the cache as JSON; returns its size in bytes."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        path.write_text(text + "\n")
        return path.stat().st_size

    @classmethod
    def load(cls, path: str | Path, dataset: Any = None) -> LengthCache:
        """Read a cache; with ``dataset``, refuse it unless it matches (see :meth:`check`).

        Raises:
            StaleCacheError: The cache does not match ``dataset``.
            ValueError: The file is not a length cache of this version.
        """
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(
                f"{path} is not a version-{VERSION} length cache (format "
                f"{data.get('format')!r}, version {data.get('version')!r}); rebuild it"
            )
        cache = cls(
            fingerprint=data["fingerprint"],
            lengths=tuple(data["lengths"]),
            patches=tuple(data["patches"]),
            epoch=data["epoch"],
            build_seconds=data["build_seconds"],
            created=data["created"],
            command=data["command"],
            build_timings=tuple(data.get("build_timings") or ()),
        )
        if dataset is not None:
            cache.check(dataset, str(path))
        return cache

    def describe(self) -> dict[str, Any]:
        """Summary numbers (no per-sample lists), for logs and result JSON."""
        n = self.num_samples
        return {
            "fingerprint": self.fingerprint,
            "num_samples": n,
            "epoch": self.epoch,
            "build_seconds": self.build_seconds,
            "build_timings": list(self.build_timings),
            "created": self.created,
            "mean_length": sum(self.lengths) / n if n else 0.0,
            "max_length": max(self.lengths, default=0),
            "total_patches": sum(self.patches),
        }


def fingerprint_of(dataset: Any) -> str:
    """The dataset's ``fingerprint()``; a clear error when it has none."""
    method = getattr(dataset, "fingerprint", None)
    if not callable(method):
        raise TypeError(
            f"{type(dataset).__name__} has no fingerprint(): a length cache is keyed by a "
            "hash of everything that changes lengths, so the dataset must provide one"
        )
    return str(method())


@dataclass(frozen=True)
class _Measured(Dataset):
    """Item ``i`` is ``(length, patches)`` of ``dataset[i]``, measured in the worker so
    that samples (pixel tensors) never cross a process boundary."""

    dataset: Any
    length_fn: Callable
    patches_fn: Callable

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, int]:
        sample = self.dataset[index]
        return int(self.length_fn(sample)), int(self.patches_fn(sample))


def _unbatched(item: tuple[int, int]) -> tuple[int, int]:
    return item


def build(
    dataset: Any,
    *,
    epoch: int | None = None,
    num_workers: int = 0,
    length_fn: Callable[[Any], int] = default_length,
    patches_fn: Callable[[Any], int] = default_patches,
    command: str = "",
    repeats: int = 1,
) -> LengthCache:
    """Runs full passes of ``dataset`` and returns its length cache.

    Args:
        dataset: Map-style dataset of model-ready samples with a ``fingerprint()``.
        epoch: Call ``dataset.set_epoch(epoch)`` first (the augmentation draws cached).
        num_workers: DataLoader workers for the pass.
        length_fn: A sample's length (default ``len(sample["input_ids"])``).
        patches_fn: A sample's visual patches (default from ``image_grid_thw``).
        command: The command line that rebuilds the cache (recorded for stale errors).
        repeats: Timed passes (>= 1): the build cost is a timing like any other, and more
            than one pass gives it a spread (``build_timings``). Every pass must give the
            same lengths; ``build_seconds`` is the first pass's time (a cold build's).

    Raises:
        ValueError: ``repeats`` < 1.
        RuntimeError: Two passes gave different lengths (the dataset is not
            deterministic for a fixed epoch, so no cache of it can be right).

    Example:
        >>> cache = build(dataset, num_workers=4)  # doctest: +SKIP
        >>> cache.save("results/cache/ultrachat.json")  # doctest: +SKIP
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1 (timed passes of the dataset), got {repeats}")
    fingerprint = fingerprint_of(dataset)
    if epoch is not None:
        dataset.set_epoch(epoch)
    passes = [_timed_pass(dataset, num_workers, length_fn, patches_fn) for _ in range(repeats)]
    (lengths, patches, _), timings = passes[0], tuple(t for _, _, t in passes)
    for k, (other_lengths, other_patches, _) in enumerate(passes[1:], start=1):
        if (other_lengths, other_patches) != (lengths, patches):
            raise RuntimeError(
                f"pass {k} of the dataset gave other lengths than pass 0: its samples are not "
                "deterministic for a fixed epoch, so a length cache of it cannot be right"
            )
    return LengthCache(
        fingerprint=fingerprint,
        lengths=lengths,
        patches=patches,
        epoch=epoch,
        build_seconds=timings[0],
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        command=command,
        build_timings=timings,
    )


def _timed_pass(
    dataset: Any, num_workers: int, length_fn: Callable[[Any], int],
    patches_fn: Callable[[Any], int],
) -> tuple[tuple[int, ...], tuple[int, ...], float]:
    """One full pass: every sample's length and patches, and the pass's wall seconds."""
    started = time.perf_counter()
    loader = DataLoader(
        _Measured(dataset, length_fn, patches_fn),
        batch_size=None,
        collate_fn=_unbatched,
        num_workers=num_workers,
    )
    lengths, patches = [], []
    for length, n_patches in loader:
        lengths.append(length)
        patches.append(n_patches)
    return tuple(lengths), tuple(patches), round(time.perf_counter() - started, 3)


LengthSource = LengthCache | Sequence[int] | Callable[[int], int]


def resolve_lengths(
    source: LengthSource, dataset: Any
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Per-sample ``(lengths, patches)`` for a plan, from a cache, a list or a proxy.

    A :class:`LengthCache` is checked against ``dataset`` (stale caches are refused) and
    brings its patches; a sequence is taken as the lengths; a callable ``f(index)`` is a
    pre-pipeline proxy (e.g. text length plus nominal image tokens), called once per
    sample. Only a cache has patches.

    Raises:
        StaleCacheError: The cache was built for another dataset state.
        ValueError: The number of lengths differs from the dataset's size, or a length
            is below 1.
    """
    patches = None
    if isinstance(source, LengthCache):
        source.check(dataset)
        lengths, patches = source.lengths, source.patches
    elif callable(source):
        lengths = tuple(int(source(i)) for i in range(len(dataset)))
    else:
        lengths = tuple(int(n) for n in source)
    if len(lengths) != len(dataset):
        raise ValueError(
            f"got {len(lengths)} lengths for a dataset of {len(dataset)} samples; "
            "give one length per sample (index order)"
        )
    short = [i for i, n in enumerate(lengths) if n < 1]
    if short:
        raise ValueError(
            f"samples {short[:5]} have length < 1; filter empty samples out of the dataset"
        )
    return lengths, patches


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The ``build`` and ``info`` commands; prints (and returns) a JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="one full pass of a dataset; write its cache")
    p_build.add_argument("--out", type=Path, required=True, help="cache file to write (JSON)")
    p_build.add_argument("--factory", required=True, help="module:callable returning the dataset")
    p_build.add_argument("--kwargs", default="{}", help="JSON keyword arguments of the factory")
    p_build.add_argument("--epoch", type=int, default=None, help="set_epoch before the pass")
    p_build.add_argument("--num-workers", type=int, default=0)
    p_build.add_argument("--repeats", type=int, default=1,
                         help="timed passes (the build time's spread); lengths must agree")
    p_info = sub.add_parser("info", help="print a cache's metadata")
    p_info.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    if args.command == "info":
        cache = LengthCache.load(args.path)
        record = dict(cache.describe(), path=str(args.path), size_bytes=args.path.stat().st_size)
    else:
        dataset = import_target(args.factory)(**instantiate(json.loads(args.kwargs)))
        argv_used = sys.argv[1:] if argv is None else argv
        command = shlex.join(["python", "-m", "baselines.length_cache", *argv_used])
        cache = build(dataset, epoch=args.epoch, num_workers=args.num_workers, command=command,
                      repeats=args.repeats)
        size = cache.save(args.out)
        record = dict(cache.describe(), path=str(args.out), size_bytes=size, command=command)
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
