"""Aggregate evaluation results over seeds into the papers' kind of table.

A benchmark is a set of runs, one per (method, seed). Each run contributes a series of
evaluation points (update index, overall success, success per task type, graded score).
This module turns them into mean +- SD over seeds of

* the final evaluation (success overall and per task type, or score and success),
* integrated success: the mean success over all evaluation points of training,
* time per update and, for MCGPO, preference statistics,
* the paired difference of each method against a baseline (GraphGPO when it ran, else the
  first method): per seed that both ran, method minus baseline, of final and of integrated
  success; their mean, SD, 95 % paired t-interval and the minimum detectable effect of the
  paired t-test at 80 % power (:func:`paired_differences`; the statistics are
  :mod:`mcgpo.bench.intervals`),

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

from mcgpo.bench.intervals import (
    ALPHA,
    CONFIDENCE,
    POWER,
    detectable_effect,
    paired_t_interval,
)
from mcgpo.training.atomic_files import atomic_write_text

__all__ = [
    "EvalPoint",
    "MethodSummary",
    "PairedDifference",
    "PairedEstimate",
    "RunResult",
    "format_mean_sd",
    "mean_sd",
    "paired_differences",
    "paired_estimate",
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
    """Statistics of n per-seed differences: their mean, sample SD, 95 % paired t-interval
    and minimum detectable effect at 80 % power (SD, interval and MDE are None with n < 2)."""

    mean: float
    sd: float | None
    interval: tuple[float, float] | None
    detectable: float | None


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


def paired_estimate(diffs: Sequence[float]) -> PairedEstimate | None:
    """Mean, SD, t-interval and detectable effect of per-seed differences; None if empty."""
    values = [float(d) for d in diffs]
    if not values:
        return None
    return PairedEstimate(
        mean=float(np.mean(values)),
        sd=float(np.std(values, ddof=1)) if len(values) > 1 else None,
        interval=paired_t_interval(values),
        detectable=detectable_effect(values),
    )


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
                method, baseline, tuple(shared), paired_estimate(final), paired_estimate(integ)
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
    appearance, then a note on how many intervals they print (no lines when there is none)."""
    baselines = list(dict.fromkeys(d.baseline for d in paired))
    lines = [
        line
        for b in baselines
        for line in _render_paired_against(b, [d for d in paired if d.baseline == b])
    ]
    count = sum(
        est is not None and est.interval is not None
        for d in paired
        for est in (d.final_success, d.integrated_success)
    )
    return [*lines, "", *_paired_note(count)] if lines else []


def _render_paired_against(baseline: str, paired: Sequence[PairedDifference]) -> list[str]:
    level, power = f"{100 * CONFIDENCE:.0f} %", f"{100 * POWER:.0f} %"
    lines = [
        "",
        f"## Paired difference against {baseline} (method - {baseline}, per seed)",
        "",
        f"| Method | n | Final success Δ | {level} t-interval | MDE ({power}) "
        f"| Integrated success Δ | {level} t-interval | MDE ({power}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in paired:
        row = [d.method, str(len(d.seeds))]
        row += _format_estimate(d.final_success) + _format_estimate(d.integrated_success)
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        f"Percentage points: per seed that both ran (n of them), the method's value minus "
        f"{baseline}'s; Δ is their mean. n/a with fewer than 2 seeds.",
    ]
    return lines


def _paired_note(count: int) -> list[str]:
    """How to read the paired sections: the t-interval, the detectable effect, coverage and
    the number of intervals printed (``count``)."""
    power = f"{100 * POWER:.0f} %"
    note = [
        f"How to read the paired differences. The interval is the {100 * CONFIDENCE:.0f} % "
        f"paired t-interval Δ ± t({(1 + CONFIDENCE) / 2:g}, n−1) · SD / √n of the n per-seed "
        "differences. MDE, "
        "the minimum detectable effect, is the true mean difference that a two-sided paired "
        f"t-test at α = {ALPHA:g} on n seeds detects with {power} power when the "
        "differences' SD is the observed one (exact, from the noncentral t distribution; the "
        "SD is itself estimated from n seeds, so the MDE is rough). A true difference smaller "
        "than the MDE is likely to go unseen: an interval that contains 0 says that no "
        "difference is shown, not that there is none. The interval assumes roughly "
        "symmetric differences; simulated at n = 8 it covers 95 % of the time for normal "
        "differences, 93.5 % at skewness 1 and about 90 % at skewness 2 "
        "(tests/bench/test_intervals.py).",
    ]
    if count > 1:
        note += [
            "",
            f"These sections print {count} intervals, each one comparison at "
            f"{100 * CONFIDENCE:.0f} %: when nothing differs, each excludes 0 with probability "
            f"{1 - CONFIDENCE:.2f} ({(1 - CONFIDENCE) * count:.1f} of "
            f"{count} expected), so an interval that excludes 0 is evidence for a comparison "
            "named before the runs; read the others as secondary.",
        ]
    return note


def _format_estimate(est: PairedEstimate | None) -> list[str]:
    """``["+1.2", "[-0.5, +3.0]", "2.7"]`` in percentage points: the mean difference, its
    t-interval and the minimum detectable effect; ``n/a`` where not defined."""
    if est is None:
        return ["n/a", "n/a", "n/a"]
    interval = detectable = "n/a"
    if est.interval is not None:
        interval = f"[{_signed(est.interval[0])}, {_signed(est.interval[1])}]"
    if est.detectable is not None:
        detectable = f"{100.0 * est.detectable:.1f}"
    return [_signed(est.mean), interval, detectable]


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
# drops by reason, and the pairs the update used or split (docs/reference/metrics.md)
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
