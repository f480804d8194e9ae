"""The shared loader of every baseline: ODB's interface over a plain ``DataLoader``.

Each baseline only supplies its per-epoch plan (:mod:`baselines.methods`); this module
does the rest once, the same way for all of them:

* ``iter()`` is one epoch. Every rank computes the same plan from ``seed + epoch``
  and runs its own steps through a ``torch.utils.data.DataLoader`` whose
  ``batch_sampler`` is that list of steps (public API only; workers and prefetch as
  usual). Every rank therefore yields the same number of steps.
* Every batch is a dict carrying a :class:`odb.StepInfo` under ``odb.STEP_INFO_KEY``,
  exactly like ODB's: sample ids, local/global sample and loss-token counts, the IDLE
  flag and the loss normalizer over the gradient-accumulation window. The global
  counts are summed once per window over a private Gloo group
  (:class:`odb.kit.AlignmentGroup`, rendezvous through :func:`odb.kit.open_rendezvous`)
  from the trainer process, never over the trainer's own group, so they cannot
  interleave with gradient all-reduces. The loader looks ahead one window.
  ``StepInfo.round`` is, as in ODB, the index of the exchange that produced the step
  (here one per window): ``step // grad_accum_steps``. A rank that raises leaves a
  note for its peers and closes the group, so they fail at once, naming it, instead of
  waiting out ``align_timeout_s``.
* ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly once, with ODB's
  contract: every rank's ``state_dict()`` is its piece, taken without a collective, and
  ``load_state_dict`` takes the list of pieces (or one dict). The plan is a pure
  function of the seed, the epoch, the pool and the world size, so each rank knows
  what *every* rank has consumed after ``k`` steps: a baseline's piece is already the
  whole state (pieces of one save agree; any one of them restores). A restore with the
  same world size and plan replays the plan from step ``k`` (the remaining batches are
  identical); otherwise the samples still owed are re-planned over the current ranks.
* ``stats()`` measures the realised samples with :class:`odb.kit.StepMetrics`, ODB's own
  figures (padding, budget fill, IDLE steps), and so counts *budget violations*:
  multi-sample steps whose realised cost exceeds the budget, which happens when the
  lengths a plan was made from (a cache, a proxy, a fixed batch size) differ from the
  realised ones, e.g. under random augmentation.

Only :mod:`odb`'s public API is used: the config fields, step-info rules, metrics,
count group and resume state are odb's, defined once there.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torch.utils.data import DataLoader, Dataset, IterableDataset

import odb
import odb.kit
from baselines.config import BaselineConfig
from baselines.length_cache import LengthSource, default_length, default_patches, resolve_lengths
from baselines.plans import Plan, check_plan

__all__ = ["FixedBatchLoader", "PlannedLoader", "StepMeta", "TokenBudgetedLoader"]

# State keys (named constants, torchdata-style). PROGRESS holds every sample consumed this
# epoch over all ranks; PLAN_BASE those consumed before the current plan was made.
METHOD = "method"
PLAN_KEY = "plan_key"
PLAN_WORLD_SIZE = "plan_world_size"
PLAN_STEP = "plan_step"
STEPS_BEFORE = "steps_before_plan"
PLAN_BASE = "plan_base"
PROGRESS = "progress"
# Who saved the piece (ODB's piece keys): informative, the rest is the whole state.
RANK = "rank"
WORLD_SIZE = "world_size"
STATE_KEYS = (
    METHOD,
    PLAN_KEY,
    PLAN_WORLD_SIZE,
    PLAN_STEP,
    STEPS_BEFORE,
    PLAN_BASE,
    PROGRESS,
    RANK,
    WORLD_SIZE,
)


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


class _Keyed(Dataset):
    """Item ``(index, idle)`` is ``(index, idle, dataset[index])``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, bool]) -> tuple[int, bool, Any]:
        index, idle = key
        return index, idle, self.dataset[index]


@dataclass(frozen=True)
class _StepCollate:
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


@dataclass(frozen=True)
class _Resume:
    """How the next ``iter()`` continues a restored epoch."""

    epoch: int
    base: tuple[int, ...]  # consumed before the plan to run was made
    step: int  # steps of that plan already consumed
    steps_before: int  # epoch steps run before that plan (numbering continues)


