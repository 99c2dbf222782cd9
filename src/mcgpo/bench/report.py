"""Write a benchmark's tables: after its runs, or again from finished runs alone.

:func:`write_results` is the last step of ``mcgpo bench`` / ``ablate`` / ``sweep``.
:func:`report_finished` is their ``--report-only`` mode: it reads the finished runs
(``runs/<label>-s<seed>/`` with ``bench-done.json``; the metrics are enough, so a folder
kept by ``--carry`` or ``scripts/bench_carry.py`` will do) and re-renders ``results.md``, ``evals.jsonl``
and the plots from those runs without a warm start or any training, e.g. after the table's
statistics changed (issue 35), or to read a study run one seed per command as a whole. With
looks given (``--sequential 16,24,32,40``) it adds :func:`sequential_section`, the
group-sequential looks at integrated success (:mod:`mcgpo.bench.sequential`,
docs/sequential.md), and draws them (``sequential.png``).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mcgpo.bench.plots import plot_learning_curves, plot_sequential_looks, plot_task_type_bars
from mcgpo.bench.results import (
    PairedDifference,
    RunResult,
    paired_differences,
    render_results_md,
    summarise,
    write_atomic,
    write_points_jsonl,
)
from mcgpo.bench.runner import Variant, load_run_result, plan_runs, run_status
from mcgpo.bench.sequential import (
    LookResult,
    alpha_spent,
    evaluate_look,
    look_fractions,
    look_index,
    nominal_thresholds,
    spending_boundaries,
)

__all__ = [
    "REPORT_NOTE",
    "SequentialLooks",
    "kept_header",
    "report_finished",
    "sequential_looks",
    "sequential_section",
    "write_results",
]

# the header line that marks a results.md re-rendered by --report-only
REPORT_NOTE = "Tables re-rendered from the finished runs' metrics"
# header lines that describe the runs at the time of writing, not the tables: dropped when a
# header is kept, and written again for the runs found now
_STALE = (REPORT_NOTE, "Runs that failed and are left out", "Runs not finished and left out")
_KIND_NAMES = {"obrien_fleming": "O'Brien–Fleming", "pocock": "Pocock"}


def write_results(
    command: str,
    out: Path,
    runs: Sequence[RunResult],
    header: list[str],
    *,
    tables_only: bool = False,
    appendix: Sequence[str] = (),
) -> None:
    """results.md (printed too; the paired differences against the baseline under the main
    table) and, unless ``tables_only``, evals.jsonl, curves.png and, with task types,
    task_types.png. The baseline is GraphGPO if it ran, else the first method; ``mcgpo
    ablate`` adds each control against default MCGPO (the method the control changes).
    ``appendix`` lines (e.g. :func:`sequential_section`) end results.md."""
    summaries = summarise(runs)
    paired = paired_differences(runs)
    methods = {r.method for r in runs}
    if command == "ablate" and "mcgpo" in methods and paired and paired[0].baseline != "mcgpo":
        paired += paired_differences(runs, baseline="mcgpo")
    text = render_results_md(
        summaries, title=f"mcgpo {command}", header_lines=header, paired=paired
    )
    write_atomic(out / "results.md", text + "".join(f"{line}\n" for line in appendix))
    if not tables_only:
        write_points_jsonl(out / "evals.jsonl", runs)
        plot_learning_curves(runs, out / "curves.png")
        if any(s.per_type for s in summaries):
            plot_task_type_bars(summaries, out / "task_types.png")
    print((out / "results.md").read_text(encoding="utf-8"))


def kept_header(results_md: Path, command: str) -> list[str]:
    """The header lines (command, preset, machine, date) of an existing ``results.md`` written
    by ``mcgpo <command>``, without the lines about runs left out or an earlier re-render;
    empty when the file is missing or another command wrote it."""
    if not results_md.is_file():
        return []
    lines = results_md.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != f"# mcgpo {command}":
        return []
    header = []
    for line in lines[1:]:
        if line.startswith(("|", "#")):
            break
        if line.strip() and not line.startswith(_STALE):
            header.append(line)
    return header


def report_finished(
    command: str,
    argv: Sequence[str],
    out: Path,
    variants: Sequence[Variant],
    seeds: list[int],
    looks: Sequence[int] = (),
) -> int:
    """Re-render ``out/results.md`` from the finished runs of ``variants`` x ``seeds``, with
    the group-sequential look at ``looks`` (cumulative paired seeds) when given.

    Returns 0 when every named run is finished, 1 when some are not (the table holds the
    others and names them), 2 with a one-line error when there is nothing to report, a
    finished run's metrics cannot be read or the paired seeds are not one of ``looks``."""
    if not (out / "runs").is_dir():
        return _error(command, f"--out {str(out)!r} has no runs/ folder: nothing to report")
    plans = plan_runs(variants, seeds, out, common=[], threads=1)
    finished = [p for p in plans if run_status(p.folder) == "done"]
    if not finished:
        return _error(
            command,
            f"no finished run under {str(out / 'runs')!r} for these methods and seeds "
            f"(looked for {plans[0].folder.name}, ...)",
        )
    missing = [str(p.folder) for p in plans if p not in finished]
    runs = []
    for plan in finished:
        try:
            run = load_run_result(plan.variant.label, plan.seed, plan.folder)
        except (OSError, ValueError, KeyError, TypeError) as err:
            reason = f"{type(err).__name__}: {err}".splitlines()[0]
            return _error(command, f"{plan.folder}: unreadable metrics.jsonl ({reason})")
        if not run.points:
            return _error(command, f"{plan.folder}: metrics.jsonl has no evaluation")
        runs.append(run)
    try:
        sequential = sequential_looks(runs, looks) if looks else None
    except ValueError as err:
        return _error(command, f"--sequential: {err}")
    shown = " ".join(a for a in argv if a != "--report-only")
    header = kept_header(out / "results.md", command) or [
        f"Command: `mcgpo {command} {shown}`".rstrip(),
        f"Seeds: {', '.join(map(str, seeds))}.",
    ]
    header.append(
        f"{REPORT_NOTE} by `mcgpo {command} {' '.join(argv)}` on {dt.date.today().isoformat()} "
        "(no training; evals.jsonl and the plots drawn again from the same runs)."
    )
    if missing:
        header.append(f"Runs not finished and left out: {', '.join(missing)}.")
        print(f"mcgpo {command}: {len(missing)} runs not finished, left out", file=sys.stderr)
    appendix = sequential_section(sequential) if sequential else []
    write_results(command, out, runs, header, appendix=appendix)
    if sequential:
        plot_sequential_looks(sequential.history, sequential.looks, out / "sequential.png")
    return 1 if missing else 0


