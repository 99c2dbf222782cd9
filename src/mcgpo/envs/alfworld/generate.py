"""Generated ALFWorld-style games on disk: solvability gate, cache, ``mcgpo alfworld-generate``.

A game is identified by (split, seed); seed ``s`` plays task type ``TASK_TYPES[s % 6]``, so
any six consecutive seeds cover all six types. The game is written in the official layout::

    <root>/json_2.1.1/<split>/<task_type>/trial_<seed:07d>/{game.tw-pddl, traj_data.json}

so that ``ALFWORLD_DATA=<root>`` also works with ALFWorld's own loader. Before a game is
written it passes ALFWorld's "solvable" gate: it loads, resets, the planner finds a plan, and
playing the plan wins. The check runs in a child process with a time limit, so that a game
that crashes the engine (fast-downward exits or aborts on some problems, the reference notes
a ``KeyError: 'val1'``) or whose plan takes too long is rejected, never served; the next
attempt of the same (split, seed) is then drawn (deterministically).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mcgpo.command_line import OneLineParser
from mcgpo.envs.alfworld.engine import solve
from mcgpo.envs.alfworld.problem import GENERATOR_VERSION, build_game
from mcgpo.envs.alfworld_keys import TASK_TYPES
from mcgpo.envs.protocol import SPLITS

__all__ = [
    "DEFAULT_CACHE",
    "MAX_ATTEMPTS",
    "GameGenerationError",
    "game_path",
    "generate_games",
    "main",
    "solvable_game",
]

DEFAULT_CACHE = Path("~/.cache/mcgpo/alfworld").expanduser()
MAX_ATTEMPTS = 40  # draws per (split, seed) before giving up (measured: nearly all pass first)
DATA_DIR = "json_2.1.1"


class GameGenerationError(ValueError):
    """No solvable game could be generated for a (split, seed), or a bad argument."""


def game_path(root: Path, split: str, seed: int) -> Path:
    """Where game ``seed`` of ``split`` lives under ``root`` (a function of its arguments)."""
    task_type = TASK_TYPES[seed % len(TASK_TYPES)]
    return Path(root) / DATA_DIR / split / task_type / f"trial_{seed:07d}" / "game.tw-pddl"


def _check_ready(path: Path) -> bool:
    """Whether ``path`` holds a complete, solvable game file (a torn write is not one)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("solvable") is True and "pddl_problem" in data


def _solve_child(path: str, conn) -> None:  # pragma: no cover - runs in the child process
    try:
        conn.send(("ok", solve(path)))
    except ValueError as err:
        conn.send(("unsolvable", str(err)))
    finally:
        conn.close()


def check_in_child(path: Path, timeout_s: float) -> list[str]:
    """Run :func:`solve` on ``path`` in a child process; ValueError when it is rejected."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_solve_child, args=(str(path), child), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise ValueError(f"the planner took longer than {timeout_s:g} s")
        try:
            status, payload = parent.recv()
        except EOFError:
            proc.join(5)
            raise ValueError(f"the engine crashed (exit code {proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
    if status != "ok":
        raise ValueError(payload)
    return payload


def _write_json(path: Path, data: dict) -> None:
    """Atomic write: readers never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def solvable_game(
    root: Path, split: str, seed: int, *, timeout_s: float = 60.0, stats: dict | None = None
) -> Path:
    """The path of game (split, seed) under ``root``, generating and gating it if needed.

    Concurrent callers (several envs of a pool on the same seed) wait on a file lock, so a
    game is generated once. ``stats`` (optional) counts ``games_generated`` and
    ``games_rejected`` and lists ``rejected`` reasons.
    """
    if split not in SPLITS:
        raise GameGenerationError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    if seed < 0:
        raise GameGenerationError(f"seed must be >= 0 for generated games, got {seed}")
    path = game_path(root, split, seed)
    if _check_ready(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _check_ready(path):  # another process finished it while we waited
            return path
        reasons = []
        for attempt in range(MAX_ATTEMPTS):
            built = build_game(split, seed, attempt)
            if built is None:
                continue
            gamedata, traj_data = built
            draft = path.with_name("draft.tw-pddl")
            _write_json(draft, gamedata)
            try:
                plan = check_in_child(draft, timeout_s)
            except ValueError as err:
                reasons.append(f"attempt {attempt}: {err}")
                if stats is not None:
                    stats["games_rejected"] = stats.get("games_rejected", 0) + 1
                    stats.setdefault("rejected", []).append(f"{split}/{seed} {reasons[-1]}")
                continue
            finally:
                draft.unlink(missing_ok=True)
            gamedata.update(solvable=True, walkthrough=plan)
            _write_json(path.with_name("traj_data.json"), traj_data)
            _write_json(path, gamedata)
            if stats is not None:
                stats["games_generated"] = stats.get("games_generated", 0) + 1
            return path
    raise GameGenerationError(
        f"no solvable game for split {split!r} seed {seed} in {MAX_ATTEMPTS} attempts: "
        + "; ".join(reasons[-3:])
    )


def generate_games(
    out_dir: str | Path,
    n_per_type: int,
    seed: int = 0,
    split: str = "train",
    *,
    timeout_s: float = 60.0,
) -> list[Path]:
    """Generate ``n_per_type`` games of each of the six task types into ``out_dir``.

    Seeds ``seed .. seed + 6 * n_per_type - 1`` of ``split`` (six consecutive seeds cover the
    six types). Returns the ``game.tw-pddl`` paths, in seed order; games already present are
    kept. ``ALFWORLD_DATA=out_dir`` then plays them as official-layout games.
    """
    if isinstance(n_per_type, bool) or not isinstance(n_per_type, int) or n_per_type < 1:
        raise GameGenerationError(f"n_per_type must be a positive integer, got {n_per_type!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise GameGenerationError(f"seed must be a non-negative integer, got {seed!r}")
    root = Path(out_dir).expanduser()
    return [
        solvable_game(root, split, s, timeout_s=timeout_s)
        for s in range(seed, seed + len(TASK_TYPES) * n_per_type)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``mcgpo alfworld-generate``: write solvable ALFWorld-style games to a folder."""
    parser = OneLineParser(
        prog="mcgpo alfworld-generate",
        description="Generate solvable ALFWorld-style games (all six task types) offline from "
        "the alfworld wheel's assets, in the official json_2.1.1 layout.",
    )
    parser.add_argument("--out-dir", default=str(DEFAULT_CACHE / GENERATOR_VERSION))
    parser.add_argument("--n-per-type", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--split", default="train", choices=SPLITS)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="planner limit per game")
    args = parser.parse_args(argv)
    try:
        paths = generate_games(
            args.out_dir, args.n_per_type, args.seed, args.split, timeout_s=args.timeout_s
        )
    except (GameGenerationError, ImportError) as err:
        print(f"alfworld-generate: {err}", file=sys.stderr)
        return 2
    print(f"{len(paths)} games in {Path(args.out_dir).expanduser()} (split {args.split})")
    return 0
