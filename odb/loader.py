"""``ODBLoader``: online dynamic batching over a map-style dataset, DDP-aligned.

The loader is what a training loop iterates. Each ``iter()`` is one epoch: it deals the
seeded epoch order into per-rank views, starts this rank's collate side (process or
thread, :mod:`odb.runner`) and yields its aligned batches, each carrying a
:class:`~odb.step_info.StepInfo`. Every rank yields the same number of batches per
epoch. Construction is collective when ``torch.distributed`` is initialised: every
rank must build its loaders in the same order.
"""

from __future__ import annotations

import pickle
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
    default_convert,
)

from odb.collate import PadCollate
from odb.comm import open_rendezvous
from odb.config import ODBConfig
from odb.detect import declared_shard
from odb.engine import EpochJob, SampleMeter
from odb.ledger import Ledger
from odb.progress import EpochProgress
from odb.resume import parse_pieces
from odb.runner import CollateRunner, CollateSpec
from odb.sharding import SourceFacts, epoch_order, meet_row, resolve_shard
from odb.sources import is_stream
from odb.startup import main_guard_error, unguarded_main_line
from odb.step_info import STEP_INFO_KEY


class ODBLoader:
    """Token-budgeted, variable-size batches formed after preprocessing.

    Args:
        dataset: Map-style dataset; item ``i`` is one model-ready sample (a dict).
        token_budget: Shorthand for ``ODBConfig.token_budget`` (give this or ``config``).
        collate_fn: Turns a list of samples into a dict batch; default
            :class:`odb.collate.PadCollate`.
        length_fn: A sample's length; default ``len(sample[config.length_key])``.
        patches_fn: A sample's visual patches, for ``max_patches``.
        sampler: For a map-style dataset, what decides the epoch's indices: any
            ``Sampler`` or iterable of indices, re-iterated every epoch (``set_epoch`` is
            forwarded to it). It owns the order (``shuffle`` and ``seed`` do not apply to
            it). Per rank (a ``DistributedSampler``, or ``shard="rank"``): this rank reads
            exactly its indices. Global (``shard="odb"``): every rank holds the same
            sampler and ODB deals its order; the ranks' orders are compared each epoch.
        worker_init_fn: Called in each DataLoader worker with its id (DataLoader
            semantics).
        config: A full :class:`ODBConfig`.
        **options: Any other ``ODBConfig`` field, when ``config`` is not given.

    Example:
        >>> loader = ODBLoader(dataset, token_budget=8192, num_workers=2)  # doctest: +SKIP
        >>> for batch in loader:                                           # doctest: +SKIP
        ...     info = odb.pop_step_info(batch)
        ...     loss = model(**batch, num_items_in_batch=info.loss_normalizer).loss
    """

    def __init__(
        self,
        dataset: Any,
        token_budget: int | None = None,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        patches_fn: Callable[[Any], int] | None = None,
        sampler: Any = None,
        worker_init_fn: Callable[[int], None] | None = None,
        config: ODBConfig | None = None,
        **options: Any,
    ) -> None:
        self.config = _resolve_config(token_budget, config, options)
        _check_dataset(dataset)
        _check_sampler(sampler, dataset)
        self.dataset = dataset
        self.sampler = sampler
        collate_fn = (
            collate_fn
            if collate_fn is not None
            else PadCollate(ignore_index=self.config.ignore_index)
        )
        for name, fn in (
            ("collate_fn", collate_fn),
            ("length_fn", length_fn),
            ("patches_fn", patches_fn),
            ("worker_init_fn", worker_init_fn),
        ):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
        self._spec = CollateSpec(
            dataset, collate_fn, SampleMeter(self.config, length_fn, patches_fn), worker_init_fn
        )
        self._pin = self.config.pin_memory and torch.cuda.is_available()
        if self.config.pin_memory and not self._pin:
            warnings.warn(
                "pin_memory=True but CUDA is not available: batches are not pinned "
                "(as torch's DataLoader does)",
                stacklevel=2,
            )
        if self.config.collate_mode == "process":
            unguarded = unguarded_main_line()
            if unguarded is not None:  # fail before any collective, not in the first epoch
                raise main_guard_error(unguarded)
            _check_picklable(self._spec)
        self._rendezvous, self._store_host = open_rendezvous(
            self.config.rendezvous_host, self.config.init_timeout_s, self.config.align_timeout_s
        )
        self.rank = 0 if self._rendezvous is None else self._rendezvous.rank
        self.world_size = 1 if self._rendezvous is None else self._rendezvous.world_size
        self._stream = is_stream(dataset)
        self._shard = self._resolve_shard()
        self._ledger = Ledger(
            self.rank,
            self.world_size,
            self._shard,
            self.config.num_workers,
            None if self._stream else len(dataset),
            seed=self.config.seed,
            shuffle=self.config.shuffle,
        )
        self._progress = EpochProgress()
        self._iterations = 0
        self._last_stats: dict[str, float | int] = {}

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs (or continues, after a restore)."""
        return self._ledger.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose seeded order the next ``iter()`` uses (call on every rank)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._ledger.set_epoch(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    @property
    def shard(self) -> str:
        """Who decides which samples this rank reads (``ODBConfig.shard`` as resolved)."""
        return self._shard

    def _resolve_shard(self) -> str:
        cfg = self.config
        kind = None
        if isinstance(self.sampler, DistributedSampler):
            kind = "distributed"
            if (self.sampler.num_replicas, self.sampler.rank) != (self.world_size, self.rank):
                raise ValueError(
                    f"the DistributedSampler was built for rank {self.sampler.rank} of "
                    f"{self.sampler.num_replicas}, but this is rank {self.rank} of "
                    f"{self.world_size}; build it after init_process_group (or with "
                    "num_replicas/rank of this run)"
                )
        elif self.sampler is not None:
            kind = "other"
        facts = SourceFacts(
            self._stream_source(),
            kind,
            declared_shard(self.dataset),
            self.world_size,
            cfg.num_workers,
        )
        shard = resolve_shard(cfg.shard, facts)
        if shard != "odb" and not cfg.join and not facts.stream:
            raise ValueError(
                f"join=False with shard={shard!r}: the non-join carry is dealt over all "
                "ranks at each epoch's end, which needs one global dataset (shard='odb'). "
                "With per-rank data a rank's carry could grow without bound; use join=True"
            )
        return shard

    def _stream_source(self) -> bool:
        return is_stream(self.dataset)

    def __len__(self) -> int:
        raise TypeError(
            "ODBLoader has no fixed length: steps per epoch depend on the realised "
            "sample lengths. Use progress() or estimate_steps() for schedulers"
        )

    def progress(self) -> float:
        """Exact fraction of this epoch's samples (over all ranks) yielded so far.

        Counts samples yielded to the trainers over the dataset size; in non-join mode
        carried samples count too, so the value is capped at 1.

        Raises:
            TypeError: The dataset is a stream, whose size is unknown until it ends.
        """
        if self._stream:
            raise TypeError(
                "progress() needs a dataset with a length; a stream's size is "
                "unknown until it ends (use stats()['steps'] of past epochs)"
            )
        return self._progress.fraction()

    def estimate_steps(self) -> int | None:
        """Estimated steps of the current epoch, for schedulers; None before any evidence.

        Method: steps are close to proportional to real tokens (each fills the budget about
        equally), and the samples read so far are a random prefix of the shuffled views.
        So after ``k`` steps holding ``t`` real tokens, with the ranks having read ``r``
        samples of ``R`` tokens out of ``N``: ``round(N * R / r / (t / k))``, never less
        than ``k``. Before the first step (and for streams, whose size is unknown) the
        last epoch's step count. Measured error: ``docs/resume.md``.
        """
        if self._stream:
            return self._progress.last_epoch_steps
        return self._progress.estimate_steps()

    def stats(self) -> dict[str, float | int]:
        """Metrics of the last finished epoch, plus the trainer's data-wait time."""
        return dict(self._last_stats)

    def state_dict(self) -> dict[str, Any]:
        """This rank's piece of the resume state; returns at once, no collective.

        Any rank may call it at any step (a rank-0-only save cannot hang). The piece is a
        small, plain, picklable dict (no tensors) describing what *this* rank's trainer
        has consumed; resuming needs the pieces of every rank, passed together to
        :meth:`load_state_dict`. Samples yielded before this call are never yielded
        again in this epoch after the load; every other sample of the epoch will be.

        Example:
            >>> piece = loader.state_dict()                      # doctest: +SKIP
            >>> torch.save(piece, f"ckpt/loader_rank{rank}.pt")  # doctest: +SKIP
        """
        return self._ledger.piece().to_dict()

    def load_state_dict(self, state_dict: list[dict[str, Any]] | dict[str, Any]) -> None:
        """Restore from the pieces of every rank's :meth:`state_dict`, in any order.

        A single dict works when it is a whole state (saved at world size 1). The
        pieces may come from another world size: the next ``iter()`` continues the
        saved epoch with only the samples it still owes, re-sharded over the current
        ranks. A state saved after an epoch finished positions the loader at the start
        of the next epoch, with its carry.

        Raises:
            ValueError: Pieces are missing (the message names their ranks), come from
                different checkpoints, or the dataset or seed does not match.
        """
        self._ledger.load(parse_pieces(state_dict))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        job = self._stream_job() if self._stream else self._map_job()
        self._iterations += 1
        runner = CollateRunner(self._spec, job, self._rendezvous, f"odb/iter{self._iterations}/")
        return self._drive(runner)

    def _map_job(self) -> EpochJob:
        order = self._epoch_order(self.epoch)
        view = self._ledger.begin_map(order)
        self._progress.begin(len(order), self._ledger.restored_consumed)
        meet = meet_row(self._shard, len(self.dataset), order) if self.world_size > 1 else []
        return self._job(view, meet=meet)

    def _job(self, view: list[int] | None, **fields: Any) -> EpochJob:
        return EpochJob(
            self.config, self.epoch, self.rank, self.world_size, view, shard=self._shard, **fields
        )

    def _epoch_order(self, epoch: int) -> list[int]:
        """The epoch's full order of indices: the sampler's, or the seeded one."""
        cfg = self.config
        if self.sampler is None:
            return epoch_order(len(self.dataset), cfg.seed, epoch, cfg.shuffle)
        order = list(self.sampler)
        size = len(self.dataset)
        for index in order:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
                raise ValueError(
                    f"the sampler yielded {index!r}; ODB needs int indices in [0, {size - 1}] "
                    "of the dataset, one per sample (a batch sampler is not a sampler)"
                )
        return order

    def _stream_job(self) -> EpochJob:
        skip, carried = self._ledger.begin_stream()
        self._progress.begin(0)  # a stream's length is unknown until it ends
        meet = meet_row(self._shard, None, None) if self.world_size > 1 else []
        return self._job(None, skip=skip, carried=carried, meet=meet)

    def _drive(self, runner: CollateRunner) -> Iterator[dict[str, Any]]:
        wait_s = 0.0
        try:
            while True:
                started = time.perf_counter()
                batch = runner.next_batch()
                wait_s += time.perf_counter() - started
                if batch is None:
                    break
                if self._pin:
                    batch = _pinned(batch)
                info = batch[STEP_INFO_KEY]
                self._progress.record(info)
                self._ledger.record(info.sample_ids)
                yield batch
        finally:
            runner.close()
        result = runner.result
        assert result is not None
        self._ledger.finish(result.carry, result.carried_samples)
        self._progress.finish()
        self._last_stats = dict(
            result.metrics, data_wait_s=wait_s, epoch=self.epoch, carried=len(result.carry)
        )


