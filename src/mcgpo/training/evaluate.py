"""Evaluation on held-out tasks, and the per-episode summary shared with training.

The papers' protocol (reference/algorithms.md 1.4): one sampled episode per held-out task at
temperature 0.4, success rate overall and per task type (ALFWorld), plus WebShop's task
score. Held-out tasks are the first ``eval.tasks`` tasks of ``eval.split``, and the sampling
seed depends on the run seed only: every evaluation of a run plays the same tasks with the
same random stream, so curves compare like with like and an evaluation is reproducible.

Episodes that hit an environment error are reported (``errored``, counting those whose
reset failed too) and left out of the rates, as they are left out of learning; ``episodes``
is every episode played.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Any

import numpy as np

from mcgpo.grouping import trajectory_view
from mcgpo.rollout.group_rollout import collect
from mcgpo.steps import StepTable
from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.build import collect_options
from mcgpo.training.config import RunConfig
from mcgpo.training.distributed import (
    SINGLE,
    World,
    gather_objects,
    joined_world,
    rank_block,
    union_tables,
)
from mcgpo.training.env_pools import RunPools
from mcgpo.training.metrics import ProgressBar, Table
from mcgpo.training.setup import RunSetup, prepare
from mcgpo.training.start_lines import eval_start_line

__all__ = ["episode_summary", "evaluate", "run_eval"]


def episode_summary(table: StepTable, prefix: str) -> dict[str, float]:
    """Success, score and length per episode, overall and per task type.

    Keys: ``{prefix}/success``, ``{prefix}/score``, ``{prefix}/turns``,
    ``{prefix}/episodes``, ``{prefix}/errored``, ``{prefix}/valid_actions`` and
    ``{prefix}/success/<task_type>`` for every task type present.
    """
    if len(table) == 0:
        return {f"{prefix}/episodes": 0.0}
    view = trajectory_view(table)  # one row per trajectory: its outcome fields agree
    head, n_traj = view.head, view.count
    turns = np.bincount(view.traj, minlength=n_traj)
    errored = table.errored[head]
    ok = ~errored
    out = {
        f"{prefix}/episodes": float(n_traj),
        f"{prefix}/errored": float(errored.sum()),
    }
    if not ok.any():
        return out
    out[f"{prefix}/success"] = float(table.success[head][ok].mean())
    out[f"{prefix}/score"] = float(table.score[head][ok].mean())
    out[f"{prefix}/turns"] = float(turns[ok].mean())
    out[f"{prefix}/valid_actions"] = float(table.action_valid[~table.errored].mean())
    types = table.task_type[head]
    for name in sorted(set(types[ok].tolist())):
        if name:
            sel = ok & (types == name)
            out[f"{prefix}/success/{name}"] = float(table.success[head][sel].mean())
    return out


def evaluate(
    setup: RunSetup,
    world: World = SINGLE,
    *,
    engine: Any = None,
    show: bool = False,
    pools: RunPools | None = None,
) -> dict[str, float]:
    """One episode per held-out task at ``eval.temperature`` with the policy of ``setup`` (as
    it is now); returns ``eval/*`` metrics (empty when ``eval.tasks`` is 0). ``engine``: a
    rollout engine that holds the policy's weights samples instead of mcgpo's sampler (a
    training run whose policy is sharded, ``train.fsdp_replica false``).

    With W > 1 processes each rank plays a contiguous block of the held-out tasks; the
    StepTables are gathered and every rank returns the metrics of their union. ``show``: a
    progress bar over the episodes on stderr (this rank's). ``pools``: a training run's kept
    environment pools (the episodes play in its ``"eval"`` pool); None: a pool of their own."""
    cfg = setup.cfg
    if cfg.eval.tasks == 0:
        return {}
    options = collect_options(
        cfg,
        setup.response_format,
        split=cfg.eval.split,
        temperature=cfg.eval.temperature,
        group_size=1,
        seed=eval_seed(cfg.seed),
    )
    block = rank_block(cfg.eval.tasks, world)
    tasks = list(block)
    # each episode's sampling stream follows its global index, whichever rank plays it
    options = dataclasses.replace(options, group_offset=block.start)
    table, errored = None, 0
    bar = ProgressBar(len(tasks), enabled=show, desc="eval", unit="episode", leave=False)
    if tasks:  # a rank can have no task when there are fewer tasks than ranks
        kept = contextlib.nullcontext(None)
        if pools is not None:
            kept = pools.lease("eval", setup.make_env, len(tasks), options)
        with kept as pool:
            rollout = collect(
                setup.model,
                setup.tokenizer,
                setup.make_env,
                tasks,
                options,
                engine=engine,
                on_turn=bar.reach,
                pool=pool,
            )
        table, errored = rollout.table, int(rollout.stats["errored_trajectories"])
    bar.close()
    parts = gather_objects((table, errored), world)
    tables = [t for t, _ in parts if t is not None]
    stats = episode_summary(union_tables(tables, group_size=1), "eval")
    # an episode whose reset failed has no row: count it from the rollouts
    stats["eval/episodes"] = float(cfg.eval.tasks)
    stats["eval/errored"] = float(sum(n for _, n in parts))
    return stats


def run_eval(cfg: RunConfig, command: str = "") -> Table:
    """``mcgpo eval``: evaluate ``cfg.model`` and write ``eval.json`` into ``cfg.out``.

    Under torchrun (W > 1 processes, ``--nproc``) each rank plays a block of the held-out
    tasks (:func:`evaluate`); the result is the single process's, and rank 0 writes it."""
    with joined_world(cfg, kind="eval") as (cfg, world):
        setup = prepare(cfg, command, kind="eval", world=world)
        if world.main:  # checked and loaded: say what comes
            print(eval_start_line(cfg), file=sys.stderr, flush=True)
        stats = evaluate(setup, world, show=cfg.progress and world.main)
        if world.main and stats.get("eval/errored"):
            print(
                f"mcgpo eval: warning: {stats['eval/errored']:.0f} of "
                f"{stats['eval/episodes']:.0f} episodes hit an environment error (left out "
                "of the rates)",
                file=sys.stderr,
            )
        if world.main:
            text = json.dumps({"command": command, "processes": world.size, **stats}, indent=2)
            atomic_write_text(setup.folder / "eval.json", text + "\n")
    return Table.from_metrics(f"evaluation of {cfg.model} on {cfg.env.name}", {"": stats})


def eval_seed(seed: int) -> int:
    """The sampling seed of every evaluation of a run with ``seed``.

    One seed for all evaluations (common random numbers): the same policy always gets the
    same result, so "after SFT" and a training run's update-0 evaluation agree exactly, and
    differences between checkpoints are not blurred by resampling the evaluation itself.
    """
    return int(np.random.SeedSequence([seed, 0xE7A1]).generate_state(1)[0])
