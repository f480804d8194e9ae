"""Seeded random loader scenarios shared by the distributed tests and the soak bench.

A scenario fixes a dataset of token lengths (with per-rank length profiles when the
order is not shuffled, so views differ in size *and* in shape), the loader settings,
the number of epochs and the *set-up*: who decides which samples a rank reads
(``SETUPS``: ODB dealing one dataset, a user's global sampler, per-rank datasets, a
pre-sharded stream, a stream that shards itself over workers). Whatever the set-up,
sample ``i`` of the scenario is ``lengths[i]`` and is reported as id ``i``, so the
same checks apply. Rank 0 alone also takes its state piece mid-epoch (``save_step``),
which must return at once (it is not a collective). :func:`run_scenario` runs it on
one rank and records what the rank yielded; :func:`check_scenario` checks the
protocol's guarantees across ranks.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

import odb

DISTRIBUTIONS = ("uniform", "longtail", "bimodal", "oversize")
SETUPS = ("global", "sampler", "per_rank", "stream_rank", "stream_worker")


class LengthDataset:
    """Map-style dataset whose item ``i`` is a sample of ``lengths[i]`` tokens.

    ``work``: matrix products (384 x 384, a few ms each) a sample costs before it is
    made, as a decode or a transform would (0: none).
    """

    def __init__(self, lengths: list[int], work: int = 0) -> None:
        self.lengths, self.work = lengths, work

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.work:
            x = torch.randn(384, 384, generator=torch.Generator().manual_seed(index))
            for _ in range(self.work):
                x = torch.tanh(x @ x)  # each product releases and re-takes the GIL
        return make_sample(index, self.lengths[index])


def make_sample(index: int, length: int) -> dict[str, torch.Tensor]:
    """Sample ``index`` of ``length`` tokens; its ``index`` field names it."""
    ids = torch.arange(length, dtype=torch.long) % 97 + 3
    labels = ids.clone()
    labels[: len(labels) // 3] = -100  # a masked prompt: loss tokens != input tokens
    return {"input_ids": ids, "labels": labels, "index": torch.tensor([index])}


class OwnStream(IterableDataset):
    """A pre-sharded stream: rank ``r`` of ``W`` holds samples ``r, r + W, ...`` only."""

    def __init__(self, lengths: list[int], rank: int, world_size: int) -> None:
        self.lengths, self.ids = lengths, list(range(rank, len(lengths), world_size))

    def __iter__(self):
        for i in self.ids:
            yield make_sample(i, self.lengths[i])


class WorkerShardedStream(IterableDataset):
    """A stream that splits itself over DataLoader workers (as Hugging Face streams do)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, len(self.lengths), workers):
            yield make_sample(i, self.lengths[i])


@dataclass(frozen=True)
class Scenario:
    seed: int
    world_size: int
    lengths: list[int]
    options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 1
    setup: str = "global"
    save_step: int = 0  # rank 0 alone takes its state piece after this step (0: never)
    work: int = 0  # torch work per sample of a map-style dataset (LengthDataset)


