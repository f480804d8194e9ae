"""``ODBLoader``: online dynamic batching over a map-style dataset, DDP-aligned.

The loader is what a training loop iterates. Each ``iter()`` is one epoch: it deals the
seeded epoch order into per-rank views, sends this rank's view to its collate side
(process or thread, :mod:`odb._process.trainer_runner`; one collate process serves all the loader's
epochs) and yields its aligned batches, each carrying a
:class:`~odb.core.step_info.StepInfo`. Every rank yields the same number of batches per
epoch. Construction is collective when ``torch.distributed`` is initialised: every
rank must build its loaders in the same order.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler, IterableDataset

from odb._process.collate_sources import is_stream
from odb._process.messages import CollateSpec, EpochJob
from odb._process.rendezvous import StoreHost, open_rendezvous
from odb._process.trainer_runner import CollateRunner, RunnerKeeper
from odb._process.trainer_startup import check_startable
from odb.collate import PadCollate, TensorParts
from odb.core.checks import check_callables, check_epoch
from odb.core.config import ODBConfig
from odb.core.detect import declared_shard
from odb.core.ledger import Ledger
from odb.core.progress import EpochProgress
from odb.core.resume import parse_pieces
from odb.core.sharding import SourceFacts, epoch_order, resolve_shard, source_row
from odb.core.step_info import STEP_INFO_KEY
from odb.core.steps import SampleMeter


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
        self.config = ODBConfig.from_options(token_budget, config, options)
        _check_dataset(dataset)
        _check_sampler(sampler, dataset)
        check_callables(
            collate_fn=collate_fn,
            length_fn=length_fn,
            patches_fn=patches_fn,
            worker_init_fn=worker_init_fn,
        )
        self.dataset = dataset
        self.sampler = sampler
        if collate_fn is None:
            collate_fn = PadCollate(ignore_index=self.config.ignore_index)
        self._spec = CollateSpec(
            dataset, collate_fn, SampleMeter(self.config, length_fn, patches_fn), worker_init_fn
        )
        self._pin = _pin_batches(self.config)
        if self.config.collate_mode == "process":  # fail before any collective
            check_startable(self._spec, self.config)
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
        # One collate side for all epochs; it ends with close(), the loader's finalizer
        # or the interpreter's exit hook (odb._process.trainer_runner), collate side first.
        self._runner_keeper = RunnerKeeper(self._spec, self.config, self.rank)
        self._closer = weakref.finalize(self, _release, self._runner_keeper, self._store_host)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` runs (or continues, after a restore)."""
        return self._ledger.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose seeded order the next ``iter()`` uses (call on every rank)."""
        self._ledger.set_epoch(check_epoch(epoch))
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
            self._stream,
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

    def start(self) -> None:
        """Start the collate side now instead of at the first ``iter()``; idempotent.

        In process mode its start-up then runs while the trainer builds its model,
        instead of delaying the first batch: a fork, and the DataLoader workers' first
        samples; with ``collate_start_method="spawn"`` also importing torch and what the
        dataset needs and unpickling the user's collate spec (seconds with a transformers
        processor). Call it on every rank, after construction. Nothing else changes: an
        error of the start-up surfaces at ``iter()``, as without it.
        """
        self._runner_keeper.start(self._rendezvous)

    def close(self) -> None:
        """Stop the collate side and free what the loader holds natively; idempotent.

        In a fixed order: the collate side (an iterator still running included; its
        thread or process leaves the alignment group, whose Gloo threads end), then, on
        rank 0 with more than one rank, the rendezvous store's server (its thread is
        joined). Call it on every rank once done with the loader (after the last epoch
        on all ranks: a peer still iterating fails, as after a ``break``). Without it,
        the loader's finalizer or the interpreter's exit hook does the same.
        """
        self._closer()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._closer.alive:
            raise RuntimeError("ODBLoader.close() was called: build a new loader to iterate again")
        job = self._stream_job() if self._stream else self._map_job()
        self._iterations += 1
        runner = self._runner_keeper.take(self._rendezvous)
        try:
            runner.begin(job, f"odb/iter{self._iterations}/")
        except BaseException:
            self._runner_keeper.give_back(runner)
            raise
        return self._drive(runner)

    def _map_job(self) -> EpochJob:
        order = self._epoch_order(self.epoch)
        view = self._ledger.begin_map(order)
        self._progress.begin(len(order), self._ledger.restored_consumed)
        row = source_row(self._shard, len(self.dataset), order) if self.world_size > 1 else []
        return self._job(view, source_row=row)

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
        row = source_row(self._shard, None, None) if self.world_size > 1 else []
        return self._job(None, skip=skip, carried=carried, source_row=row)

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
            # Kept for the next epoch only after a clean end; closed after an error or
            # a break (an abandoned epoch is never resumed by a later iter()).
            self._runner_keeper.give_back(runner)
        result = runner.result
        assert result is not None
        self._ledger.finish(result.carry, result.carried_samples)
        self._progress.finish()
        self._last_stats = dict(
            result.metrics, data_wait_s=wait_s, epoch=self.epoch, carried=len(result.carry)
        )


def _release(keeper: RunnerKeeper, store_host: StoreHost | None) -> None:
    """The loader's native parts, freed in order: collate side first, then the store."""
    keeper.close()
    if store_host is not None:
        store_host.close()


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


def _pin_batches(config: ODBConfig) -> bool:
    """Whether yielded batches are pinned: ``pin_memory`` and CUDA available."""
    if config.pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True but CUDA is not available: batches are not pinned "
            "(as torch's DataLoader does)",
            stacklevel=3,
        )
    return config.pin_memory and torch.cuda.is_available()


def _pinned(batch: Any) -> Any:
    """``batch`` with its tensors in page-locked memory (dicts, lists and tuples walked)."""
    if isinstance(batch, (torch.Tensor, TensorParts)):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return type(batch)({k: _pinned(v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(v) for v in batch)
    return batch
