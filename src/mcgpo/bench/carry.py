"""Carry a benchmark folder's results across sessions or machines in a few megabytes.

A long study (many seeds, hours of runs) outlives the session, the scratch disk or the
machine that started it. :func:`save` copies what ``mcgpo bench`` / ``ablate`` / ``sweep``
need to resume without redoing finished work, and nothing else: the warm start's model
folder, ``sft.json`` and ``config.toml`` (with the model there, the warm start is not made
again); every *finished* run's ``metrics.jsonl``, ``config.toml``, ``eval.json`` and
``bench-done.json`` (so the run is skipped and its evaluations enter the tables); and the
tables and plots. Checkpoints, logs and unfinished runs stay behind (an unfinished run
starts again). :func:`restore` copies a saved folder back to where the benchmark resumes.

``mcgpo bench --carry DIR`` does both itself: it restores ``DIR`` into ``--out`` before
planning, carries each run into ``DIR`` the moment it finishes (:func:`carry_run`) and the
warm start once it is made, and saves the tables and plots at the end; stopping it at any
point loses at most the runs still going. ``scripts/bench_carry.py`` is the same, by hand.

Every file is written atomically (a temporary file, then a rename), so a carried folder
never holds half a file, and a run's ``bench-done.json`` is carried last, so a carried run
that has the marker has all its files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mcgpo.bench.runner import DONE_MARKER, run_status, set_aside

__all__ = ["RUN_FILES", "carry_run", "carry_warm_start", "restore", "save"]

RUN_FILES = ("metrics.jsonl", "config.toml", "eval.json", DONE_MARKER)  # the marker last
WARM_FILES = ("sft.json", "config.toml")
TOP_FILES = ("results.md", "evals.jsonl", "curves.png", "task_types.png", "sequential.png")


def save(bench: Path, dest: Path, *, runs_only: bool = False) -> list[Path]:
    """Copy ``bench``'s resumable results to ``dest``; return the files written.
    ``runs_only``: the finished runs' files alone (no tables, plots or warm start), for a
    study run one seed per command, whose tables would describe the last seed only."""
    bench, dest = Path(bench), Path(dest)
    if not (bench / "warmstart").is_dir() and not (bench / "runs").is_dir():
        raise ValueError(f"{bench}: not a benchmark folder (no warmstart/ or runs/)")
    written: list[Path] = []
    if not runs_only:
        written += _copy(bench, dest, [bench / name for name in TOP_FILES])
        written += carry_warm_start(bench, dest)
    runs = bench / "runs"
    for run in sorted(runs.iterdir()) if runs.is_dir() else []:
        written += carry_run(run, bench, dest)
    return written


def carry_run(run: Path, bench: Path, dest: Path) -> list[Path]:
    """Copy one run's files (``bench/runs/<name>/``) to ``dest``, if the run is finished."""
    run = Path(run)
    if not (run / DONE_MARKER).is_file():
        return []
    return _copy(Path(bench), Path(dest), [run / name for name in RUN_FILES])


def carry_warm_start(bench: Path, dest: Path) -> list[Path]:
    """Copy the warm start (its model folder once made, ``sft.json``, ``config.toml``)."""
    warm = Path(bench) / "warmstart"
    files = [warm / name for name in WARM_FILES]
    if (warm / "model" / "config.json").is_file():
        files += sorted(p for p in (warm / "model").rglob("*") if p.is_file())
    return _copy(Path(bench), Path(dest), files)


def restore(saved: Path, bench: Path) -> list[Path]:
    """Copy a saved folder into ``bench``; files already in ``bench`` are kept, except that a
    run finished in ``saved`` but not in ``bench`` replaces the unfinished one (whose files
    are set aside in ``<run>/stale-<n>/``, as the runner does with a stale run)."""
    saved, bench = Path(saved), Path(bench)
    if not saved.is_dir():
        raise ValueError(f"{saved}: no such folder")
    for run in sorted((saved / "runs").iterdir()) if (saved / "runs").is_dir() else []:
        mine = bench / "runs" / run.name
        behind = mine.is_dir() and run_status(mine) != "done"
        if behind and (run / DONE_MARKER).is_file() and _has_files(mine):
            set_aside(mine)
    written = []
    for src in sorted(p for p in saved.rglob("*") if p.is_file()):
        target = bench / src.relative_to(saved)
        if not target.exists():
            _copy_file(src, target)
            written.append(target)
    return written


def _has_files(run: Path) -> bool:
    """Whether ``run`` holds anything besides folders set aside before."""
    return any(not p.name.startswith("stale-") for p in run.iterdir())


def _copy(root: Path, dest: Path, files: list[Path]) -> list[Path]:
    written = []
    for src in files:
        if src.is_file():
            target = dest / src.relative_to(root)
            _copy_file(src, target)
            written.append(target)
    return written


def _copy_file(src: Path, target: Path) -> None:
    """``src`` to ``target`` atomically (a temporary file beside it, then a rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
