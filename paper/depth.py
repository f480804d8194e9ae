"""Table + figure: outstanding depth D sweep with the measured pipeline overlap.

D = DataLoader workers x prefetch_factor (requests in flight; torch's default factor is
2). Pipeline overlap = 1 - (trainer's data-wait time / training wall time): the share of
the loop not spent waiting for data. The paper: past ~95% overlap, a larger D buys
little. Each D is judged against ODB's default depth by the claim rule
(``paper.claims.verdict``), so a difference inside the noise is not read as an effect.

    python -m paper.depth --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

from paper.cells import fixed, sweep_row
from paper.claims import CLAIM_RULE, Spread, epoch_seconds, per_measurement
from paper.common import DATASET_LABEL, Collected, Run, figure_path, pyplot, save_figure, yerr
from paper.sweep import Sweep, run_sweep

NAME = "depth"


def depth(run) -> int:
    method = run.result["config"]["method"]
    factor = method.get("odb", {}).get("prefetch_factor") or 2
    return max(1, method.get("num_workers", 0)) * factor


def data_waits(run) -> list[float]:
    """Seconds the trainer waited for data in each measured epoch (the run's whole wait
    for an older result that did not record it per epoch)."""
    return per_measurement(run, "data_wait_s", float(run.result["data_wait_s"]))


def overlaps(run) -> list[float]:
    """Pipeline overlap of each measured epoch: 1 - data wait / epoch wall time."""
    return [
        1.0 - wait / wall if wall > 0 else float("nan")
        for wait, wall in zip(data_waits(run), epoch_seconds(run), strict=True)
    ]


def _row(got: Collected, runs: list[Run]) -> tuple[dict, dict]:
    """One depth (``runs``: its seeds): timings with their spread and the verdict against
    ODB's default depth. Data wait and overlap: one figure per measured epoch."""
    d = depth(runs[0])
    row, data = sweep_row(got, runs, "D", d, "vs default D")
    over = Spread.of(100 * o for r in runs for o in overlaps(r))
    row.update(
        {
            "Data wait s": Spread.of(w for r in runs for w in data_waits(r)).format(),
            "Overlap %": over.format(1),
            "Steps": fixed([r.result["steps"] for r in runs]),
        }
    )
    data.update(depth=d, overlap_pct=over.to_dict())
    return row, data


def _figure(args, data: list[dict]) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3))
    for dataset in sorted({d["dataset"] for d in data}):
        pts = sorted((d for d in data if d["dataset"] == dataset), key=lambda d: d["depth"])
        xs = [d["depth"] for d in pts]
        left.errorbar(
            xs,
            [d["samples_per_s"]["median"] for d in pts],
            yerr=yerr([d["samples_per_s"] for d in pts]),
            marker="o",
            capsize=2,
            label=DATASET_LABEL[dataset],
        )
        right.errorbar(
            xs,
            [d["overlap_pct"]["median"] for d in pts],
            yerr=yerr([d["overlap_pct"] for d in pts]),
            marker="o",
            capsize=2,
            label=DATASET_LABEL[dataset],
        )
    left.set(xlabel="outstanding depth D", ylabel="ODB samples/s (median, min-max)", xscale="log")
    right.set(
        xlabel="outstanding depth D", ylabel="pipeline overlap % (median, min-max)", xscale="log"
    )
    if data:
        left.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


SWEEP = Sweep(
    name=NAME,
    title="Outstanding depth D sweep (ODB)",
    note="D = workers x prefetch_factor; overlap = 1 - data wait / epoch time (one "
    "figure per measured epoch). vs default D: ODB against ODB at its default depth, per "
    "pairing. " + CLAIM_RULE,
    row=_row,
    order=lambda r: (r["dataset"], depth(r)),
    figure=_figure,
)


def main(argv: list[str] | None = None) -> None:
    run_sweep(SWEEP, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
