"""Read a seeded sample of a map-style dataset and measure it as the loader does.

Every sample goes through the dataset's own ``__getitem__`` (the user's whole pipeline:
template, tokenizer, image processor) and is measured by the loader's own
:class:`odb.core.steps.SampleMeter` (``length_fn``/``patches_fn`` or ``length_key``,
visual tokens included when the pipeline puts them in the sequence), and by the
buffer's byte measure (:func:`odb.core.buffer.sample_nbytes`). DataLoader workers read
in parallel; a progress line goes to stderr; reading stops at a time cap, and what was
read by then is a seeded random sample still (the order is a seeded permutation).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import torch
from torch.utils.data import DataLoader, Dataset

from odb.core.buffer import sample_nbytes
from odb.core.steps import SampleMeter


@dataclass(frozen=True)
class Measured:
    """The measured samples, in dataset-index order of ``indices``.

    ``complete`` is True when every sample of the dataset was measured: then a plan's
    figures are those of the loader itself; otherwise they are scaled from a sample.
    """

    dataset_size: int
    indices: list[int]
    lengths: list[int]
    patches: list[int]
    nbytes: list[int]
    seconds: float
    stopped_by_time: bool

    @property
    def complete(self) -> bool:
        return len(self.indices) == self.dataset_size


class _MeasuredDataset(Dataset):
    """``dataset[i]`` measured inside the worker: only four integers travel back."""

    def __init__(self, dataset: Any, meter: SampleMeter) -> None:
        self.dataset = dataset
        self.meter = meter

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, int, int, int]:
        sample = self.dataset[index]
        length, patches = self.meter(index, sample)
        return index, length, patches, sample_nbytes(sample)


def sample_indices(dataset_size: int, num_samples: int | None, seed: int) -> list[int]:
    """The indices to read, in reading order: all of them (``num_samples`` None or at
    least the size) in index order, else a seeded random subset in a seeded order."""
    if num_samples is None or num_samples >= dataset_size:
        return list(range(dataset_size))
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(dataset_size, generator=generator)[:num_samples].tolist()


def measure(
    dataset: Any,
    meter: SampleMeter,
    indices: Sequence[int],
    *,
    num_workers: int = 0,
    time_limit_s: float = math.inf,
    progress: TextIO | None = sys.stderr,
) -> Measured:
    """Measure ``dataset[i]`` for ``i`` in ``indices`` (reading stops at the time cap)."""
    loader = DataLoader(
        _MeasuredDataset(dataset, meter),
        batch_size=None,
        sampler=list(indices),
        num_workers=num_workers,
    )
    bar = _Progress(len(indices), progress)
    rows: list[tuple[int, int, int, int]] = []
    start = time.perf_counter()
    stopped = False
    for row in loader:
        rows.append(tuple(int(v) for v in row))  # type: ignore[arg-type]
        bar.update(len(rows))
        if time.perf_counter() - start > time_limit_s and len(rows) < len(indices):
            stopped = True
            break
    del loader  # ends its workers now, not at the next collection
    bar.close(len(rows), stopped)
    rows.sort()
    return Measured(
        dataset_size=len(dataset),
        indices=[r[0] for r in rows],
        lengths=[r[1] for r in rows],
        patches=[r[2] for r in rows],
        nbytes=[r[3] for r in rows],
        seconds=time.perf_counter() - start,
        stopped_by_time=stopped,
    )


class _Progress:
    """``odb.plan: measured 512/2000 samples (41/s)``: on a terminal rewritten in place at
    most 4 times a second, elsewhere (a log file) one line every 5 seconds."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total = total
        self.stream = stream
        self.start = time.perf_counter()
        self.shown = 0.0
        self.tty = stream is not None and stream.isatty()

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.perf_counter()
        if self.stream is None or (not force and now - self.shown < (0.25 if self.tty else 5)):
            return
        self.shown = now
        rate = done / max(now - self.start, 1e-9)
        line = f"odb.plan: measured {done}/{self.total} samples ({rate:.0f}/s)"
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self, done: int, stopped: bool) -> None:
        if self.stream is None:
            return
        self.update(done, force=True)
        if self.tty:
            self.stream.write("\n")
        if stopped:
            self.stream.write("odb.plan: time cap reached; the plan uses the samples measured\n")
        self.stream.flush()


def check_factory_result(dataset: Any, where: Callable[..., Any] | str) -> None:
    """Refuse what is not a sized map-style dataset, naming where it came from."""
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"{where} gave a {type(dataset).__name__}; odb.plan needs a map-style dataset "
            "(__len__ and __getitem__): a stream has no epoch size to plan over"
        )
    if len(dataset) == 0:
        raise ValueError(f"{where} gave an empty dataset; there is nothing to plan over")
