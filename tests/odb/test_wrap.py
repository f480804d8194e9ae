"""``odb.wrap`` honours a DataLoader's settings, or refuses them with a clear error.

Before, a wrapped ``SubsetRandomSampler`` emitted the whole dataset, a batch sampler was
dropped, ``shuffle=False`` became ``shuffle=True`` and ``worker_init_fn``, ``pin_memory``
and ``generator`` were ignored.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, SubsetRandomSampler

import odb
from harness.scenarios import LengthDataset

LENGTHS = [(i * 17) % 90 + 1 for i in range(37)]
OPTIONS = dict(collate_mode="thread", buffer_budgets=2, queue_depth=2)
_MARK = [0]


def _ids(loader: odb.ODBLoader) -> list[int]:
    return [i for batch in loader for i in odb.pop_step_info(batch).sample_ids]


def test_subset_sampler_emits_exactly_its_subset() -> None:
    dl = DataLoader(LengthDataset(LENGTHS), sampler=SubsetRandomSampler([0, 1, 2]), batch_size=1)
    assert sorted(_ids(odb.wrap(dl, token_budget=128, **OPTIONS))) == [0, 1, 2]


def test_batch_sampler_of_single_indices_is_honoured() -> None:
    batches = BatchSampler(SubsetRandomSampler([4, 9, 30]), batch_size=1, drop_last=False)
    dl = DataLoader(LengthDataset(LENGTHS), batch_sampler=batches)
    assert sorted(_ids(odb.wrap(dl, token_budget=128, **OPTIONS))) == [4, 9, 30]
    pairs = BatchSampler(SequentialSampler(range(6)), batch_size=2, drop_last=False)
    dl = DataLoader(LengthDataset(LENGTHS), batch_sampler=pairs)
    with pytest.raises(ValueError, match="batch of 2 indices"):
        _ids(odb.wrap(dl, token_budget=128, **OPTIONS))


def test_shuffle_and_generator_are_honoured() -> None:
    dataset = LengthDataset(LENGTHS)
    plain = odb.wrap(DataLoader(dataset, batch_size=1), token_budget=128, **OPTIONS)
    assert plain.config.shuffle is False and plain.sampler is None
    shuffled = odb.wrap(DataLoader(dataset, batch_size=1, shuffle=True), token_budget=128)
    assert shuffled.config.shuffle is True and shuffled.sampler is None
    generator = torch.Generator().manual_seed(5)
    seeded_dl = DataLoader(dataset, batch_size=1, shuffle=True, generator=generator)
    seeded = odb.wrap(seeded_dl, token_budget=128, **OPTIONS)
    assert seeded.sampler is seeded_dl.sampler  # the user's RNG decides the order
    assert sorted(_ids(seeded)) == list(range(len(LENGTHS)))


class _MarkedDataset(LengthDataset):
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return dict(super().__getitem__(index), mark=torch.tensor([_MARK[0]]))


def _init_worker(worker_id: int) -> None:
    _MARK[0] = 100 + worker_id


@pytest.mark.dist
def test_worker_settings_are_carried_over() -> None:
    dl = DataLoader(
        _MarkedDataset(LENGTHS),
        batch_size=1,
        num_workers=2,
        worker_init_fn=_init_worker,
        timeout=30,
        multiprocessing_context="fork",
        prefetch_factor=3,
    )
    loader = odb.wrap(dl, token_budget=128, **OPTIONS)
    cfg = loader.config
    assert (cfg.num_workers, cfg.prefetch_factor, cfg.worker_timeout_s) == (2, 3, 30.0)
    assert cfg.worker_start_method == "fork"
    marks = {m for batch in loader for m in batch["mark"].flatten().tolist()}
    assert marks <= {100, 101} and marks, marks


def _collate(samples: list[dict]) -> dict:
    return dict(odb.PadCollate()(samples), custom=torch.tensor([len(samples)]))


def test_custom_collate_fn_is_reused_and_pin_memory_is_honoured() -> None:
    dl = DataLoader(LengthDataset(LENGTHS), batch_size=1, collate_fn=_collate, pin_memory=True)
    if torch.cuda.is_available():
        loader = odb.wrap(dl, token_budget=128, **OPTIONS)
    else:
        with pytest.warns(UserWarning, match="pin_memory=True but CUDA"):
            loader = odb.wrap(dl, token_budget=128, **OPTIONS)
    assert loader.config.pin_memory is True
    batch = next(iter(loader))
    assert int(batch["custom"][0]) == len(odb.pop_step_info(batch).sample_ids)
    assert batch["input_ids"].is_pinned() == torch.cuda.is_available()


def test_what_cannot_be_honoured_is_refused() -> None:
    dataset = LengthDataset(LENGTHS)
    with pytest.raises(ValueError, match="batch_size=1"):
        odb.wrap(DataLoader(dataset, batch_size=4), token_budget=128)
    with pytest.raises(ValueError, match="shuffle=True, but the DataLoader has shuffle=False"):
        odb.wrap(DataLoader(dataset, batch_size=1), token_budget=128, shuffle=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        dl = DataLoader(dataset, batch_size=1, num_workers=1, persistent_workers=True)
        odb.wrap(dl, token_budget=128)
