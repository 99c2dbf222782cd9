"""Aggregate evaluation results over seeds into the papers' kind of table.

A benchmark is a set of runs, one per (method, seed). Each run contributes a series of
evaluation points (update index, overall success, success per task type, graded score).
This module turns them into mean +- SD over seeds of

* the final evaluation (success overall and per task type, or score and success),
* integrated success: the mean success over all evaluation points of training,
* time per update and, for MCGPO, preference statistics,
* the paired difference of each method against a baseline (GraphGPO when it ran, else the
  first method): per seed that both ran, method minus baseline, of final and of integrated
  success; their mean and a 95 % percentile-bootstrap interval over seeds
  (:func:`paired_differences`, :func:`bootstrap_interval`),

and writes ``results.md`` and the raw points as JSONL. SD is the sample standard deviation
over seeds (``ddof=1``); with one seed it is reported as 0 and the table says ``n=1``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mcgpo.training.checkpoint import atomic_write_text

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "EvalPoint",
    "MethodSummary",
    "PairedDifference",
    "PairedEstimate",
    "RunResult",
    "bootstrap_interval",
    "format_mean_sd",
    "mean_sd",
    "paired_differences",
    "render_results_md",
    "summarise",
    "write_atomic",
    "write_points_jsonl",
]


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation of one run."""

    method: str
    seed: int
    update: int
    success: float  # overall success rate in [0, 1]
    per_type: dict[str, float] = field(default_factory=dict)  # task type -> success rate
    score: float | None = None  # graded score in [0, 1] (WebShop), None where not defined


@dataclass(frozen=True)
class RunResult:
    """Everything one (method, seed) run reports to the benchmark."""

    method: str
    seed: int
    points: tuple[EvalPoint, ...]  # sorted by update
    seconds_per_update: float | None = None
    preference_stats: dict[str, float] = field(default_factory=dict)  # means over updates


@dataclass(frozen=True)
class MethodSummary:
    """Mean and SD over seeds for one method; each value is a (mean, sd) pair."""

    method: str
    seeds: tuple[int, ...]
    final_success: tuple[float, float]
    integrated_success: tuple[float, float]
    per_type: dict[str, tuple[float, float]]
    score: tuple[float, float] | None
    seconds_per_update: tuple[float, float] | None
    preference_stats: dict[str, tuple[float, float]]


@dataclass(frozen=True)
class PairedEstimate:
    """The mean of per-seed differences and its 95 % bootstrap interval (None with < 2)."""

    mean: float
    interval: tuple[float, float] | None


@dataclass(frozen=True)
class PairedDifference:
    """``method`` minus ``baseline``, paired by seed, over the seeds both ran.

    ``final_success`` and ``integrated_success`` are None when no seed is shared.
    """

    method: str
    baseline: str
    seeds: tuple[int, ...]
    final_success: PairedEstimate | None
    integrated_success: PairedEstimate | None


# Percentile bootstrap over seeds: resamples, and the fixed seed of the resampling (the same
# runs always give the same interval).
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample SD (ddof=1; 0 for a single value). Empty input is an error."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        raise ValueError("mean_sd of no values")
    sd = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return float(arr.mean()), sd


def format_mean_sd(pair: tuple[float, float] | None, scale: float = 100.0, digits: int = 1) -> str:
    """``"72.3 ± 4.1"`` (values scaled, e.g. rates to percent); ``"–"`` for None."""
    if pair is None or any(math.isnan(v) for v in pair):
        return "–"
    return f"{pair[0] * scale:.{digits}f} ± {pair[1] * scale:.{digits}f}"


