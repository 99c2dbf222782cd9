"""Carry a benchmark folder's results across sessions (or machines) in a few megabytes.

    python scripts/bench_carry.py save    runs/household-mid-issue25 docs/results/household-mid-issue25
    python scripts/bench_carry.py restore docs/results/household-mid-issue25 runs/household-mid-issue25
    python scripts/bench_carry.py save --runs-only runs/powered-household-mid docs/results/powered-household-mid

By hand what ``mcgpo bench --carry DIR`` does as it runs (:mod:`mcgpo.bench.carry`: what is
kept and why). ``save`` copies what the benchmark needs to resume without redoing finished
work: the warm start, every *finished* run's metrics, config, evaluation and done marker,
and the tables and plots; checkpoints, logs and unfinished runs stay behind. ``save
--runs-only`` copies the finished runs alone: for a study run one seed per command, whose
tables and plots would describe the last seed only and overwrite the study's (the study's
tables come from ``--report-only`` over all its seeds). ``restore`` copies a saved folder
back to where the benchmark command resumes from it, keeping any file already there (a run
finished in the saved folder replaces an unfinished one, which is set aside).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcgpo.bench.carry import restore, save

__all__ = ["main", "restore", "save"]


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
