"""Bad configuration and bad data fail with a clear error, never silently or with a hang.

Construction errors (SPEC 2.7) name the setting and what to change; data errors name the
sample index; errors raised on the collate side or in a DataLoader worker reach the
trainer with their original type and message. In process mode no child process of the
test process may outlive an error.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

import odb

MODES = ["thread", "process"]
_CHILD_WAIT_S = 10.0


class SpecDataset:
    """Item ``i`` is built from ``specs[i] = (kind, arg)``; picklable (no callables)."""

    def __init__(self, specs: list[tuple[str, Any]]) -> None:
        self.specs = specs

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, index: int) -> Any:
        kind, arg = self.specs[index]
        if kind == "raise":
            raise DatasetBoom(arg)
        ids = torch.arange(arg if isinstance(arg, int) else 4, dtype=torch.long) % 11 + 1
        if kind == "ok":
            return {"input_ids": ids, "labels": ids.clone()}
        if kind == "tuple":
            return (ids, ids.clone())
        if kind == "nokey":
            return {"tokens": ids, "labels": ids.clone()}
        if kind == "nolabels":
            return {"input_ids": ids}
        raise AssertionError(f"unknown spec kind {kind!r}")


class LambdaDataset(SpecDataset):
    """Holds a lambda, so it cannot be pickled for a collate process."""

    def __init__(self, specs: list[tuple[str, Any]]) -> None:
        super().__init__(specs)
        self.transform = lambda x: x


class DatasetBoom(RuntimeError):
    """Raised by a dataset's ``__getitem__``."""


class CollateBoom(Exception):
    """Raised by a user collate_fn."""


def list_collate(samples: list[Any]) -> list[Any]:
    return list(samples)


def raising_collate(samples: list[Any]) -> dict[str, Any]:
    raise CollateBoom(f"collate exploded on a group of {len(samples)} (marker 4242)")


def ok(n: int = 8) -> list[tuple[str, Any]]:
    return [("ok", 3 + (i * 5) % 9) for i in range(n)]


def _options(mode: str, **extra: Any) -> dict[str, Any]:
    return dict(dict(token_budget=64, collate_mode=mode, align_timeout_s=30.0), **extra)


def _drain(loader: odb.ODBLoader) -> int:
    steps = 0
    for batch in loader:
        odb.pop_step_info(batch)
        steps += 1
    return steps