@dataclass(frozen=True)
class SequentialLooks:
    """A group-sequential design at ``looks`` and every look held so far, per comparison.

    ``history``: for each method against the baseline of :func:`paired_differences`, the
    look results at each planned look up to the one at the number of shared seeds, look k
    on the first ``looks[k]`` paired seeds in increasing order (the order the design runs
    them)."""

    looks: tuple[int, ...]
    alpha: float
    kind: str
    fractions: np.ndarray
    spent: np.ndarray
    bounds: np.ndarray
    thresholds: np.ndarray
    history: tuple[tuple[PairedDifference, tuple[LookResult, ...]], ...]


def sequential_looks(
    runs: Sequence[RunResult],
    looks: Sequence[int],
    alpha: float = 0.05,
    kind: str = "obrien_fleming",
) -> SequentialLooks:
    """The design's boundaries at ``looks`` and each comparison's looks on the per-seed
    differences of integrated success. The current look is the one at the number of shared
    seeds; a ValueError names the comparison when that is not in ``looks``, or when there is
    no comparison."""
    fractions = look_fractions(looks)
    bounds = spending_boundaries(fractions, alpha, kind)
    by_run = {(r.method, r.seed): float(np.mean([p.success for p in r.points])) for r in runs}
    history = []
    for d in paired_differences(runs):
        diffs = [by_run[d.method, s] - by_run[d.baseline, s] for s in d.seeds]  # seed order
        try:
            index = look_index(len(diffs), looks)
        except ValueError as err:
            raise ValueError(
                f"{d.method} - {d.baseline}: {err}; a look held at another count of seeds "
                "is given as that count"
            ) from None
        held = tuple(evaluate_look(diffs[: looks[k]], bounds, k) for k in range(index + 1))
        history.append((d, held))
    if not history:
        raise ValueError("no paired comparison: the runs hold fewer than two methods")
    return SequentialLooks(
        looks=tuple(looks),
        alpha=alpha,
        kind=kind,
        fractions=fractions,
        spent=alpha_spent(fractions, alpha, kind),
        bounds=bounds,
        thresholds=nominal_thresholds(bounds),
        history=tuple(history),
    )


def sequential_section(seq: SequentialLooks) -> list[str]:
    """The results.md section "Group-sequential look": the design's boundaries and, for each
    comparison, every look held so far (the last row is the current look)."""
    baseline = seq.history[0][0].baseline
    lines = [
        "",
        f"## Group-sequential look (integrated success, method - {baseline}, per seed)",
        "",
        f"Design: looks at {', '.join(map(str, seq.looks))} paired seeds, two-sided "
        f"α = {seq.alpha:g}, Lan–DeMets {_KIND_NAMES.get(seq.kind, seq.kind)}-type alpha "
        "spending (docs/sequential.md).",
        "",
        "| Look | Seeds | Information fraction | α spent (cumulative) | z boundary "
        "| Nominal p threshold |",
        "|---|---|---|---|---|---|",
    ]
    for k, n in enumerate(seq.looks):
        lines.append(
            f"| {k + 1} | {n} | {seq.fractions[k]:.3f} | {seq.spent[k]:.5f} "
            f"| {seq.bounds[k]:.3f} | {seq.thresholds[k]:.5f} |"
        )
    lines += [
        "",
        "| Method | Look | n | Δ | t | p | Threshold | Repeated CI | Decision |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for d, held in seq.history:
        for r in held:
            ci = f"[{100 * r.interval[0]:+.1f}, {100 * r.interval[1]:+.1f}] ({100 * r.level:.2f} %)"
            lines.append(
                f"| {d.method} | {r.look} of {r.looks} | {r.n} | {100 * r.mean:+.1f} "
                f"| {r.t:.2f} | {r.p:.5f} | {r.threshold:.5f} | {ci} "
                f"| {r.decision.text(d.method, baseline)} |"
            )
    lines += [
        "",
        "Δ and the repeated confidence interval in percentage points. Each look on the first "
        "n paired seeds in increasing order; the last row of a method is the current look. p "
        "is the paired t-test's two-sided p-value (n − 1 df); a look stops when p is at most "
        "its threshold, 2 (1 − Φ(z boundary)); the repeated CI is the t-interval at level "
        "1 − threshold and excludes 0 exactly then.",
    ]
    return lines


def _error(command: str, message: str) -> int:
    print(f"mcgpo {command}: error: {message}", file=sys.stderr)
    return 2