class PlannedLoader:
    """Base of the baseline loaders: a precomputed per-epoch plan run through a DataLoader.

    Subclasses set ``method`` and ``default_cost_model``, check their settings in
    ``_setup`` and return the epoch's plan from ``plan``; everything else (step info,
    count exchange, metrics, resume, progress) lives here once.

    Args:
        dataset: Map-style dataset; item ``i`` is one model-ready sample (a dict).
        config: The loader's settings.
        collate_fn: Turns a list of samples into a dict batch (default
            :class:`odb.PadCollate` with the config's ``ignore_index``).
        lengths: Per-sample lengths the plan is made from: a
            :class:`~baselines.length_cache.LengthCache` (checked against the dataset's
            fingerprint), a sequence, or a callable ``f(index)`` (a pre-pipeline proxy).
            Required by the methods that sort or group.
        length_fn: A realised sample's length (default ``len(sample[length_key])``).
        patches_fn: A realised sample's visual patches (default from ``image_grid_thw``).

    Construction is collective when ``torch.distributed`` is initialised: every rank
    must build its loaders in the same order (rank 0 hosts the count group's store).
    """

    method: ClassVar[str] = ""
    default_cost_model: ClassVar[odb.CostModel] = "padded"
    needs_lengths: ClassVar[bool] = True

    def __init__(
        self,
        dataset: Any,
        config: BaselineConfig,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        lengths: LengthSource | None = None,
        length_fn: Callable[[Any], int] | None = None,
        patches_fn: Callable[[Any], int] | None = None,
    ) -> None:
        if not isinstance(config, BaselineConfig):
            raise TypeError(f"config must be a BaselineConfig, got {type(config).__name__}")
        _check_dataset(dataset)
        self.dataset = dataset
        self.config = config
        self.budget = config.budget(self.default_cost_model)
        self.lengths: tuple[int, ...] | None = None
        self.patches: tuple[int, ...] | None = None
        if lengths is not None:
            self.lengths, self.patches = resolve_lengths(lengths, dataset)
        elif self.needs_lengths:
            raise ValueError(
                f"the {self.method!r} method plans from per-sample lengths: pass lengths= a "
                "LengthCache (python -m baselines.length_cache build ...), a list, or a "
                "length proxy f(index)"
            )
        odb.kit.check_callables(collate_fn=collate_fn, length_fn=length_fn, patches_fn=patches_fn)
        self._collate = _StepCollate(
            collate_fn if collate_fn is not None else self._default_collate(),
            config,
            length_fn,
            patches_fn if patches_fn is not None else default_patches,
        )
        self._setup()
        self._rendezvous, self._store_host = odb.kit.open_rendezvous(
            config.rendezvous_host, config.init_timeout_s, config.align_timeout_s
        )
        self.rank = 0 if self._rendezvous is None else self._rendezvous.rank
        self.world_size = 1 if self._rendezvous is None else self._rendezvous.world_size
        self.epoch = 0
        self._iterations = 0
        self._resume: _Resume | None = None
        self._cached_plan: tuple[Any, Plan] | None = None
        self._last_stats: dict[str, float | int] = {}
        # The epoch in progress (or last run): its plan and how far the trainer got.
        self._plan: Plan | None = None
        self._plan_epoch = 0
        self._base: tuple[int, ...] = ()
        self._steps_before = 0
        self._yielded = 0
        self._epoch_done = False
        self._emitted_global = 0

    # ------------------------------------------------------------------ per method

    def _setup(self) -> None:
        """Validate the method's settings (called once at construction)."""

    def _default_collate(self) -> Callable[[list[Any]], Any]:
        return odb.PadCollate(ignore_index=self.config.ignore_index)

    def plan(self, pool: Sequence[int], world_size: int, seed: int) -> Plan:
        """The epoch's steps for every rank: equal counts, each pool index exactly once."""
        raise NotImplementedError

    def _plan_params(self) -> dict[str, Any]:
        """Everything besides lengths that shapes the plan (for the resume check)."""
        return {}

    # ------------------------------------------------------------------ public API

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose seeded plan the next ``iter()`` runs (call on every rank)."""
        odb.kit.check_epoch(epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None  # the restored epoch is skipped: start the new one fresh
        self.epoch = epoch

    def __len__(self) -> int:
        """Steps the next ``iter()`` yields (exact: the plan is known in advance)."""
        resume = self._pending()
        return len(self._plan_for(resume)[0]) - resume.step

    def estimate_steps(self) -> int:
        """Steps of the current epoch (exact for the baselines), for schedulers."""
        if self._plan is not None and not self._epoch_done:
            return self._steps_before + len(self._plan[0])
        resume = self._pending()
        return resume.steps_before + len(self._plan_for(resume)[0])

    def progress(self) -> float:
        """Exact fraction of this epoch's samples (over all ranks) yielded so far."""
        return min(self._emitted_global / len(self.dataset), 1.0)

    def stats(self) -> dict[str, float | int]:
        """Metrics of the last finished epoch (this rank), plus data wait and exchange time."""
        return dict(self._last_stats)

    def state_dict(self) -> dict[str, Any]:
        """This rank's piece of the resume state; returns at once, no collective.

        Any rank may call it at any step. Every rank knows every rank's plan, so the
        piece is the whole state over all ranks: a plain, small, tensor-free dict.
        """
        if self._plan is None:  # nothing run yet: the pending epoch, untouched
            resume = self._pending()
            plan_world, step = self.world_size, resume.step
            base, steps_before, done = resume.base, resume.steps_before, False
            consumed = list(base) + _ids(self._plan_for(resume), step)
            epoch = resume.epoch
            plan_key = self._plan_key(epoch)
        else:
            epoch = self._plan_epoch
            plan_world, step = len(self._plan), self._yielded
            base, steps_before, done = self._base, self._steps_before, self._epoch_done
            consumed = list(base) + _ids(self._plan, step)
            plan_key = self._plan_key(self._plan_epoch)
        return {
            METHOD: self.method,
            PLAN_KEY: plan_key,
            PLAN_WORLD_SIZE: plan_world,
            PLAN_STEP: step,
            STEPS_BEFORE: steps_before,
            PLAN_BASE: self._state(base, epoch=epoch).to_dict(),
            PROGRESS: self._state(consumed, done, epoch=epoch).to_dict(),
            RANK: self.rank,
            WORLD_SIZE: self.world_size,
        }

    def load_state_dict(self, state_dict: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> None:
        """Restore from the pieces of :meth:`state_dict` (a list, any order, or one dict).

        Each piece is the whole state, so any subset of a save's pieces restores; pieces
        that disagree are refused. The state may come from another world size. The next
        ``iter()`` continues the saved epoch with exactly the samples it still owes.
        Same world size and same plan: the remaining steps are identical to an
        uninterrupted run. Otherwise the owed samples are re-planned over the current
        ranks. A state saved after an epoch finished positions the next epoch.
        """
        state = _one_state(state_dict)
        odb.kit.check_state_keys(state, STATE_KEYS, type(self).__name__)
        method = state.pop(METHOD)
        if method != self.method:
            raise ValueError(
                f"the state was saved by a {method!r} loader; this loader is "
                f"{self.method!r}. Resume with the same method"
            )
        progress = odb.LoaderState.from_dict(state.pop(PROGRESS))
        base = odb.LoaderState.from_dict(state.pop(PLAN_BASE))
        if progress.num_samples != len(self.dataset):
            raise ValueError(
                f"loader state was saved for {progress.num_samples} samples but the dataset "
                f"has {len(self.dataset)}; resume with the same dataset"
            )
        if (progress.seed, progress.shuffle) != (self.config.seed, self.config.shuffle):
            raise ValueError(
                f"loader state has seed={progress.seed}, shuffle={progress.shuffle} but this "
                f"loader has seed={self.config.seed}, shuffle={self.config.shuffle}; build "
                "the loader with the saved settings"
            )
        step, steps_before = state.pop(PLAN_STEP), state.pop(STEPS_BEFORE)
        state.pop(RANK), state.pop(WORLD_SIZE)  # who saved it: any piece is whole
        same_plan = state.pop(PLAN_WORLD_SIZE) == self.world_size and state.pop(
            PLAN_KEY
        ) == self._plan_key(progress.epoch)
        self._plan, self._cached_plan, self._emitted_global = None, None, 0
        if progress.epoch_done:
            self.epoch, self._resume = progress.epoch + 1, None
        elif same_plan:
            self.epoch = progress.epoch
            self._resume = _Resume(progress.epoch, base.consumed, step, steps_before)
        else:
            self.epoch = progress.epoch
            self._resume = _Resume(progress.epoch, progress.consumed, 0, steps_before + step)
        if self._resume is not None:
            self._emitted_global = len(progress.consumed)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        resume = self._pending()
        self._resume = None
        started = time.perf_counter()
        plan = self._plan_for(resume)
        plan_s = time.perf_counter() - started
        self._plan, self._plan_epoch, self._base = plan, resume.epoch, resume.base
        self._steps_before, self._yielded = resume.steps_before, resume.step
        self._epoch_done = False
        self._emitted_global = len(resume.base) + len(_ids(plan, resume.step))
        mine = plan[self.rank]
        template = next((step[0] for step in mine if step), _first_owed(plan, resume))
        keys = [[(i, False) for i in step] if step else [(template, True)] for step in mine]
        cfg = self.config
        loader = DataLoader(
            _Keyed(self.dataset),
            batch_sampler=keys[resume.step :],
            collate_fn=self._collate,
            num_workers=cfg.num_workers,
            prefetch_factor=cfg.prefetch_factor,
        )
        self._iterations += 1
        return self._drive(loader, plan, resume, plan_s)

    # ------------------------------------------------------------------ internals

    def _drive(
        self, loader: DataLoader, plan: Plan, resume: _Resume, plan_s: float
    ) -> Iterator[dict[str, Any]]:
        group = odb.kit.AlignmentGroup(
            self._rendezvous, f"baselines/{self.method}/iter{self._iterations}/"
        )
        windows = odb.AccumulationNormalizer(self.config.grad_accum_steps, len(plan))
        metrics = odb.kit.StepMetrics()
        wait_s = exchange_s = 0.0
        last_step = len(plan[0]) - 1
        pending: list[tuple[Any, StepMeta, int]] = []
        try:
            source = iter(loader)
            for step in range(resume.step, last_step + 1):
                started = time.perf_counter()
                batch, meta = next(source)
                wait_s += time.perf_counter() - started
                meta.record(metrics, self.budget)
                pending.append((batch, meta, step))
                # Windows are aligned to epoch steps (the same on every rank, also after a
                # resume), so every rank exchanges at the same steps.
                epoch_step = resume.steps_before + step
                if (epoch_step + 1) % self.config.grad_accum_steps and step < last_step:
                    continue
                started = time.perf_counter()
                released = self._exchange(group, windows, pending)
                exchange_s += time.perf_counter() - started
                pending = []
                for batch, samples in released:
                    # Count before yielding: a loop that breaks after receiving this batch
                    # has consumed it (the generator never resumes past the yield).
                    self._yielded += 1
                    self._emitted_global += samples
                    yield batch
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                # Peers blocked in the next exchange then fail fast, naming this rank.
                group.report_failure(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            group.close()  # a rank that leaves the epoch early closes its connections
        self._epoch_done = True
        self._last_stats = dict(
            metrics.summary(),
            method=self.method,
            epoch=resume.epoch,
            data_wait_s=wait_s,
            exchange_s=exchange_s,
            exchange_bytes=group.bytes_sent,
            plan_s=plan_s,
        )

    def _exchange(
        self,
        group: odb.kit.AlignmentGroup,
        windows: odb.AccumulationNormalizer,
        pending: list[tuple[Any, StepMeta, int]],
    ) -> list[tuple[Any, int]]:
        """Sum a window's per-step counts over the ranks; attach each step's info.

        Returns ``(batch, global samples)`` per step, in order.
        """
        counts = [n for _, meta, _ in pending for n in (len(meta.ids), meta.loss_tokens)]
        totals = group.sum_counts(counts)
        released = []
        for j, item in enumerate(pending):
            released += windows.push((item, totals[2 * j], totals[2 * j + 1]), totals[2 * j + 1])
        released += windows.flush()
        out = []
        for ((batch, meta, step), samples, tokens), window_tokens, normalizer in released:
            info = (samples, tokens, window_tokens, normalizer)
            batch[odb.STEP_INFO_KEY] = self._info(meta, step, info, windows.world_size)
            out.append((batch, samples))
        return out

    def _info(self, meta: StepMeta, step: int, counts: tuple[int, ...], world: int) -> odb.StepInfo:
        global_samples, global_tokens, window_tokens, normalizer = counts
        epoch_step = self._steps_before + step
        return odb.StepInfo(
            epoch=self._plan_epoch,
            step=epoch_step,
            round=epoch_step // self.config.grad_accum_steps,
            idle=meta.idle,
            sample_ids=meta.ids,
            local_samples=len(meta.ids),
            global_samples=global_samples,
            local_loss_tokens=meta.loss_tokens,
            global_loss_tokens=global_tokens,
            accumulation_loss_tokens=window_tokens,
            loss_normalizer=normalizer,
            world_size=world,
            rank=self.rank,
        )

    def _pending(self) -> _Resume:
        return self._resume or _Resume(self.epoch, (), 0, 0)

    def _plan_for(self, resume: _Resume) -> Plan:
        key = (resume.epoch, resume.base, self.world_size)
        if self._cached_plan is None or self._cached_plan[0] != key:
            pool = self._state(resume.base, epoch=resume.epoch).remaining()
            plan = self.plan(pool, self.world_size, self.config.seed + resume.epoch)
            check_plan(plan, pool)
            self._cached_plan = (key, plan)
        return self._cached_plan[1]

    def _state(
        self, consumed: Sequence[int], done: bool = False, epoch: int | None = None
    ) -> odb.LoaderState:
        return odb.LoaderState(
            epoch=self.epoch if epoch is None else epoch,
            num_samples=len(self.dataset),
            seed=self.config.seed,
            shuffle=self.config.shuffle,
            consumed=tuple(consumed),
            epoch_done=done,
        )

    def _plan_key(self, epoch: int) -> str:
        parts = {
            "method": self.method,
            "epoch": epoch,
            "budget": [self.budget.max_tokens, self.budget.cost_model, self.budget.max_patches],
            "params": self._plan_params(),
        }
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
        for values in (self.lengths, self.patches):
            digest.update(repr(values).encode())
        return digest.hexdigest()[:16]


def _one_state(pieces: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> dict[str, Any]:
    """The whole state from a save's pieces (each is whole; they must agree)."""
    pieces = odb.kit.state_pieces(pieces)
    first = {k: v for k, v in pieces[0].items() if k != RANK}
    for piece in pieces[1:]:
        if {k: v for k, v in piece.items() if k != RANK} != first:
            raise ValueError(
                f"baseline loader state pieces of ranks {pieces[0].get(RANK)} and "
                f"{piece.get(RANK)} disagree: they come from different checkpoints or steps; "
                "pass the pieces of one save"
            )
    return dict(pieces[0])


def _ids(plan: Plan, steps: int) -> list[int]:
    """Indices every rank consumed in the first ``steps`` steps of ``plan``."""
    return [i for rank_steps in plan for step in rank_steps[:steps] for i in step]


def _first_owed(plan: Plan, resume: _Resume) -> int:
    """A sample to build this rank's IDLE batches from when it has none of its own."""
    for rank_steps in plan:
        for step in rank_steps:
            if step:
                return step[0]
    return resume.base[0] if resume.base else 0


def _check_dataset(dataset: Any) -> None:
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise TypeError(
            f"baseline loaders plan whole epochs, so they need a map-style dataset (__len__ "
            f"and __getitem__), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError("the dataset is empty; a loader needs at least one sample")


class FixedBatchLoader(PlannedLoader):
    """A method whose batches have a fixed size (``config.fixed_batch_size()``)."""

    def _setup(self) -> None:
        self.batch_size = self.config.fixed_batch_size()

    def _plan_params(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "shuffle": self.config.shuffle}


class TokenBudgetedLoader(PlannedLoader):
    """A method whose groups are sized by ``token_budget``: ``batch_size`` and
    ``cutoff_len`` are refused."""

    def _setup(self) -> None:
        for name in ("batch_size", "cutoff_len"):
            if getattr(self.config, name) is not None:
                raise ValueError(
                    f"{name}={getattr(self.config, name)} has no meaning for the "
                    f"{self.method!r} method, whose groups are sized by token_budget; "
                    f"leave {name}=None"
                )

    def _plan_params(self) -> dict[str, Any]:
        return {"shuffle": self.config.shuffle}
