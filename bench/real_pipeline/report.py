"""What a run reports across cells: paired ratios, the median run, the table."""

from __future__ import annotations

from typing import Any

from bench.real_pipeline.rank import VARIANTS


def compare(plain: dict[str, Any], odb: dict[str, Any]) -> dict[str, Any]:
    """odb relative to plain in one (proxy, W)."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {
        "samples_per_s_odb_vs_plain": ratio(odb["samples_per_s"], plain["samples_per_s"]),
        "peak_uss_odb_vs_plain": ratio(odb["peak_uss_mb"], plain["peak_uss_mb"]),
        "peak_anon_shm_odb_vs_plain": ratio(odb["peak_anon_shm_mb"], plain["peak_anon_shm_mb"]),
        "first_batch_s_plain_odb": [plain["first_batch_s"], odb["first_batch_s"]],
        "steps_plain_odb": [plain["steps"], odb["steps"]],
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median samples/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["samples_per_s"])[(len(runs) - 1) // 2]


def table(results: dict[str, Any]) -> str:
    """A markdown table of the headline numbers, one row per odb variant (the JSON holds
    everything)."""
    lines = [
        "| proxy | W | odb variant | samples/s plain / odb (ratio) | first batch s plain / "
        "odb | peak MB (anon + shm) plain / odb | padding eff. plain / odb | steps plain / odb "
        "| collate CPU us/sample |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in results.values():
        p = cell["plain"]
        for variant in VARIANTS:
            if variant not in cell:
                continue
            o, c = cell[variant], cell[f"{variant}_vs_plain"]
            paired = c.get("samples_per_s_ratio_per_repeat", [])
            each = f"; repeats {' / '.join(f'{x}x' for x in paired)}" if len(paired) > 1 else ""
            lines.append(
                f"| {cell['proxy']} | {cell['world_size']} | {variant} | {p['samples_per_s']} / "
                f"{o['samples_per_s']} ({c['samples_per_s_odb_vs_plain']}x{each}) | "
                f"{p['first_batch_s']:.2f} / {o['first_batch_s']:.2f} | "
                f"{p['peak_anon_shm_mb']:.0f} / {o['peak_anon_shm_mb']:.0f} | "
                f"{p['padding_efficiency']} / {o['padding_efficiency']} | "
                f"{p['steps']} / {o['steps']} | {o['collate_cpu_us_per_sample']} |"
            )
    return "\n".join(lines)
