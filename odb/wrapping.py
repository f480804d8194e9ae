"""``wrap``: an :class:`~odb.loader.ODBLoader` from a framework-owned ``DataLoader``.

Frameworks (Lightning, HF ``Trainer``, accelerate) build the ``DataLoader`` themselves;
:func:`wrap` reads its settings and builds the ODB loader that honours them, refusing
what ODB cannot honour (``batch_size`` > 1, persistent workers, contradicting options)
instead of silently changing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import (
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from odb.loader import ODBLoader


class SingletonBatches:
    """A batch sampler of one-index batches, read as a sampler (for :func:`wrap`).

    Raises at iteration when a batch holds more or fewer than one index, instead of
    dropping or merging samples.
    """

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for batch in self.batch_sampler:
            indices = list(batch)
            if len(indices) != 1:
                raise ValueError(
                    f"the DataLoader's batch_sampler yielded a batch of {len(indices)} "
                    f"indices ({indices[:8]}); odb.wrap needs batches of exactly one sample "
                    "(ODB forms the batches). Give the DataLoader a sampler instead"
                )
            yield indices[0]


def wrap(dataloader: DataLoader, token_budget: int | None = None, **options: Any) -> ODBLoader:
    """Build an :class:`ODBLoader` from a framework-owned ``DataLoader``, honouring it.

    Carried over: the dataset; the sampler (a ``SequentialSampler`` becomes
    ``shuffle=False``, a plain ``RandomSampler`` without a generator ``shuffle=True``
    with ODB's seeded order, which every rank shares; any other sampler, including a
    seeded ``RandomSampler`` (the DataLoader's ``generator``), is used as is); a batch
    sampler of one-index batches; ``num_workers``, ``prefetch_factor``,
    ``worker_init_fn``, ``multiprocessing_context``, ``timeout`` and ``pin_memory``; a
    custom ``collate_fn`` (it gets the group's list of samples, as it got a list of one).
    Options given here must not contradict the DataLoader.

    Raises:
        ValueError: What ODB cannot honour: ``batch_size`` > 1 (ODB forms the batches),
            ``persistent_workers=True``, a batch sampler whose batches are not single
            indices (at iteration), or an option that contradicts the DataLoader.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(
            f"wrap expects a torch.utils.data.DataLoader, got {type(dataloader).__name__}"
        )
    if dataloader.batch_size not in (None, 1):
        raise ValueError(
            f"wrap needs a DataLoader with batch_size=1 (got batch_size="
            f"{dataloader.batch_size}): ODB forms the batches itself from single "
            "samples. Build the DataLoader with batch_size=1"
        )
    if dataloader.persistent_workers:
        raise ValueError(
            "wrap got a DataLoader with persistent_workers=True; ODB's collate side starts "
            "the workers itself at each epoch, so persistent workers are not supported. "
            "Build the DataLoader with persistent_workers=False"
        )
    carried = _dataloader_settings(dataloader)
    for name, value in carried.items():
        if name in options and options[name] is not value and options[name] != value:
            raise ValueError(
                f"wrap got {name}={options[name]!r}, but the DataLoader has {name}={value!r}; "
                "set it on the DataLoader (wrap honours the DataLoader's settings)"
            )
    return ODBLoader(dataloader.dataset, token_budget, **{**carried, **options})


def _dataloader_settings(dataloader: DataLoader) -> dict[str, Any]:
    """The DataLoader's settings as ODBLoader arguments (see :func:`wrap`)."""
    out: dict[str, Any] = {"num_workers": dataloader.num_workers}
    if dataloader.num_workers > 0:
        out["prefetch_factor"] = dataloader.prefetch_factor
        if dataloader.timeout:
            out["worker_timeout_s"] = float(dataloader.timeout)
        context = dataloader.multiprocessing_context
        if context is not None:
            out["worker_start_method"] = (
                context if isinstance(context, str) else context.get_start_method()
            )
    if dataloader.worker_init_fn is not None:
        out["worker_init_fn"] = dataloader.worker_init_fn
    if dataloader.pin_memory:
        out["pin_memory"] = True
    if dataloader.collate_fn not in (default_collate, default_convert):
        out["collate_fn"] = dataloader.collate_fn
    if isinstance(dataloader.dataset, IterableDataset):
        return out
    batch_sampler = dataloader.batch_sampler
    if dataloader.batch_size is None and batch_sampler is not None:  # a user's batch sampler
        out["sampler"] = SingletonBatches(batch_sampler)
        return out
    sampler = dataloader.sampler
    if type(sampler) is SequentialSampler:
        out["shuffle"] = False
    elif (
        type(sampler) is RandomSampler
        and sampler.generator is None
        and not sampler.replacement
        and isinstance(dataloader.dataset, Sized)
        and sampler.num_samples == len(dataloader.dataset)
    ):
        out["shuffle"] = True
    else:
        out["sampler"] = sampler
    return out