def draw_lengths(
    rng: random.Random, n: int, budget: int, world_size: int, skewed: bool
) -> list[int]:
    """Lengths for ``n`` samples; with ``skewed``, index ``i`` follows rank ``i % W``'s profile."""
    profiles = [rng.choice(DISTRIBUTIONS) for _ in range(world_size)]
    out = []
    for i in range(n):
        kind = profiles[i % world_size] if skewed else profiles[0]
        if kind == "uniform":
            out.append(rng.randint(1, max(1, budget // 2)))
        elif kind == "longtail":
            out.append(max(1, min(int(rng.lognormvariate(2.5, 1.2)), 3 * budget)))
        elif kind == "bimodal":
            out.append(
                rng.randint(1, 8) if rng.random() < 0.7 else rng.randint(budget // 3, budget)
            )
        else:
            out.append(
                rng.randint(budget + 1, 2 * budget)
                if rng.random() < 0.1
                else rng.randint(1, budget)
            )
    return out


def draw_scenario(seed: int, world_size: int, mode: str = "thread") -> Scenario:
    rng = random.Random(seed)
    budget = rng.choice([16, 64, 256, 1024])
    n = rng.choice([0, 1, world_size - 1, rng.randint(world_size, 40), rng.randint(40, 160)])
    skewed = rng.random() < 0.5
    options = dict(
        token_budget=budget,
        policy=rng.choice(["balanced", "paper"]),
        join=rng.random() < 0.7,
        grad_accum_steps=rng.choice([1, 1, 2, 3]),
        buffer_budgets=rng.choice([1, 2, 8, 64]),
        buffer_size=rng.choice([4, 16, 256]),
        queue_depth=rng.choice([1, 2, 8]),
        age_limit=rng.choice([1, 4, 16]),
        shuffle=not skewed,
        seed=rng.randint(0, 1000),
        collate_mode=mode,
        align_timeout_s=60.0,
    )
    lengths = draw_lengths(rng, max(n, 0), budget, world_size, skewed)
    epochs = rng.choice([1, 2, 3])
    # Even seeds fork the collate process (the default on Linux), odd ones spawn it; no
    # draw, so every seed's scenario stays what it was.
    if mode == "process" and seed % 2 == 1:
        options["collate_start_method"] = "spawn"
    return Scenario(seed, world_size, lengths, options, epochs=epochs)


def build_loader(scenario: Scenario, rank: int, world_size: int) -> tuple[odb.ODBLoader, Any]:
    """The scenario's loader on this rank, and the map from what it yields to sample ids.

    The map is a list (local index -> id) for per-rank datasets, ``"field"`` when the id
    is read from the batch's ``index`` field (streams), None when ids are the loader's.
    """
    lengths, options, setup = scenario.lengths, scenario.options, scenario.setup
    if setup == "global":
        return odb.ODBLoader(LengthDataset(lengths, scenario.work), **options), None
    if setup == "sampler":
        order = random.Random(scenario.seed).sample(range(len(lengths)), len(lengths))
        dataset = LengthDataset(lengths, scenario.work)
        return odb.ODBLoader(dataset, sampler=order, shard="odb", **options), None
    if setup == "per_rank":
        own = list(range(rank, len(lengths), world_size))
        dataset = LengthDataset([lengths[i] for i in own], scenario.work)
        return odb.ODBLoader(dataset, shard="rank", **options), own
    if setup == "stream_rank":
        stream = OwnStream(lengths, rank, world_size)
        return odb.ODBLoader(stream, shard="rank", **options), "field"
    return odb.ODBLoader(WorkerShardedStream(lengths), shard="worker", **options), "field"


def run_scenario(scenario: Scenario) -> list[dict[str, Any]]:
    """Iterate every epoch on this rank; one record per epoch."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    loader, ids_of = build_loader(scenario, rank, world)
    records = []
    for epoch in range(scenario.epochs):
        loader.set_epoch(epoch)
        steps = []
        for batch in loader:
            info = odb.pop_step_info(batch)
            ids = batch["index"].flatten().tolist()
            if ids_of == "field":
                ids = [] if info.idle else ids
            else:
                assert list(info.sample_ids) == ([] if info.idle else ids), (info.sample_ids, ids)
                ids = [i if ids_of is None else ids_of[i] for i in info.sample_ids]
            steps.append(
                dict(
                    ids=ids,
                    idle=info.idle,
                    shape=tuple(batch["input_ids"].shape),
                    local_tokens=info.local_loss_tokens,
                    global_tokens=info.global_loss_tokens,
                    window_tokens=info.accumulation_loss_tokens,
                    normalizer=info.loss_normalizer,
                    local_samples=info.local_samples,
                    global_samples=info.global_samples,
                    masked=bool((batch["labels"] == -100).all()),
                    step=info.step,
                )
            )
            if rank == 0 and info.step + 1 == scenario.save_step:
                loader.state_dict()  # rank 0 alone: a collective here would hang the run
        # This rank's piece of the state: its share of the ids carried into the next epoch.
        carry_next = loader.state_dict()["carry_next"]
        records.append(dict(steps=steps, stats=loader.stats(), carry_next=carry_next))
    return records


def check_scenario(scenario: Scenario, per_rank: list[list[dict[str, Any]]]) -> None:
    """Assert the protocol's guarantees on what every rank yielded."""
    opts = scenario.options
    world, budget = scenario.world_size, opts["token_budget"]
    lengths = scenario.lengths
    carried_before = 0
    carry_in: list[int] = []
    for epoch in range(scenario.epochs):
        epochs = [records[epoch] for records in per_rank]
        counts = [len(e["steps"]) for e in epochs]
        assert len(set(counts)) == 1, f"epoch {epoch}: step counts differ across ranks: {counts}"
        for step in range(counts[0]):
            rows = [e["steps"][step] for e in epochs]
            assert {r["step"] for r in rows} == {step}
            assert {r["global_samples"] for r in rows} == {sum(r["local_samples"] for r in rows)}
            assert {r["global_tokens"] for r in rows} == {sum(r["local_tokens"] for r in rows)}
            assert len({r["normalizer"] for r in rows}) == 1
            for r in rows:
                assert r["normalizer"] == max(r["window_tokens"], 1) / world
                if r["idle"]:
                    assert r["masked"] and r["local_tokens"] == 0 and r["shape"][0] == 1
                elif len(r["ids"]) > 1:
                    cost = max(lengths[i] for i in r["ids"]) * len(r["ids"])
                    assert cost <= budget, f"group {r['ids']} costs {cost} > budget {budget}"
        _check_windows(epochs[0]["steps"], opts["grad_accum_steps"])
        emitted = [i for e in epochs for s in e["steps"] for i in s["ids"]]
        carried = sum(e["stats"]["carried"] for e in epochs)
        if opts["join"]:
            assert sorted(emitted) == list(range(len(lengths))), "join: ids lost or duplicated"
            assert carried == 0
        else:
            # An index may occur twice in an epoch only as a carried sample of the last
            # epoch plus its fresh copy of this one (identity is (origin epoch, index)).
            extra = Counter(emitted) - (Counter(range(len(lengths))) + Counter(carry_in))
            assert not extra, f"non-join: ids emitted more often than owed: {dict(extra)}"
            assert len(emitted) + carried == len(lengths) + carried_before, "quota closure broken"
            bound = 2 * opts["buffer_size"] + 1
            for e in epochs:
                assert e["stats"]["carried"] <= bound + 1, (
                    f"carry {e['stats']['carried']} > {bound}"
                )
            carried_before = carried
            carry_in = [i for e in epochs for i in e["carry_next"]]
        for e in epochs:
            stats = e["stats"]
            assert stats["tail_rounds"] <= max(stats["tail_start_buffered"], 0), stats


def _check_windows(steps: list[dict[str, Any]], window: int) -> None:
    for start in range(0, len(steps), window):
        chunk = steps[start : start + window]
        assert {s["window_tokens"] for s in chunk} == {sum(s["global_tokens"] for s in chunk)}
