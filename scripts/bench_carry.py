"""Carry a benchmark folder's results across sessions (or machines) in a few megabytes.

    python scripts/bench_carry.py save    runs/household-mid-issue25 docs/results/household-mid-issue25
    python scripts/bench_carry.py restore docs/results/household-mid-issue25 runs/household-mid-issue25
    python scripts/bench_carry.py save --runs-only runs/powered-household-mid docs/results/powered-household-mid

``save`` copies what ``mcgpo bench`` / ``ablate`` need to resume without redoing finished
work, and nothing else: the warm start's model folder, ``sft.json`` and ``config.toml``
(with the model there, the warm start is not made again); every *finished* run's
``metrics.jsonl``, ``config.toml``, ``eval.json`` and ``bench-done.json`` (so the run is
skipped and its evaluations enter the tables); and the tables and plots. Checkpoints, logs
and unfinished runs stay behind (an unfinished run starts again). ``save --runs-only``
copies the finished runs alone: for a study run one seed per command, whose tables and plots
would describe the last seed only and overwrite the study's (the study's tables come from
``--report-only`` over all its seeds). ``restore`` copies a saved folder back to where the
benchmark command resumes from it, keeping any file already there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

DONE_MARKER = "bench-done.json"  # mcgpo.bench.runner.DONE_MARKER
RUN_FILES = ("metrics.jsonl", "config.toml", "eval.json", DONE_MARKER)
WARM_FILES = ("sft.json", "config.toml")
TOP_FILES = ("results.md", "evals.jsonl", "curves.png", "task_types.png")


def save(bench: Path, dest: Path, *, runs_only: bool = False) -> list[Path]:
    """Copy ``bench``'s resumable results to ``dest``; return the files written.
    ``runs_only``: the finished runs' files alone (no tables, plots or warm start)."""
    if not (bench / "warmstart").is_dir() and not (bench / "runs").is_dir():
        raise ValueError(f"{bench}: not a benchmark folder (no warmstart/ or runs/)")
    wanted: list[Path] = []
    warm = bench / "warmstart"
    if not runs_only:
        wanted += [bench / name for name in TOP_FILES]
        wanted += [warm / name for name in WARM_FILES]
        if (warm / "model" / "config.json").is_file():
            wanted += sorted(p for p in (warm / "model").rglob("*") if p.is_file())
    for run in sorted((bench / "runs").glob("*")) if (bench / "runs").is_dir() else []:
        if (run / DONE_MARKER).is_file():
            wanted += [run / name for name in RUN_FILES]
    written = []
    for src in wanted:
        if src.is_file():
            target = dest / src.relative_to(bench)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            written.append(target)
    return written


def restore(saved: Path, bench: Path) -> list[Path]:
    """Copy a saved folder into ``bench``; files already in ``bench`` are kept."""
    if not saved.is_dir():
        raise ValueError(f"{saved}: no such folder")
    written = []
    for src in sorted(p for p in saved.rglob("*") if p.is_file()):
        target = bench / src.relative_to(saved)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    parser.add_argument(
        "--runs-only", action="store_true", help="save: the finished runs only (no tables)"
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "save":
            written = save(args.source, args.dest, runs_only=args.runs_only)
        else:
            if args.runs_only:
                raise ValueError("--runs-only goes with save only")
            written = restore(args.source, args.dest)
    except ValueError as err:
        print(f"bench_carry.py: error: {err}", file=sys.stderr)
        return 2
    print(f"{args.action}: {len(written)} files -> {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
