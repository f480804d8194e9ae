"""Alignment round latency and bytes vs world size, over real Gloo on loopback.

For each world size ``W`` (default 1..8) the parent hosts the store with
:class:`odb._process.rendezvous.StoreHost` on 127.0.0.1 and spawns ``W`` processes.
Each builds :class:`odb._process.comm.AlignmentGroup` from an
:class:`odb._process.rendezvous.Rendezvous` (what an ODB collate process does) and,
in the same run, a raw ``ProcessGroupGloo`` under another store prefix. Per round
(after a warm-up) it times, alternating which goes first:

* ``gather_status``: ODB's status all-gather (one ``STATUS_WIDTH``-int64 row per rank,
  encode/decode included);
* ``raw``: a bare ``allgather`` of an int64 tensor of the same size on the raw group.

Bytes per rank per round are read from ``AlignmentGroup.bytes_sent`` after the status
gathers only (must be 64 B = 8 x int64, whatever the buffer holds); the round's count
all-reduce (``sum_counts`` of an :class:`odb.core.lockstep.RoundCounts` row: samples, loss
tokens and real tokens per step, plus the epoch's reads: ``3 T + 2`` int64) is measured
separately, per step, for a round of ``--steps-per-round`` steps.

Absolute microseconds on a 2-core machine with up to 8 processes say little; compare
``gather_status`` with ``raw`` in the same run (ratio), and the trend over ``W``.

    python -m bench.alignment --out results/bench/alignment.json
"""

from __future__ import annotations

import datetime
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench import _io
from odb._process.comm import AlignmentGroup
from odb._process.rendezvous import Rendezvous, StoreHost
from odb.core.alignment import STATUS_WIDTH, RankStatus
from odb.core.lockstep import RoundCounts, StepCounts

HOST = "127.0.0.1"


def _rank_main(rank: int, world: int, port: int, rounds: int, warmup: int, steps: int, out) -> None:
    """One rank: time the status gathers and the count all-reduce; put its figures on
    ``out``."""
    torch.set_num_threads(1)
    group, raw = _groups(rank, world, port)
    odb_t, raw_t, gather_bytes = _time_status_gathers(group, raw, rank, world, rounds, warmup)
    reduce_s, reduce_bytes = _time_sum_counts(group, raw, rank, rounds, steps)
    raw.barrier().wait()
    out.put(
        {
            "rank": rank,
            "odb": odb_t,
            "raw": raw_t,
            "gather_bytes_per_round": gather_bytes / rounds,
            "sum_counts_bytes_per_step": reduce_bytes / steps,
            "sum_counts_us_per_round": reduce_s * 1e6,
        }
    )


def _groups(rank: int, world: int, port: int) -> tuple[AlignmentGroup, Any]:
    """ODB's alignment group (as a collate process builds it) and a raw
    ``ProcessGroupGloo`` on the same store, under another prefix."""
    rdv = Rendezvous(HOST, port, rank, world, init_timeout_s=120.0, align_timeout_s=120.0)
    group = AlignmentGroup(rdv, f"bench/align/W{world}/")
    store = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=120))
    raw = dist.ProcessGroupGloo(
        dist.PrefixStore(f"bench/raw/W{world}/", store),
        rank,
        world,
        datetime.timedelta(seconds=120),
    )
    return group, raw


def _time_status_gathers(
    group: AlignmentGroup, raw, rank: int, world: int, rounds: int, warmup: int
) -> tuple[list[float], list[float], int]:
    """(seconds of each ``gather_status`` round, of each raw allgather round, bytes
    ``group`` sent in the timed status rounds).

    After ``warmup`` untimed rounds of each, ``rounds`` of each are timed, alternating
    which goes first.
    """
    row = RankStatus(
        ready=rank + 3,
        buffered=1000 * (rank + 1),
        read_done=False,
        read_count=50 * rank,
        free_slots=8,
    ).to_row()
    mine = torch.tensor(row, dtype=torch.int64)

    def odb_round() -> float:
        t = time.perf_counter()
        rows = group.gather_status(row)
        [RankStatus.from_row(r) for r in rows]
        return time.perf_counter() - t

    def raw_round() -> float:
        t = time.perf_counter()
        bufs = [torch.empty(STATUS_WIDTH, dtype=torch.int64) for _ in range(world)]
        raw.allgather([bufs], [mine]).wait()
        return time.perf_counter() - t

    for _ in range(warmup):
        odb_round()
        raw_round()
    raw.barrier().wait()
    bytes_before = group.bytes_sent
    odb_t, raw_t = [], []
    for i in range(rounds):
        if i % 2 == 0:
            odb_t.append(odb_round())
            raw_t.append(raw_round())
        else:
            raw_t.append(raw_round())
            odb_t.append(odb_round())
    return odb_t, raw_t, group.bytes_sent - bytes_before