def _leftover_children(before: set[int]) -> list[psutil.Process]:
    left = []
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in before:
            continue
        try:
            # Python's own per-interpreter semaphore tracker, started once by the spawn
            # context; it is shared and exits with the test process, not a leak.
            if any("resource_tracker" in part for part in proc.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        left.append(proc)
    return left


def _assert_no_children_left(before: set[int], wait_s: float = _CHILD_WAIT_S) -> None:
    deadline = time.monotonic() + wait_s
    left = _leftover_children(before)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _leftover_children(before)
    assert not left, f"child processes left after the error: {[p.pid for p in left]}"


@pytest.fixture
def no_leaked_children() -> Iterator[None]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    _assert_no_children_left(before)


def _raises_on_iter(
    loader: odb.ODBLoader, exc_type: type[BaseException], *fragments: str
) -> pytest.ExceptionInfo:
    with pytest.raises(exc_type) as info:
        _drain(loader)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in error message: {message}"
    return info


# --- construction ------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -8])
def test_token_budget_not_positive(budget: int) -> None:
    with pytest.raises(ValueError, match=r"token_budget must be >= 1"):
        odb.ODBLoader(SpecDataset(ok()), token_budget=budget, collate_mode="thread")


def test_token_budget_missing() -> None:
    with pytest.raises(ValueError, match=r"token_budget is required"):
        odb.ODBLoader(SpecDataset(ok()), collate_mode="thread")


def test_unknown_option_named() -> None:
    with pytest.raises(TypeError, match=r"tokens_per_batch.*ODBConfig"):
        odb.ODBLoader(SpecDataset(ok()), token_budget=64, tokens_per_batch=8)


def test_a_former_option_name_is_refused_with_the_new_name() -> None:
    with pytest.raises(TypeError, match=r"window_budgets was renamed buffer_budgets.*"
                       r"pass buffer_budgets=64 instead"):
        odb.ODBLoader(SpecDataset(ok()), token_budget=64, window_budgets=64)
    with pytest.raises(TypeError, match=r"window_bytes was renamed buffer_bytes"):
        odb.wrap(DataLoader(SpecDataset(ok()), batch_size=1), token_budget=64, window_bytes=2**20)


def test_wrap_rejects_batched_dataloader() -> None:
    with pytest.raises(ValueError, match=r"batch_size=1.*batch_size=4"):
        odb.wrap(DataLoader(SpecDataset(ok()), batch_size=4), token_budget=64)


@pytest.mark.dist
def test_unpicklable_dataset_with_a_spawned_collate_process(no_leaked_children: None) -> None:
    with pytest.raises(TypeError) as info:
        odb.ODBLoader(LambdaDataset(ok()), token_budget=64, collate_start_method="spawn")
    message = str(info.value)
    assert "pickle" in message and "collate_mode='thread'" in message, message
    assert "collate_start_method='fork'" in message, message
    # Both suggested fixes work: a thread, or a forked collate process (Linux's default).
    assert _drain(odb.ODBLoader(LambdaDataset(ok()), token_budget=64, collate_mode="thread")) > 0
    forked = odb.ODBLoader(LambdaDataset(ok()), token_budget=64, num_workers=1)
    assert forked.config.collate_start == "fork"
    assert _drain(forked) > 0
    del forked  # its collate process ends with it


def test_unpicklable_dataset_with_spawned_workers(no_leaked_children: None) -> None:
    with pytest.raises(TypeError, match=r"worker_start_method='spawn'.*pickle"):
        odb.ODBLoader(
            LambdaDataset(ok()),
            token_budget=64,
            num_workers=1,
            collate_start_method="fork",
            worker_start_method="spawn",
        )


# --- bad samples, collate functions and workers (both collate modes) ------------------


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_sample_not_a_dict(mode: str, no_leaked_children: None) -> None:
    specs = ok(6)
    specs[4] = ("tuple", 5)
    loader = odb.ODBLoader(SpecDataset(specs), **_options(mode))
    _raises_on_iter(loader, TypeError, "sample 4", "tuple", "dict")


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_sample_without_input_ids(mode: str, no_leaked_children: None) -> None:
    specs = ok(6)
    specs[2] = ("nokey", 5)
    loader = odb.ODBLoader(SpecDataset(specs), **_options(mode))
    _raises_on_iter(loader, ValueError, "sample 2", "'input_ids'")


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_zero_length_sample_is_an_error(mode: str, no_leaked_children: None) -> None:
    specs = ok(6)
    specs[3] = ("ok", 0)
    loader = odb.ODBLoader(SpecDataset(specs), **_options(mode))
    _raises_on_iter(loader, ValueError, "sample 3", "length 0")


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_oversize_error(mode: str, no_leaked_children: None) -> None:
    specs = ok(6)
    specs[5] = ("ok", 100)
    loader = odb.ODBLoader(SpecDataset(specs), **_options(mode, oversize="error"))
    _raises_on_iter(loader, ValueError, "sample 5", "token_budget=64", "oversize")


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_collate_fn_returning_list(mode: str, no_leaked_children: None) -> None:
    loader = odb.ODBLoader(SpecDataset(ok()), collate_fn=list_collate, **_options(mode))
    _raises_on_iter(loader, TypeError, "collate_fn", "list", "dict")


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_collate_fn_exception_reraised(mode: str, no_leaked_children: None) -> None:
    loader = odb.ODBLoader(
        SpecDataset(ok()), collate_fn=raising_collate, **_options(mode, num_workers=0)
    )
    info = _raises_on_iter(loader, CollateBoom, "collate exploded", "marker 4242")
    assert type(info.value) is CollateBoom
    assert "raising_collate" in str(info.value.__cause__), "remote traceback not attached"


def _worker_error_loader(mode: str) -> odb.ODBLoader:
    specs = ok(6)
    specs[1] = ("raise", "dataset item exploded (marker 5151)")
    return odb.ODBLoader(SpecDataset(specs), **_options(mode, num_workers=1))


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_dataset_exception_in_worker_reraised(mode: str) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    info = _raises_on_iter(
        _worker_error_loader(mode), DatasetBoom, "dataset item exploded (marker 5151)"
    )
    assert type(info.value) is DatasetBoom
    if mode == "process":
        _assert_no_children_left(before)


@pytest.mark.dist
def test_thread_mode_worker_stopped_after_error() -> None:
    # The worker must stop when the error is raised, not whenever the cyclic garbage
    # collector happens to run (which made this check flaky with the collector on).
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    gc.collect()
    gc.disable()
    try:
        _raises_on_iter(_worker_error_loader("thread"), DatasetBoom, "marker 5151")
        _assert_no_children_left(before, wait_s=2.0)
    finally:
        gc.enable()
        gc.collect()


@pytest.mark.dist
@pytest.mark.parametrize("mode", MODES)
def test_batch_without_labels(mode: str, no_leaked_children: None) -> None:
    specs = [("nolabels", 4 + i) for i in range(5)]
    loader = odb.ODBLoader(SpecDataset(specs), **_options(mode))
    _raises_on_iter(loader, ValueError, "'labels'", "label_key")
