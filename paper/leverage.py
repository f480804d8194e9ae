"""Table + figure: short-sample leverage — ODB's speedup vs Standard over CV and f_s.

Each leverage mix (``experiments.data.proxies``, MM-Mix schema, text only) fixes the
coefficient of variation (CV) of post-pipeline lengths and the short-sample fraction
f_s independently. The paper: speedup grows with CV and is amplified by f_s (MM-Mix, CV
0.80 with many short samples, gained more than ShareGPT4o, CV 1.00).

    python -m paper.leverage --grid results/paper/grid.json --out-dir results/paper
"""

from __future__ import annotations

import pandas as pd

from paper.common import (
    collect,
    figure_path,
    num,
    parse_args,
    pyplot,
    save_figure,
    scale_note,
    speedup,
    write_table,
)

NAME = "leverage"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    got = collect(args, NAME)
    rows, data = [], []
    odb = sorted(
        got.find(method="odb"), key=lambda r: (r["tags"]["cv"], r["tags"]["short_fraction"])
    )
    for run in odb:
        ref = got.reference(run)
        up = speedup(run, ref)
        cv, fs = run["tags"]["cv"], run["tags"]["short_fraction"]
        rows.append(
            {
                "CV": num(cv),
                "f_s": num(fs),
                "Setting": run.setting,
                "Standard samples/s": num(ref.throughput) if ref else "–",
                "ODB samples/s": num(run.throughput),
                "Speedup": num(up, 2, "x"),
                "ODB padding eff.": num(run.result["padding_efficiency"], 3),
                "Standard padding eff.": num(ref.result["padding_efficiency"], 3) if ref else "–",
            }
        )
        data.append({"cv": cv, "short_fraction": fs, "speedup": up})
    write_table(
        args,
        NAME,
        pd.DataFrame(rows),
        "Short-sample leverage: speedup vs CV and f_s",
        [
            "f_s: share of samples shorter than 256 tokens. Standard: fixed batch "
            "= budget // cutoff.",
            scale_note(got.grid),
        ],
        got.missing,
        data,
    )
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    for fs in sorted({d["short_fraction"] for d in data}):
        pts = sorted((d["cv"], d["speedup"]) for d in data if d["short_fraction"] == fs)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"f_s = {fs:.2f}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xlabel("length CV")
    ax.set_ylabel("ODB speedup vs Standard")
    if data:
        ax.legend(fontsize=7)
    save_figure(fig, figure_path(args, NAME))


if __name__ == "__main__":
    main()