def _time_sum_counts(
    group: AlignmentGroup, raw, rank: int, rounds: int, steps: int
) -> tuple[float, float]:
    """(seconds, bytes sent) per count all-reduce of a round with ``steps`` steps (what
    run_epoch sends), averaged over ``max(1, rounds // 4)`` of them."""
    counts = RoundCounts(tuple(StepCounts(rank + 1, 7, 9) for _ in range(steps)), 50, 4000)
    raw.barrier().wait()
    before = group.bytes_sent
    t = time.perf_counter()
    reduce_rounds = max(1, rounds // 4)
    for _ in range(reduce_rounds):
        RoundCounts.from_row(group.sum_counts(counts.to_row()))
    reduce_s = (time.perf_counter() - t) / reduce_rounds
    return reduce_s, (group.bytes_sent - before) / reduce_rounds


def run_world(world: int, rounds: int, warmup: int, steps: int) -> dict:
    host = StoreHost(HOST, timeout_s=120.0)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    started = time.perf_counter()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, host.port, rounds, warmup, steps, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in range(world)]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"rank process exited with {p.exitcode}")
    wall = time.perf_counter() - started
    odb = [x for r in results for x in r["odb"]]
    raw = [x for r in results for x in r["raw"]]
    med_odb, med_raw = statistics.median(odb), statistics.median(raw)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))]  # noqa: E731
    gather_bytes = {r["gather_bytes_per_round"] for r in results}
    return {
        "world_size": world,
        "rounds": rounds,
        "gather_status_median_us": round(med_odb * 1e6, 1),
        "gather_status_p90_us": round(q(odb, 0.9) * 1e6, 1),
        "raw_allgather_median_us": round(med_raw * 1e6, 1),
        "raw_allgather_p90_us": round(q(raw, 0.9) * 1e6, 1),
        "ratio_median": round(med_odb / med_raw, 3),
        "overhead_median_us": round((med_odb - med_raw) * 1e6, 1),
        "gather_bytes_per_rank_per_round": sorted(gather_bytes),
        "gather_bytes_ok": gather_bytes == {8.0 * STATUS_WIDTH},
        "sum_counts_bytes_per_rank_per_step": sorted(
            {r["sum_counts_bytes_per_step"] for r in results}
        ),
        "sum_counts_median_us_per_round": round(
            statistics.median(r["sum_counts_us_per_round"] for r in results), 1
        ),
        "wall_s_incl_spawn": round(wall, 1),
    }


def main() -> None:
    p = _io.parser(__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=list(range(1, 9)))
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument(
        "--steps-per-round",
        type=int,
        default=8,
        help="steps in the round whose count all-reduce is measured",
    )
    args = p.parse_args()
    rows = []
    for w in args.worlds:
        _io.progress(f"alignment W={w}: spawning {w} processes, {args.rounds} rounds")
        rows.append(run_world(w, args.rounds, args.warmup, args.steps_per_round))
        r = rows[-1]
        _io.progress(
            f"  gather_status {r['gather_status_median_us']} us, raw "
            f"{r['raw_allgather_median_us']} us, {r['gather_bytes_per_rank_per_round']} B"
        )
    _io.emit(
        {
            "benchmark": "alignment",
            "machine": _io.machine(),
            "settings": {
                "host": HOST,
                "backend": "gloo",
                "status_width_int64": STATUS_WIDTH,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "steps_per_round": args.steps_per_round,
                "note": "one process per rank; W > cores oversubscribes the CPUs",
            },
            "results": rows,
            "bytes_constant_64": all(r["gather_bytes_ok"] for r in rows),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
