"""One rank's steps as batches: read and check samples, collate groups and IDLE steps.

The collate side's work between the round's two collectives (:mod:`odb._process.collate_epoch`):
:class:`SampleReader` is the rank's :data:`odb.core.lockstep.Pull` (each sample measured
and validated by a :class:`SampleMeter`, naming its index when it is rejected), and
:class:`StepBuilder` turns a round's :class:`odb.core.rounds.RoundOutcome` into ``T``
batches, each with its step info (the global counts follow after collective 2) and
its :class:`odb.core.lockstep.StepCounts`. IDLE steps are collated from a real sample with
every label masked, so they add zero loss while DDP's hooks still fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from odb.core.budget import GroupMeasure
from odb.core.buffer import sample_nbytes
from odb.core.config import ODBConfig
from odb.core.lockstep import Reading, StepCounts
from odb.core.metrics import EpochMetrics
from odb.core.rounds import RoundOutcome
from odb.core.step_info import STEP_INFO_KEY, StepInfo, finish_batch

LengthFn = Callable[[Any], int]


@dataclass(frozen=True)
class SampleMeter:
    """Measures one sample and rejects what ODB cannot batch, naming the index."""

    config: ODBConfig
    length_fn: LengthFn | None = None
    patches_fn: LengthFn | None = None

    def __call__(self, index: int, sample: Any) -> tuple[int, int]:
        if not isinstance(sample, Mapping):
            raise TypeError(
                f"sample {index} is a {type(sample).__name__}; ODB needs each "
                "dataset item to be a dict of fields (one sample, not a batch)"
            )
        length = self._length(index, sample)
        patches = int(self.patches_fn(sample)) if self.patches_fn is not None else 0
        if length <= 0:
            raise ValueError(
                f"sample {index} has length {length}; ODB refuses empty samples "
                "instead of dropping them silently. Filter them out of the dataset"
            )
        budget = self.config.budget
        if self.config.oversize == "error" and budget.is_oversize(length, patches):
            raise ValueError(
                f"sample {index} (length {length}, patches {patches}) exceeds "
                f"token_budget={budget.max_tokens} on its own; raise the budget, "
                "truncate the sample, or set oversize='singleton'"
            )
        return length, patches

    def _length(self, index: int, sample: Mapping[str, Any]) -> int:
        if self.length_fn is not None:
            return int(self.length_fn(sample))
        key = self.config.length_key
        if key not in sample:
            raise ValueError(
                f"sample {index} has no {key!r} (fields: {sorted(sample)}); pass "
                "length_fn or set length_key to the field that holds the tokens"
            )
        value = sample[key]
        return int(value.shape[-1]) if hasattr(value, "shape") else len(value)


class SampleReader:
    """Pulls the view's samples, measures and validates them, keeps the IDLE template.

    The :data:`odb.core.lockstep.Pull` of this rank: each sample enters the buffer as
    ``(index, sample, length)``, with the bytes of its tensors (:func:`sample_nbytes`)
    for the buffer's byte cap.
    """

    def __init__(
        self,
        config: ODBConfig,
        samples: Iterator[tuple[int, Any]],
        meter: SampleMeter,
        idle_template: Callable[[], Any],
        metrics: EpochMetrics,
    ) -> None:
        self.config = config
        self.samples = samples
        self.meter = meter
        self.idle_template = idle_template
        self.metrics = metrics
        self.template: Any = None

    def __call__(self) -> Reading | None:
        try:
            index, sample = next(self.samples)
        except StopIteration:
            return None
        return self.measure(index, sample)

    def measure(self, index: int, sample: Any) -> Reading:
        """Measure and validate one sample read from the view."""
        length, patches = self.meter(index, sample)
        if self.template is None:
            self.template = sample
        return Reading(length, patches, (index, sample, length), sample_nbytes(sample))

    def idle_sample(self) -> Any:
        """What IDLE steps are built from: the first sample read, else the template."""
        if self.template is None:
            self.template = self.idle_template()
        return self.template


class Step(NamedTuple):
    """One collated step: the batch, its step info without global counts, its counts."""

    batch: MutableMapping[str, Any]
    info: StepInfo
    counts: StepCounts


class StepBuilder:
    """Collates a round's groups and IDLE steps into batches with partial step info.

    ``epoch``, ``rank`` and ``world`` (the world size) go into every step's info.
    """

    def __init__(
        self,
        config: ODBConfig,
        collate_fn: Callable[[list[Any]], Any],
        reader: SampleReader,
        metrics: EpochMetrics,
        *,
        epoch: int,
        rank: int,
        world: int,
    ) -> None:
        self.config = config
        self.epoch = epoch
        self.rank = rank
        self.world = world
        self.collate_fn = collate_fn
        self.reader = reader
        self.metrics = metrics
        self.round = 0
        self.step = 0

    def build(self, outcome: RoundOutcome) -> list[Step]:
        """This rank's ``T`` steps of the round, real steps first."""
        out = []
        budget = self.config.budget
        for payloads in outcome.payloads:
            lengths = [length for _, _, length in payloads]
            self.metrics.record_step(budget, GroupMeasure.of(lengths))
            batch = self.collate_fn([sample for _, sample, _ in payloads])
            ids = tuple(index for index, _, _ in payloads)
            out.append(self._step(batch, ids, sum(lengths)))
        for _ in range(outcome.steps.idle):
            self.metrics.record_idle()
            out.append(self._step(self.collate_fn([self.reader.idle_sample()]), (), 0))
        self.round += 1
        return out

    def _step(self, batch: Any, ids: tuple[int, ...], real: int) -> Step:
        """Check the batch (an IDLE one masked) and give it its partial step info."""
        tokens = finish_batch(batch, self.config, idle=not ids)
        info = StepInfo(
            epoch=self.epoch,
            step=self.step,
            round=self.round,
            idle=not ids,
            sample_ids=ids,
            local_samples=len(ids),
            global_samples=0,
            local_loss_tokens=tokens,
            global_loss_tokens=0,
            accumulation_loss_tokens=0,
            loss_normalizer=1.0,
            world_size=self.world,
            rank=self.rank,
        )
        self.step += 1
        return Step(batch, info, StepCounts(len(ids), tokens, real))


def attach_step_info(
    item: tuple[MutableMapping[str, Any], StepInfo], window_tokens: int, normalizer: float
) -> MutableMapping[str, Any]:
    """Put the finished step info (its window's counts and normalizer) into the batch."""
    batch, info = item
    batch[STEP_INFO_KEY] = replace(
        info, accumulation_loss_tokens=window_tokens, loss_normalizer=normalizer
    )
    return batch
