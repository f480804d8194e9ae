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
from odb.resume import LoaderState, StatePiece, check_pieces, merge_pieces, parse_pieces
from odb.runner import CollateRunner, CollateSpec
from odb.sharding import SourceFacts, epoch_order, meet_row, resolve_shard
from odb.sources import is_stream
from odb.startup import main_guard_error, unguarded_main_line
from odb.step_info import STEP_INFO_KEY, StepInfo


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
        self.epoch = 0
        self._iterations = 0
        self._carry: list[int] = []
        self._carry_samples: list[tuple[int, Any]] = []  # a stream's non-join carry
        self._steps = 0
        self._real_tokens = 0
        self._last_info: StepInfo | None = None
        self._last_epoch_steps: int | None = None
        self._last_stats: dict[str, float | int] = {}
        self._emitted_global = 0
        self._epoch_total = 0
        self._resume: LoaderState | None = None
        # Exactly-once ledger of the current epoch (see odb/resume.py): the epoch last
        # iterated (None: none since construction or load), this rank's share of the
        # restored state it continued, what it read as carry and what it yielded.
        self._restored: LoaderState | None = None
        self._iter_epoch: int | None = None
        self._base = LoaderState(0, None, 0, False)
        self._carry_in: list[int] = []
        self._consumed: list[int] = []
        self._epoch_done = False

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose seeded order the next ``iter()`` uses (call on every rank)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # the restored epoch is skipped: start the new one fresh
        self.epoch = epoch
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
        total = self._total()
        if not total:
            return 0.0
        return min(self._emitted_global / total, 1.0)

    def _total(self) -> int:
        """The epoch's samples over all ranks (with per-rank data, as the ranks reported)."""
        info = self._last_info
        return info.epoch_samples if info is not None and info.epoch_samples else self._epoch_total

    def estimate_steps(self) -> int | None:
        """Estimated steps of the current epoch, for schedulers; None before any evidence.

        Method: steps are close to proportional to real tokens (each fills the budget about
        equally), and the samples read so far are a random prefix of the shuffled views.
        So after ``k`` steps holding ``t`` real tokens, with the ranks having read ``r``
        samples of ``R`` tokens out of ``N``: ``round(N * R / r / (t / k))``, never less
        than ``k``. Before the first step (and for streams, whose size is unknown) the
        last epoch's step count. Measured error: ``docs/resume.md``.
        """
        info = self._last_info
        if self._stream or info is None or not info.epoch_read_samples or not self._real_tokens:
            return self._last_epoch_steps
        total_tokens = self._total() * info.epoch_read_tokens / info.epoch_read_samples
        return max(self._steps, round(total_tokens / (self._real_tokens / self._steps)))

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
        piece = StatePiece(
            self.rank, self.world_size, self._shard, self.config.num_workers, self._share()
        )
        return piece.to_dict()

    def _share(self) -> LoaderState:
        """This rank's share of the epoch's ledger (see :mod:`odb.resume`)."""
        cfg = self.config
        size = None if self._stream else len(self.dataset)
        if self._resume is not None:  # restored, not iterated yet
            return self._my_part(self._resume)
        if self._iter_epoch is None:  # a fresh epoch not started yet, with its carry
            return LoaderState(self.epoch, size, cfg.seed, cfg.shuffle, tuple(self._carry))
        base = self._base
        return LoaderState(
            self._iter_epoch,
            size,
            cfg.seed,
            cfg.shuffle,
            base.carry_in + tuple(self._carry_in),
            base.consumed + tuple(self._consumed),
            self._epoch_done,
            tuple(self._carry) if self._epoch_done else (),
        )

    def _my_part(self, state: LoaderState) -> LoaderState:
        """This rank's part of a restored state: a share of a global one, or its own."""
        return state.share(self.rank, self.world_size) if self._shard == "odb" else state

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
        state = self._merge(parse_pieces(state_dict))
        if self._stream:
            self._check_stream_state(state)
        elif state.num_samples != len(self.dataset):
            raise ValueError(
                f"loader state was saved for {state.num_samples} samples but the "
                f"dataset has {len(self.dataset)}; resume with the same dataset"
            )
        if (state.seed, state.shuffle) != (self.config.seed, self.config.shuffle):
            raise ValueError(
                f"loader state has seed={state.seed}, shuffle={state.shuffle} but "
                f"this loader has seed={self.config.seed}, shuffle="
                f"{self.config.shuffle}; build the loader with the saved settings"
            )
        self._iter_epoch = None
        if state.epoch_done:
            self.epoch, self._resume = state.epoch + 1, None
            self._carry = list(self._my_part(state).carry_next)
        else:
            self.epoch, self._resume, self._carry = state.epoch, state, []

    def _merge(self, pieces: list[StatePiece]) -> LoaderState:
        """The state this rank resumes from: all pieces merged, or its own (per-rank data)."""
        saved = pieces[0]
        if saved.shard != self._shard:
            raise ValueError(
                f"loader state was saved with shard={saved.shard!r} but this loader "
                f"resolved shard={self._shard!r}; build it with the saved shard setting"
            )
        if self._shard in ("worker", "rank_worker") and saved.num_workers != (
            self.config.num_workers
        ):
            raise ValueError(
                f"this stream numbers its items per DataLoader worker and the state was saved "
                f"with num_workers={saved.num_workers}; resume with num_workers="
                f"{saved.num_workers} (this loader has {self.config.num_workers})"
            )
        if self._shard == "odb":
            return merge_pieces(pieces)
        if saved.world_size != self.world_size:
            raise ValueError(
                f"loader state comes from a {saved.world_size}-rank run with per-rank data "
                f"(shard={self._shard!r}); each rank's samples are its own, so it resumes "
                f"only at world size {saved.world_size}, not {self.world_size}"
            )
        check_pieces(pieces, need=[self.rank])
        return next(piece.state for piece in pieces if piece.rank == self.rank)

    def _check_stream_state(self, state: LoaderState) -> None:
        if state.num_samples is not None:
            raise ValueError(
                "loader state was saved for a map-style dataset of "
                f"{state.num_samples} samples, but this loader reads a stream"
            )
        if state.carry_in or state.carry_next:
            raise ValueError(
                "a non-join stream checkpoint holds carried samples, which a "
                "stream cannot re-read by position; checkpoint streams in join "
                "mode, or at an epoch boundary with nothing carried"
            )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._restored, self._resume = self._resume, None
        self._iter_epoch = self.epoch if self._restored is None else self._restored.epoch
        self._base = (
            LoaderState(self._iter_epoch, None, 0, False)
            if self._restored is None
            else self._my_part(self._restored)
        )
        self._consumed, self._epoch_done, self._steps = [], False, 0
        self._real_tokens, self._last_info = 0, None
        self._emitted_global = len(self._restored.consumed) if self._restored else 0
        job = self._stream_job() if self._stream else self._map_job()
        self._carry, self._carry_samples = [], []
        self._iterations += 1
        runner = CollateRunner(self._spec, job, self._rendezvous, f"odb/iter{self._iterations}/")
        return self._drive(runner)

    def _map_job(self) -> EpochJob:
        cfg = self.config
        epoch = self._iter_epoch if self._iter_epoch is not None else self.epoch
        order = self._epoch_order(epoch)
        dealt = self._shard == "odb"
        if self._restored is not None:
            owed = self._restored.remaining(order)
            view, self._carry_in = owed[self.rank :: self.world_size] if dealt else owed, []
        else:
            fresh = order[self.rank :: self.world_size] if dealt else order
            view, self._carry_in = self._carry + fresh, self._carry
        self._epoch_total = len(order)
        meet = meet_row(self._shard, len(self.dataset), order) if self.world_size > 1 else []
        return EpochJob(
            cfg, self.epoch, self.rank, self.world_size, view, shard=self._shard, meet=meet
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
        skip = self._restored.skip_set() if self._restored is not None else frozenset()
        self._carry_in = [index for index, _ in self._carry_samples]
        self._epoch_total = 0  # a stream's length is unknown until it ends
        meet = meet_row(self._shard, None, None) if self.world_size > 1 else []
        return EpochJob(
            self.config,
            self.epoch,
            self.rank,
            self.world_size,
            None,
            skip,
            list(self._carry_samples),
            shard=self._shard,
            meet=meet,
        )

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
                self._steps += 1
                self._real_tokens += info.global_real_tokens
                self._last_info = info
                self._emitted_global += info.global_samples
                self._consumed.extend(info.sample_ids)
                yield batch
        finally:
            runner.close()
        assert runner.result is not None
        self._carry = list(runner.result.carry)
        self._carry_samples = list(runner.result.carried_samples)
        self._epoch_done = True
        self._last_epoch_steps = self._steps
        self._last_stats = dict(
            runner.result.metrics, data_wait_s=wait_s, epoch=self.epoch, carried=len(self._carry)
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
