"""The rendezvous store's defences, on a real TCPStore (one process): values only the
loader's ranks can make, and a listener on 127.0.0.1 only when every rank is local. The
same against a stranger writing into a running job: tests/odb/test_faults.py."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import threading
import time

import psutil
import pytest
import torch.distributed as dist

from odb._process import comm
from odb._process.rendezvous import Rendezvous, SignedStore, StoreForgeryError, StoreHost


def _rendezvous(host: StoreHost, secret: bytes) -> Rendezvous:
    return Rendezvous(host.host, host.port, 0, 2, 5.0, 5.0, secret=secret)


def _raw_client(host: StoreHost) -> dist.TCPStore:
    return dist.TCPStore(
        host.host, host.port, is_master=False, timeout=datetime.timedelta(seconds=5)
    )


def test_signed_values_round_trip_and_the_secret_stays_out_of_repr() -> None:
    host = StoreHost("127.0.0.1", 5.0, loopback=True)
    store = SignedStore(_rendezvous(host, b"s" * 32), "odb/iter1/", 5.0)
    store.set("0/0", b"\x00address\xff")
    store.wait(["0/0"])
    assert store.check(["0/0"]) and store.get("0/0") == b"\x00address\xff"
    assert "s" * 32 not in repr(_rendezvous(host, b"s" * 32))


@pytest.mark.parametrize(
    "forge",
    ["a stranger's bytes", "another loader's secret", "a value replayed under another key"],
)
def test_a_value_the_ranks_did_not_write_is_refused_naming_the_store(forge: str) -> None:
    host = StoreHost("127.0.0.1", 5.0, loopback=True)
    ours = SignedStore(_rendezvous(host, b"a" * 32), "odb/iter2/", 5.0)
    if forge == "a stranger's bytes":
        dist.PrefixStore("odb/iter2/", _raw_client(host)).set("0/1", b"x" * 80)
    elif forge == "another loader's secret":
        SignedStore(_rendezvous(host, b"b" * 32), "odb/iter2/", 5.0).set("0/1", b"addr")
    else:  # genuine values, copied from another epoch and from rank 0's key
        SignedStore(_rendezvous(host, b"a" * 32), "odb/iter1/", 5.0).set("0/1", b"addr")
        ours.set("0/0", b"addr")
        epoch1, epoch2 = (
            dist.PrefixStore(p, _raw_client(host)) for p in ("odb/iter1/", "odb/iter2/")
        )
        epoch2.set("0/1", epoch1.get("0/1"))
        with pytest.raises(StoreForgeryError):
            ours.get("0/1")
        epoch2.set("0/1", epoch2.get("0/0"))
    with pytest.raises(StoreForgeryError) as caught:
        ours.get("0/1")
    message = str(caught.value)
    assert f"127.0.0.1:{host.port}" in message and "'odb/iter2/0/1'" in message


def test_a_store_for_one_node_listens_on_loopback_only() -> None:
    host = StoreHost("127.0.0.1", 5.0, loopback=True)
    listening = [
        c.laddr
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == host.port
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


# --- a peer that leaves the rendezvous halfway ------------------------------------------

_INIT_S = 2.0


class _LeavingStore(SignedStore):
    """Rank 1's store: its own key is published, then reading rank 0's fails (as when
    the rank reads a stranger's value), so the rank leaves before connecting."""

    def get(self, key: str) -> bytes:
        if key.endswith("/0"):
            raise RuntimeError("rank 1 leaves the rendezvous halfway")
        return super().get(key)


def _leave_halfway(rendezvous: Rendezvous, prefixes: mp.Queue, left: mp.Queue) -> None:
    """Rank 1: for each prefix, join that rendezvous and leave it halfway; stays alive."""
    comm.SignedStore = _LeavingStore  # this child process only
    while (prefix := prefixes.get()) is not None:
        try:
            comm.AlignmentGroup(rendezvous, prefix)
            left.put("joined")
        except RuntimeError:
            left.put("left")


@pytest.mark.dist
def test_a_peer_that_leaves_the_rendezvous_halfway_ends_it_within_init_timeout() -> None:
    # Gloo waits five times its timeout for a peer to connect; the group is built so that
    # the wait ends within init_timeout_s. Which side of the pair waits (listens) is
    # drawn from the ports, so trials run until rank 0 was the one waiting.
    host = StoreHost("127.0.0.1", 30.0, loopback=True)
    where = f"{host.host}:{host.port}"
    ranks = [Rendezvous(host.host, host.port, r, 2, _INIT_S, _INIT_S, b"k" * 32) for r in (0, 1)]
    ctx = mp.get_context("spawn")
    prefixes, left = ctx.Queue(), ctx.Queue()
    peer = ctx.Process(target=_leave_halfway, args=(ranks[1], prefixes, left), daemon=True)
    peer.start()
    outcomes = []
    try:
        for trial in range(12):
            prefix = f"odb/trial{trial}/"
            prefixes.put(prefix)
            assert left.get(timeout=120) == "left"
            started = time.monotonic()
            with pytest.raises(RuntimeError) as caught:
                comm.AlignmentGroup(ranks[0], prefix).sum_counts([1])
            outcomes.append((time.monotonic() - started, str(caught.value)))
            if "Connect timeout" in outcomes[-1][1]:
                break
    finally:
        prefixes.put(None)
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    for waited, message in outcomes:  # init_timeout_s, a 2 s wait for a note, slack
        assert waited <= _INIT_S + 2.0 + 3.0, outcomes
        assert where in message or "collate side is gone" in message, outcomes
    if not any("Connect timeout" in message for _, message in outcomes):
        pytest.skip(f"rank 0 was never the side that waits in {len(outcomes)} draws")


# --- a rank asked to stop reads no failure notes ----------------------------------------


class _StopAfter(comm.AlignmentGroup):
    """Rank 0's group, asked to stop once it has read the peers' notes ``reads`` times
    (``None``: never asked)."""

    reads: int | None = None

    def stop_requested(self) -> bool:
        return self.reads is not None and self.note_reads >= self.reads


def _pair(reads: int | None) -> tuple[_StopAfter, comm.AlignmentGroup]:
    """Rank 0 and rank 1 of one real Gloo group (two threads meet; loopback store)."""
    host = StoreHost("127.0.0.1", 10.0, loopback=True)
    ranks = [Rendezvous(host.host, host.port, r, 2, 10.0, 10.0, b"n" * 32) for r in (0, 1)]
    groups: list[comm.AlignmentGroup] = [None, None]  # type: ignore[list-item]

    def meet(rank: int) -> None:
        kind = _StopAfter if rank == 0 else comm.AlignmentGroup
        groups[rank] = kind(ranks[rank], "odb/stop/")

    threads = [threading.Thread(target=meet, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    first = groups[0]
    assert isinstance(first, _StopAfter)
    first.reads = reads
    first.host = host  # type: ignore[attr-defined]  # kept alive with the group
    return first, groups[1]


@pytest.mark.parametrize(
    "reads", [0, 1, None], ids=["stopped-before", "stopped-while-waiting", "not-stopped"]
)
def test_a_rank_asked_to_stop_waits_for_no_failure_note(reads: int | None) -> None:
    # Rank 1 stops without a note (a break); rank 0's collective then fails on the
    # closed connection. Not stopping, rank 0 polls for a note for _NOTE_WAIT_S; asked
    # to stop (before, or while it waits) it reads no more.
    ours, peer = _pair(reads)
    peer.close()
    with pytest.raises(comm.AlignmentTimeoutError, match="collate side is gone"):
        ours.sum_counts([1])
    ours.close()
    if reads is None:
        assert ours.note_reads > 1  # the wait this test is about exists
    else:
        assert ours.note_reads == reads
