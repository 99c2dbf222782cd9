"""Plots of benchmark results (matplotlib, PNG, no display needed).

* Learning curves: success against update, one line per method at the mean over seeds,
  with a band of ± one sample SD over seeds.
* Per-task-type bars: final success per task type, mean over seeds, SD as error bars.
* Group-sequential looks: each comparison's paired mean difference at every look held so
  far, with its repeated confidence interval, against the planned looks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mcgpo.bench.results import MethodSummary, PairedDifference, RunResult, _short_type
from mcgpo.bench.sequential import LookResult

__all__ = ["curve_bands", "plot_learning_curves", "plot_sequential_looks", "plot_task_type_bars"]


def curve_bands(runs: Sequence[RunResult]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per method: (updates, mean success, SD over seeds) at the updates all seeds share."""
    by_method: dict[str, list[RunResult]] = {}
    for run in runs:
        by_method.setdefault(run.method, []).append(run)
    out = {}
    for method, method_runs in by_method.items():
        shared = set.intersection(*({p.update for p in r.points} for r in method_runs))
        updates = np.array(sorted(shared), dtype=np.int64)
        values = np.array(
            [
                [next(p.success for p in r.points if p.update == u) for u in updates]
                for r in method_runs
            ],
            dtype=np.float64,
        )  # [seeds, points]
        sd = values.std(axis=0, ddof=1) if len(method_runs) > 1 else np.zeros(len(updates))
        out[method] = (updates, values.mean(axis=0), sd)
    return out


def plot_learning_curves(runs: Sequence[RunResult], path: Path, *, title: str = "") -> Path:
    """Success (%) against update with a ± SD band over seeds; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for method, (updates, mean, sd) in curve_bands(runs).items():
        (line,) = ax.plot(updates, 100 * mean, label=method, linewidth=1.6)
        ax.fill_between(
            updates,
            100 * (mean - sd),
            100 * (mean + sd),
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )
    ax.set_xlabel("update")
    ax.set_ylabel("evaluation success (%)")
    ax.set_title(title or "Learning curves (mean ± SD over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return _save(fig, path)


def plot_task_type_bars(summaries: Sequence[MethodSummary], path: Path, *, title: str = "") -> Path:
    """Final success per task type: grouped bars (methods) with SD error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    types = sorted({t for s in summaries for t in s.per_type})
    fig, ax = plt.subplots(figsize=(7.2, 4.0), dpi=120)
    width = 0.8 / max(len(summaries), 1)
    x = np.arange(len(types))
    for i, s in enumerate(summaries):
        mean = [100 * s.per_type.get(t, (np.nan, 0.0))[0] for t in types]
        sd = [100 * s.per_type.get(t, (0.0, 0.0))[1] for t in types]
        ax.bar(
            x + (i - (len(summaries) - 1) / 2) * width,
            mean,
            width,
            yerr=sd,
            capsize=2,
            label=s.method,
        )
    ax.set_xticks(x, [_short_type(t) for t in types])
    ax.set_ylabel("final success (%)")
    ax.set_title(title or "Success per task type (mean ± SD over seeds)")
    ax.legend(frameon=False, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_sequential_looks(
    history: Sequence[tuple[PairedDifference, Sequence[LookResult]]],
    looks: Sequence[int],
    path: Path,
    *,
    title: str = "",
) -> Path:
    """Δ integrated success (points, method minus baseline) at each look held so far, with
    the look's repeated confidence interval as the error bar, at its number of seeds; the
    planned looks on the x axis, 0 as a line. Returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    step = min(np.diff(looks)) if len(looks) > 1 else max(looks[0], 1)
    offsets = np.linspace(-0.1, 0.1, len(history)) * step if len(history) > 1 else [0.0]
    for (d, held), dx in zip(history, offsets, strict=True):
        n = np.array([r.n for r in held], dtype=np.float64) + dx
        mean = np.array([100 * r.mean for r in held])
        low = mean - np.array([100 * r.interval[0] for r in held])
        high = np.array([100 * r.interval[1] for r in held]) - mean
        ax.errorbar(n, mean, yerr=[low, high], fmt="o", capsize=3, label=d.method)
    ax.axhline(0.0, color="0.3", linewidth=0.8)
    ax.set_xticks(list(looks))
    ax.set_xlim(min(looks) - 0.6 * step, max(looks) + 0.6 * step)
    baseline = history[0][0].baseline if history else "baseline"
    ax.set_xlabel("paired seeds (planned looks)")
    ax.set_ylabel(f"integrated success, method − {baseline} (points)")
    ax.set_title(title or "Group-sequential looks: mean difference, repeated CI")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    """Lay out, write the PNG (its folder created), close the figure; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
