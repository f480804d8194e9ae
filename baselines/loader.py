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
  contract (:mod:`baselines.loader_state`).
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
from typing import Any, ClassVar

from torch.utils.data import DataLoader

import odb
import odb.kit
from baselines.config import BaselineConfig
from baselines.length_cache import LengthSource, resolve_lengths
from baselines.loader_state import (
    METHOD,
    PLAN_BASE,
    PLAN_KEY,
    PLAN_STEP,
    PLAN_WORLD_SIZE,
    PROGRESS,
    RANK,
    STEPS_BEFORE,
    WORLD_SIZE,
    Resume,
    consumed_ids,
    first_owed,
    parse_state,
)
from baselines.measure import default_patches
from baselines.plans import Plan, check_plan
from baselines.steps import Keyed, StepCollate, StepMeta, check_dataset, sum_window

__all__ = ["PlannedLoader"]

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
        check_dataset(dataset)
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
        self._collate = StepCollate(
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
        self._resume: Resume | None = None
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
            consumed = list(base) + consumed_ids(self._plan_for(resume), step)
            epoch = resume.epoch
            plan_key = self._plan_key(epoch)
        else:
            epoch = self._plan_epoch
            plan_world, step = len(self._plan), self._yielded
            base, steps_before, done = self._base, self._steps_before, self._epoch_done
            consumed = list(base) + consumed_ids(self._plan, step)
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
        saved = parse_state(
            state_dict, self.method, type(self).__name__, len(self.dataset), self.config
        )
        same_plan = saved.plan_world_size == self.world_size and saved.plan_key == (
            self._plan_key(saved.progress.epoch)
        )
        self._plan, self._cached_plan, self._emitted_global = None, None, 0
        self._resume = saved.resume(same_plan)
        done = saved.progress.epoch_done
        self.epoch = saved.progress.epoch + 1 if done else saved.progress.epoch
        if self._resume is not None:
            self._emitted_global = len(saved.progress.consumed)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        resume = self._pending()
        self._resume = None
        started = time.perf_counter()
        plan = self._plan_for(resume)
        plan_s = time.perf_counter() - started
        self._plan, self._plan_epoch, self._base = plan, resume.epoch, resume.base
        self._steps_before, self._yielded = resume.steps_before, resume.step
        self._epoch_done = False
        self._emitted_global = len(resume.base) + len(consumed_ids(plan, resume.step))
        mine = plan[self.rank]
        template = next((step[0] for step in mine if step), first_owed(plan, resume))
        keys = [[(i, False) for i in step] if step else [(template, True)] for step in mine]
        cfg = self.config
        loader = DataLoader(
            Keyed(self.dataset),
            batch_sampler=keys[resume.step :],
            collate_fn=self._collate,
            num_workers=cfg.num_workers,
            prefetch_factor=cfg.prefetch_factor,
        )
        self._iterations += 1
        return self._drive(loader, plan, resume, plan_s)

    # ------------------------------------------------------------------ internals

    def _drive(
        self, loader: DataLoader, plan: Plan, resume: Resume, plan_s: float
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
        out = []
        for (batch, meta, step), counts in sum_window(group, windows, pending):
            batch[odb.STEP_INFO_KEY] = self._info(meta, step, counts, windows.world_size)
            out.append((batch, counts[0]))
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

    def _pending(self) -> Resume:
        return self._resume or Resume(self.epoch, (), 0, 0)

    def _plan_for(self, resume: Resume) -> Plan:
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
