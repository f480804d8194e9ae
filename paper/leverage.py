"""Table + figure: short-sample leverage — ODB's speedup vs Standard over CV and f_s.

Each leverage mix (``experiments.data.proxies``, MM-Mix schema, text only) fixes the
coefficient of variation (CV) of post-pipeline lengths and the short-sample fraction
f_s independently. The paper: speedup grows with CV and is amplified by f_s (MM-Mix, CV
0.80 with many short samples, gained more than ShareGPT4o, CV 1.00). Each mix's speedup is
judged against Standard, and against the speedup of the base mix (lowest CV, then lowest
f_s) per pairing, by the claim rule (``paper.claims.verdict``): a trend is claimed only
where it beats the noise.

    python -m paper.leverage --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import math

import pandas as pd

from paper.cells import by_variant, fixed
from paper.claims import CLAIM_RULE, Comparison, Spread, compare, paired_ratios, pairings, pooled
from paper.common import (
    Collected,
    Run,
    collect,
    figure_path,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    write_table,
    yerr,
)

NAME = "leverage"


def _vs_base(got: Collected, runs: list[Run], base: Run) -> Comparison:
    """This mix's speedup over the base mix's, per pairing: ODB/Standard of this mix at
    position k over ODB/Standard of the base mix at position k (same seed)."""
    if runs[0]["data"] == base["data"]:
        return Comparison((), is_reference=True)
    out: list[float] = []
    for run in runs:
        other = got.counterpart(run, data=base["data"], tags=base["tags"])
        mine = pairings([run], got.reference)
        theirs = pairings([other], got.reference) if other else []
        if mine and theirs:
            out += paired_ratios(mine, theirs)
    return Comparison(tuple(out))


def _row(got: Collected, runs: list[Run], base: Run) -> tuple[dict, dict]:
    """One leverage mix (``runs``: ODB's seeds): both methods' timings with their spread,
    ODB's speedup and its verdict, and the speedup against the base mix's."""
    first = runs[0]
    refs = [ref for ref in map(got.reference, runs) if ref is not None]
    odb, std = Spread.of(pooled(runs)), Spread.of(pooled(refs))
    up, gain = compare(runs, got.reference), _vs_base(got, runs, base)
    cv, fs = first["tags"]["cv"], first["tags"]["short_fraction"]
    row = {
        "CV": f"{cv:.2f}",
        "f_s": f"{fs:.2f}",
        "Setting": first.setting,
        "Standard samples/s": std.format(),
        "ODB samples/s": odb.format(),
        "Speedup": up.cell(),
        "Verdict": up.verdict,
        "Speedup vs base mix": gain.cell(),
        "Verdict vs base mix": gain.verdict,
        "ODB padding eff.": fixed([r.result["padding_efficiency"] for r in runs], 3),
        "Standard padding eff.": fixed([r.result["padding_efficiency"] for r in refs], 3),
    }
    data = {
        "cv": cv,
        "short_fraction": fs,
        "samples_per_s": odb.to_dict(),
        "standard_samples_per_s": std.to_dict(),
        "speedup": up.to_dict(),
        "vs_base": gain.to_dict(),
    }
    return row, data


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    odb = sorted(
        got.find(method="odb"), key=lambda r: (r["tags"]["cv"], r["tags"]["short_fraction"])
    )
    made = [_row(got, runs, odb[0]) for runs in by_variant(odb)] if odb else []
    data = [d for _, d in made]
    base = (
        f"CV {odb[0]['tags']['cv']:.2f}, f_s {odb[0]['tags']['short_fraction']:.2f}" if odb else ""
    )
    write_table(
        args,
        NAME,
        pd.DataFrame([row for row, _ in made]),
        "Short-sample leverage: speedup vs CV and f_s",
        [
            "f_s: share of samples shorter than 256 tokens. Standard: fixed batch "
            f"= budget // cutoff. Speedup vs base mix: this mix's speedup over the base "
            f'mix\'s ({base}), per pairing; "faster" there means a larger speedup. ' + CLAIM_RULE,
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )
    _figure(args, data)


def _figure(args, data: list[dict]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    for fs in sorted({d["short_fraction"] for d in data}):
        pts = sorted((d for d in data if d["short_fraction"] == fs), key=lambda d: d["cv"])
        ax.errorbar(
            [d["cv"] for d in pts],
            [math.nan if d["speedup"]["median"] is None else d["speedup"]["median"] for d in pts],
            yerr=yerr([d["speedup"] for d in pts]),
            marker="o",
            capsize=2,
            label=f"f_s = {fs:.2f}",
        )
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("length CV")
    ax.set_ylabel("ODB speedup vs Standard (median, min-max)")
    if data:
        ax.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
