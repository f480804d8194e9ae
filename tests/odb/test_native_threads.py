"""No native thread of ODB outlives a loader: the exit path, counted in ``/proc/self/task``.

ODB's native threads are those of the Gloo alignment groups (``gloo_tcp_loop``,
``pt_gloo_runloop``) and of rank 0's rendezvous store (``pt_tcpstore_uv``). A rank
counts its threads by name before it builds a loader and after the loader is closed,
by :meth:`odb.ODBLoader.close` or by the interpreter's exit hook (run here without
exiting), with one iterator finished and one held mid-epoch, in thread and process
mode at W = 1 and W = 2 (real ranks over Gloo on loopback; the trainers' own group has
Gloo threads too, counted before). None of ODB's may be left: one left joinable at
static destruction aborts the process at exit ("terminate called without an active
exception").
"""

from __future__ import annotations

from collections import Counter

import pytest

import odb
from harness.scenarios import LengthDataset
from harness.threads import thread_names
from odb._process import trainer_runner
from odb._process.rendezvous import StoreHost
from tests.odb.rank_calls import LazyCalls

pytestmark = pytest.mark.dist

ODB_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop", "pt_tcpstore_uv")
_CASES = [
    (world, mode, end)
    for world in (1, 2)
    for mode in ("thread", "process")
    for end in ("close", "exit hook")
]


def native_threads(since: dict[int, str] | None = None) -> Counter[str]:
    """ODB's kinds of thread, by name; with ``since``, only threads not in it.

    By thread id, not by name: a thread names itself once it runs, so a thread of the
    trainers' group started a moment before ``since`` may still carry the process's
    name there.
    """
    old = since or {}
    return Counter(n for t, n in thread_names().items() if n in ODB_THREADS and t not in old)


def _loader_threads(rank: int, world_size: int, mode: str, end: str) -> dict[str, dict]:
    """Rank body: ODB's threads before the loader, while it runs, and after it ends."""
    del rank, world_size
    before = thread_names()
    loader = odb.ODBLoader(
        LengthDataset([8 + i % 24 for i in range(96)]),
        token_budget=64,
        collate_mode=mode,
        num_workers=0,
        seed=0,
    )
    for _ in loader:  # one epoch to its end
        pass
    held = iter(loader)  # one held mid-epoch, as at exit with a live iterator
    next(held)
    during = native_threads(before)
    if end == "close":
        loader.close()
    else:
        trainer_runner._close_live_runners()  # the exit hook, without exiting
    left = native_threads(before)
    del held
    return {"during": dict(during), "left": dict(left)}


@pytest.fixture(scope="module")
def threads() -> LazyCalls:
    return LazyCalls({case: (case[0], _loader_threads, case[1:]) for case in _CASES}, timeout=240)


@pytest.mark.parametrize("case", _CASES, ids=["-".join(map(str, c)) for c in _CASES])
def test_no_native_thread_of_odb_is_left_after_close(
    threads: LazyCalls, case: tuple[int, str, str]
) -> None:
    world, mode, _ = case
    for rank, seen in enumerate(threads[case]):
        assert seen["left"] == {}, f"rank {rank} of {world}: {seen}"
        if world == 2 and rank == 0:  # the check sees them: the store ran
            assert seen["during"].get("pt_tcpstore_uv") == 1, seen
        if world == 2 and mode == "thread":  # the collate thread's group ran here
            assert seen["during"].get("pt_gloo_runloop", 0) > 0, f"rank {rank}: {seen}"


def test_a_store_host_joins_its_server_thread_at_close() -> None:
    before = native_threads()["pt_tcpstore_uv"]
    host = StoreHost("127.0.0.1", 5.0, loopback=True)
    assert native_threads()["pt_tcpstore_uv"] == before + 1
    host.close()
    host.close()  # idempotent
    assert native_threads()["pt_tcpstore_uv"] == before and host.closed


def test_a_closed_loader_refuses_a_new_epoch() -> None:
    loader = odb.ODBLoader(LengthDataset([4] * 8), token_budget=16, collate_mode="thread")
    loader.close()
    loader.close()
    with pytest.raises(RuntimeError, match="close"):
        iter(loader)
