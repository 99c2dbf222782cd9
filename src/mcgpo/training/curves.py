"""Curves of one or several runs from their ``metrics.jsonl`` (``mcgpo report --plot``).

Three panels against the update: success (training rollouts ``rollout/success_rate``, solid;
held-out ``eval/success``, dashed), return (the episode score: ``rollout/score_mean``, solid;
``eval/score``, dashed) and the losses (``loss/policy``, ``loss/kl``, ``loss/pair``, each in
its own line style). One colour per run; a metric a run never logged draws no line. PNG via
matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mcgpo.training.metrics import read_metrics

__all__ = ["PANELS", "curve_figure", "plot_runs", "run_curves"]

# panel title -> (metric, line style, label) in drawing order
PANELS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "success": (
        ("rollout/success_rate", "-", "train"),
        ("eval/success", "--", "eval"),
    ),
    "return (episode score)": (
        ("rollout/score_mean", "-", "train"),
        ("eval/score", "--", "eval"),
    ),
    "losses": (
        ("loss/policy", "-", "policy"),
        ("loss/kl", ":", "kl"),
        ("loss/pair", "-.", "pair"),
    ),
}


def run_curves(folder: Path) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (updates, values) of the metrics :data:`PANELS` draws, as the run logged
    them (finite numbers only; a metric logged twice at one update keeps the later value)."""
    curves: dict[str, dict[int, float]] = {}
    wanted = {metric for lines in PANELS.values() for metric, _, _ in lines}
    for record in read_metrics(Path(folder) / "metrics.jsonl"):
        for metric in wanted & record.keys():
            value = record[metric]
            if isinstance(value, (int, float)) and value == value and abs(value) != float("inf"):
                curves.setdefault(metric, {})[int(record["update"])] = float(value)
    return {
        m: (sorted(points), [points[u] for u in sorted(points)]) for m, points in curves.items()
    }


def curve_figure(runs: Mapping[str, Mapping[str, tuple[list[int], list[float]]]]) -> Any:
    """The figure of ``runs`` (label -> :func:`run_curves`): one line per run and metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.0 * len(PANELS), 3.8), dpi=110)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, lines) in zip(axes, PANELS.items()):
        for i, (label, curves) in enumerate(runs.items()):
            for metric, style, name in lines:
                if metric not in curves:
                    continue
                updates, values = curves[metric]
                shown = f"{label}: {name}" if len(runs) > 1 else name
                marker = "o" if len(updates) < 12 else None
                ax.plot(
                    updates,
                    values,
                    linestyle=style,
                    color=colours[i % len(colours)],
                    marker=marker,
                    markersize=3,
                    label=shown,
                )
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(frameon=False, fontsize=8)
    return fig


def plot_runs(folders: Sequence[Path], path: Path) -> Path:
    """Write the curves of the run ``folders`` (labelled by folder name) to the PNG ``path``;
    a ValueError names a folder with nothing to draw."""
    import matplotlib.pyplot as plt

    runs: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for folder in folders:
        curves = run_curves(Path(folder))
        if not curves:
            raise ValueError(f"run folder {str(folder)!r} has no curves in metrics.jsonl")
        label = Path(folder).resolve().name
        runs[label if label not in runs else str(folder)] = curves
    fig = curve_figure(runs)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        fig.savefig(partial, format="png")
        os.replace(partial, path)  # a reader never sees half a PNG
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
    return path
