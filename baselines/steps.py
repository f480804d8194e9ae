"""A plan's steps as the DataLoader runs them, and their counts summed over the ranks.

In the worker, each step's samples come keyed by ``(index, idle)``; the user's collate
runs on them and the realised step is measured (:class:`StepMeta` travels with the
batch). In the trainer process, a gradient-accumulation window's per-step counts are
summed once over the loader's private count group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import Dataset, IterableDataset

import odb
import odb.kit
from baselines.config import BaselineConfig
from baselines.measure import default_length


@dataclass(frozen=True)
class StepMeta:
    """What the worker measured about one collated step (travels with the batch)."""

    ids: tuple[int, ...]
    idle: bool
    measure: odb.kit.GroupMeasure  # the realised samples' lengths and patches
    loss_tokens: int

    def record(self, metrics: odb.kit.StepMetrics, budget: odb.TokenBudget) -> None:
        """Count this step in the epoch's metrics."""
        if self.idle:
            metrics.record_idle()
        else:
            metrics.record_step(budget, self.measure)


class Keyed(Dataset):
    """Item ``(index, idle)`` is ``(index, idle, dataset[index])``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, bool]) -> tuple[int, bool, Any]:
        index, idle = key
        return index, idle, self.dataset[index]


@dataclass(frozen=True)
class StepCollate:
    """Runs the user's collate on one step and measures it (in the DataLoader worker)."""

    collate_fn: Callable[[list[Any]], Any]
    config: BaselineConfig
    length_fn: Callable[[Any], int] | None
    patches_fn: Callable[[Any], int]

    def __call__(self, keyed: list[tuple[int, bool, Any]]) -> tuple[Any, StepMeta]:
        samples = [sample for _, _, sample in keyed]
        idle = keyed[0][1]
        batch = self.collate_fn(samples)
        tokens = odb.kit.finish_batch(batch, self.config, idle=idle)
        length = self.length_fn or (lambda s: default_length(s, self.config.length_key))
        measure = odb.kit.GroupMeasure()
        for sample in samples:
            measure = measure.plus(int(length(sample)), int(self.patches_fn(sample)))
        ids = () if idle else tuple(index for index, _, _ in keyed)
        return batch, StepMeta(ids, idle, measure, tokens)


def sum_window(
    group: odb.kit.AlignmentGroup,
    windows: odb.AccumulationNormalizer,
    pending: list[tuple[Any, StepMeta, int]],
) -> list[tuple[tuple[Any, StepMeta, int], tuple[int, int, int, float]]]:
    """Sum a window's per-step sample and loss-token counts over the ranks.

    Returns, per pending step in order, the step and its counts ``(global samples,
    global loss tokens, window loss tokens, loss normalizer)``.
    """
    counts = [n for _, meta, _ in pending for n in (len(meta.ids), meta.loss_tokens)]
    totals = group.sum_counts(counts)
    released = []
    for j, item in enumerate(pending):
        released += windows.push((item, totals[2 * j], totals[2 * j + 1]), totals[2 * j + 1])
    released += windows.flush()
    return [
        (item, (samples, tokens, window_tokens, normalizer))
        for (item, samples, tokens), window_tokens, normalizer in released
    ]


def check_dataset(dataset: Any) -> None:
    """Refuse what a planned loader cannot run: an iterable-style or empty dataset."""
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise TypeError(
            f"baseline loaders plan whole epochs, so they need a map-style dataset (__len__ "
            f"and __getitem__), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError("the dataset is empty; a loader needs at least one sample")

