"""The baseline loaders' resume state: its keys, its checks, and how a restore continues.

ODB's contract, kept by every baseline: every rank's ``state_dict()`` is its piece, taken
without a collective, and ``load_state_dict`` takes the list of pieces (or one dict). The
plan is a pure function of the seed, the epoch, the pool and the world size, so each
rank knows what *every* rank has consumed after ``k`` steps: a baseline's piece is
already the whole state (pieces of one save agree; any one of them restores). A restore
with the same world size and plan replays the plan from step ``k`` (the remaining
batches are identical); otherwise the samples still owed are re-planned over the
current ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import odb
import odb.kit
from baselines.config import BaselineConfig
from baselines.plans import Plan

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
class Resume:
    """How the next ``iter()`` continues a restored epoch."""

    epoch: int
    base: tuple[int, ...]  # consumed before the plan to run was made
    step: int  # steps of that plan already consumed
    steps_before: int  # epoch steps run before that plan (numbering continues)


@dataclass(frozen=True)
class SavedState:
    """A checked save: where its epoch stood and which plan it ran."""

    progress: odb.LoaderState  # every sample consumed this epoch, over all ranks
    base: odb.LoaderState  # those consumed before the saved plan was made
    step: int  # steps of the saved plan consumed
    steps_before: int  # epoch steps run before that plan
    plan_world_size: int
    plan_key: str

    def resume(self, same_plan: bool) -> Resume | None:
        """How the next ``iter()`` continues; ``None`` when the saved epoch had finished.

        ``same_plan``: the restoring loader makes the saved plan again (same world size
        and plan key), so its remaining steps replay; otherwise the owed samples are
        re-planned.
        """
        epoch = self.progress.epoch
        if self.progress.epoch_done:
            return None
        if same_plan:
            return Resume(epoch, self.base.consumed, self.step, self.steps_before)
        return Resume(epoch, self.progress.consumed, 0, self.steps_before + self.step)


def parse_state(
    state_dict: Sequence[Mapping[str, Any]] | Mapping[str, Any],
    method: str,
    owner: str,
    num_samples: int,
    config: BaselineConfig,
) -> SavedState:
    """Check a save's pieces against the restoring loader and read them.

    Raises:
        ValueError: the pieces disagree, or were saved by another method, for another
            dataset size, seed or shuffle setting.
    """
    state = _one_state(state_dict)
    odb.kit.check_state_keys(state, STATE_KEYS, owner)
    saved_method = state.pop(METHOD)
    if saved_method != method:
        raise ValueError(
            f"the state was saved by a {saved_method!r} loader; this loader is "
            f"{method!r}. Resume with the same method"
        )
    progress = odb.LoaderState.from_dict(state.pop(PROGRESS))
    if progress.num_samples != num_samples:
        raise ValueError(
            f"loader state was saved for {progress.num_samples} samples but the dataset "
            f"has {num_samples}; resume with the same dataset"
        )
    if (progress.seed, progress.shuffle) != (config.seed, config.shuffle):
        raise ValueError(
            f"loader state has seed={progress.seed}, shuffle={progress.shuffle} but this "
            f"loader has seed={config.seed}, shuffle={config.shuffle}; build "
            "the loader with the saved settings"
        )
    base = odb.LoaderState.from_dict(state.pop(PLAN_BASE))
    return SavedState(progress, base, state.pop(PLAN_STEP), state.pop(STEPS_BEFORE),
                      state.pop(PLAN_WORLD_SIZE), state.pop(PLAN_KEY))


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


def consumed_ids(plan: Plan, steps: int) -> list[int]:
    """Indices every rank consumed in the first ``steps`` steps of ``plan``."""
    return [i for rank_steps in plan for step in rank_steps[:steps] for i in step]


def first_owed(plan: Plan, resume: Resume) -> int:
    """A sample to build this rank's IDLE batches from when it has none of its own."""
    for rank_steps in plan:
        for step in rank_steps:
            if step:
                return step[0]
    return resume.base[0] if resume.base else 0