def bootstrap_interval(
    values: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of the mean of ``values``; None for fewer than 2 values.

    Draws ``resamples`` samples of ``len(values)`` with replacement (numpy's default
    generator seeded with ``seed``), and returns the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles of their means. The interval lies within
    ``[min(values), max(values)]``, so it excludes 0 when every value has the same sign.
    With few values it is too narrow (two values: about their range), so a decision by it
    wants 5 seeds or more.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    arr = np.asarray(list(values), dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("bootstrap_interval of a non-finite value")
    if arr.size < 2:
        return None
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1)
    low, high = np.quantile(means, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def _paired_estimate(diffs: Sequence[float]) -> PairedEstimate | None:
    if not diffs:
        return None
    return PairedEstimate(float(np.mean(diffs)), bootstrap_interval(diffs))


def paired_differences(
    runs: Iterable[RunResult], baseline: str | None = None
) -> list[PairedDifference]:
    """Each method against ``baseline`` (default: ``graphgpo`` if it ran, else the first
    method), paired by seed: a seed that one of the two did not run is left out.

    One entry per other method, in order of first appearance; empty with fewer than two
    methods. Final success is the last evaluation point's, integrated success the mean over
    all points (as in :func:`summarise`).
    """
    by_method: dict[str, dict[int, RunResult]] = {}
    for run in runs:
        if not run.points:
            raise ValueError(f"run {run.method} seed {run.seed} has no evaluation points")
        seeds = by_method.setdefault(run.method, {})
        if run.seed in seeds:
            raise ValueError(f"two runs of {run.method} with seed {run.seed}")
        seeds[run.seed] = run
    if baseline is None:
        baseline = "graphgpo" if "graphgpo" in by_method else next(iter(by_method), None)
    elif baseline not in by_method:
        raise ValueError(f"baseline {baseline!r} has no runs; methods: {', '.join(by_method)}")
    if baseline is None:
        return []
    base = by_method[baseline]
    out = []
    for method, mine in by_method.items():
        if method == baseline:
            continue
        shared = sorted(set(mine) & set(base))
        final = [mine[s].points[-1].success - base[s].points[-1].success for s in shared]
        integ = [_integrated(mine[s]) - _integrated(base[s]) for s in shared]
        out.append(
            PairedDifference(
                method, baseline, tuple(shared), _paired_estimate(final), _paired_estimate(integ)
            )
        )
    return out


def _integrated(run: RunResult) -> float:
    """Integrated success: the mean success over all evaluation points of the run."""
    return float(np.mean([p.success for p in run.points]))


def summarise(runs: Iterable[RunResult]) -> list[MethodSummary]:
    """One summary per method, in order of first appearance."""
    by_method: dict[str, list[RunResult]] = {}
    for run in runs:
        if not run.points:
            raise ValueError(f"run {run.method} seed {run.seed} has no evaluation points")
        by_method.setdefault(run.method, []).append(run)
    out = []
    for method, method_runs in by_method.items():
        method_runs.sort(key=lambda r: r.seed)
        finals = [r.points[-1] for r in method_runs]
        types = sorted({t for p in finals for t in p.per_type})
        per_type = {t: mean_sd([p.per_type[t] for p in finals if t in p.per_type]) for t in types}
        scores = [p.score for p in finals if p.score is not None]
        secs = [r.seconds_per_update for r in method_runs if r.seconds_per_update is not None]
        pref_keys = sorted({k for r in method_runs for k in r.preference_stats})
        out.append(
            MethodSummary(
                method=method,
                seeds=tuple(r.seed for r in method_runs),
                final_success=mean_sd([p.success for p in finals]),
                integrated_success=mean_sd([_integrated(r) for r in method_runs]),
                per_type=per_type,
                score=mean_sd(scores) if scores else None,
                seconds_per_update=mean_sd(secs) if secs else None,
                preference_stats={
                    k: mean_sd(
                        [r.preference_stats[k] for r in method_runs if k in r.preference_stats]
                    )
                    for k in pref_keys
                },
            )
        )
    return out


def render_results_md(
    summaries: Sequence[MethodSummary],
    *,
    title: str,
    header_lines: Sequence[str] = (),
    paired: Sequence[PairedDifference] = (),
) -> str:
    """The results table as Markdown: success (%) mean ± SD over seeds, under it the paired
    differences against the baseline (when given), then details."""
    lines = [f"# {title}", ""]
    lines += [*header_lines, ""] if header_lines else []
    types = sorted({t for s in summaries for t in s.per_type})
    has_score = any(s.score is not None for s in summaries)
    cols = ["Method", "Seeds", "Success (final)", "Integrated success"]
    cols += [_short_type(t) for t in types]
    cols += ["Score"] if has_score else []
    cols += ["s / update"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for s in summaries:
        row = [
            s.method,
            str(len(s.seeds)),
            format_mean_sd(s.final_success),
            format_mean_sd(s.integrated_success),
        ]
        row += [format_mean_sd(s.per_type.get(t)) for t in types]
        row += [format_mean_sd(s.score)] if has_score else []
        row += [format_mean_sd(s.seconds_per_update, scale=1.0)]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Values are percent, mean ± sample SD over seeds (final evaluation unless "
        "stated); integrated success is the mean over all evaluation points of training.",
    ]
    lines += _render_paired(paired)
    prefs = [s for s in summaries if "preferences" in s.preference_stats]
    if prefs:
        keys = [k for k in PREFERENCE_COLUMNS if any(k in s.preference_stats for s in prefs)]
        lines += ["", "## Preference statistics (mean ± SD over seeds of the per-update mean)", ""]
        lines.append("| Method | " + " | ".join(keys) + " |")
        lines.append("|---|" + "|".join("---" for _ in keys) + "|")
        for s in prefs:
            vals = [format_mean_sd(s.preference_stats.get(k), scale=1.0, digits=3) for k in keys]
            lines.append(f"| {s.method} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def _render_paired(paired: Sequence[PairedDifference]) -> list[str]:
    """The paired-difference sections of results.md, one per baseline in order of first
    appearance (no lines when there is none)."""
    baselines = list(dict.fromkeys(d.baseline for d in paired))
    return [
        line
        for b in baselines
        for line in _render_paired_against(b, [d for d in paired if d.baseline == b])
    ]


def _render_paired_against(baseline: str, paired: Sequence[PairedDifference]) -> list[str]:
    lines = [
        "",
        f"## Paired difference against {baseline} (method - {baseline}, per seed)",
        "",
        "| Method | n | Final success Δ | 95 % interval | Integrated success Δ | 95 % interval |",
        "|---|---|---|---|---|---|",
    ]
    for d in paired:
        row = [d.method, str(len(d.seeds))]
        row += _format_estimate(d.final_success) + _format_estimate(d.integrated_success)
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Percentage points: the mean over the seeds both ran (n) of the method's value minus "
        f"{baseline}'s on the same seed, and a 95 % percentile-bootstrap interval over those "
        f"seeds ({BOOTSTRAP_RESAMPLES:,} resamples, resampling seed {BOOTSTRAP_SEED}); n/a "
        "with fewer than 2 seeds. An interval that excludes 0 says the sign of the difference "
        "holds over these seeds; with few seeds (under 5) the interval is too narrow.",
    ]
    return lines


def _format_estimate(est: PairedEstimate | None) -> list[str]:
    """``["+1.2", "[-0.5, +3.0]"]`` in percentage points; ``n/a`` where not defined."""
    if est is None:
        return ["n/a", "n/a"]
    interval = "n/a"
    if est.interval is not None:
        interval = f"[{_signed(est.interval[0])}, {_signed(est.interval[1])}]"
    return [_signed(est.mean), interval]


def _signed(value: float) -> str:
    text = f"{100.0 * value:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text


def write_points_jsonl(path: Path, runs: Iterable[RunResult]) -> None:
    """All evaluation points, one JSON object per line (atomic write)."""
    text = "".join(json.dumps(asdict(p), sort_keys=True) + "\n" for r in runs for p in r.points)
    write_atomic(path, text)


def write_atomic(path: Path, text: str) -> None:
    """Write text to ``path`` through a temporary file and an atomic rename (the checkpoint
    module's writer: the file gets the usual permissions, not mkstemp's owner-only 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


# MCGPO's per-update statistics shown in results.md (docs/algorithms/mcgpo.md §4): coverage,
# drops by reason, and the pairs the update used or split (docs/training.md's metric list)
PREFERENCE_COLUMNS = (
    "preferences_per_group",
    "share_groups_without_preferences",
    "exact",
    "coarse",
    "mean_weight",
    "dropped_no_support",
    "dropped_below_epsilon",
    "dropped_allocation",
    "used",
    "split_mini",
    "split_micro",
)

_TYPE_NAMES = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}


def _short_type(name: str) -> str:
    return _TYPE_NAMES.get(name, name)
