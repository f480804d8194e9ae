"""The rendezvous store's defences, on a real TCPStore (one process): values only the
loader's ranks can make, and a listener on 127.0.0.1 only when every rank is local. The
same against a stranger writing into a running job: tests/odb/test_faults.py."""

from __future__ import annotations

import datetime

import psutil
import pytest
import torch.distributed as dist

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