def _resolve_config(
    token_budget: int | None, config: ODBConfig | None, options: dict[str, Any]
) -> ODBConfig:
    if config is not None:
        if token_budget is not None or options:
            raise ValueError("give either config=ODBConfig(...) or token_budget/options, not both")
        if not isinstance(config, ODBConfig):
            raise TypeError(f"config must be an ODBConfig, got {type(config).__name__}")
        return config
    if token_budget is None:
        raise ValueError(
            "token_budget is required (the most tokens one group may cost), "
            "e.g. ODBLoader(dataset, token_budget=8192)"
        )
    try:
        return ODBConfig(token_budget=token_budget, **options)
    except TypeError as exc:
        if "unexpected keyword" in str(exc):
            raise TypeError(f"{exc}; valid options are the fields of odb.ODBConfig") from None
        raise


def _check_dataset(dataset: Any) -> None:
    if isinstance(dataset, IterableDataset):
        return
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(
            f"dataset must be map-style (__len__ and __getitem__), got {type(dataset).__name__}"
        )


def _check_sampler(sampler: Any, dataset: Any) -> None:
    if sampler is None:
        return
    if is_stream(dataset):
        raise ValueError(
            "sampler= applies to map-style datasets; a stream decides its own order. "
            "Drop the sampler, or give a map-style dataset"
        )
    if not hasattr(sampler, "__iter__"):
        raise TypeError(
            f"sampler must be a torch Sampler or an iterable of indices, got "
            f"{type(sampler).__name__}"
        )


def _check_picklable(spec: CollateSpec) -> None:
    try:
        pickle.dumps(spec)
    except Exception as exc:
        raise TypeError(
            f"collate_mode='process' sends the dataset, collate_fn and length_fn to "
            f"a collate process, but they cannot be pickled ({exc}). Use module-level "
            "functions instead of lambdas/closures, or collate_mode='thread'"
        ) from exc


def _pinned(batch: Any) -> Any:
    """``batch`` with its tensors in page-locked memory (dicts, lists and tuples walked)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return type(batch)({k: _pinned(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(v) for v in batch)
    return batch


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
        and sampler.num_samples == len(dataloader.dataset)
    ):
        out["shuffle"] = True
    else:
        out["sampler"] = sampler
    return out
