"""Evaluation on held-out tasks, and the per-episode summary shared with training.

The papers' protocol (reference/algorithms.md 1.4): one sampled episode per held-out task at
temperature 0.4, success rate overall and per task type (ALFWorld), plus WebShop's task
score. Held-out tasks are the first ``eval.tasks`` tasks of ``eval.split``, and the sampling
seed depends on the run seed only: every evaluation of a run plays the same tasks with the
same random stream, so curves compare like with like and an evaluation is reproducible.

Episodes that hit an environment error are reported (``errored``) and left out of the
rates, as they are left out of learning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mcgpo.advantages.groups import codes
from mcgpo.steps import StepTable
from mcgpo.training.config import RunConfig

__all__ = ["episode_summary", "evaluate", "run_eval"]


def episode_summary(table: StepTable, prefix: str) -> dict[str, float]:
    """Success, score and length per episode, overall and per task type.

    Keys: ``{prefix}/success``, ``{prefix}/score``, ``{prefix}/turns``,
    ``{prefix}/episodes``, ``{prefix}/errored``, ``{prefix}/valid_actions`` and
    ``{prefix}/success/<task_type>`` for every task type present.
    """
    if len(table) == 0:
        return {f"{prefix}/episodes": 0.0}
    t = codes(table.traj)
    n_traj = int(t.max()) + 1
    head = np.zeros(n_traj, dtype=np.int64)
    head[t] = np.arange(len(t))  # one row per trajectory (any of its rows: fields agree)
    turns = np.bincount(t, minlength=n_traj)
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
    model: Any,
    tokenizer: Any,
    env_factory: Callable[[], Any],
    cfg: RunConfig,
    *,
    response_format: str,
    seed: int,
) -> dict[str, float]:
    """One episode per held-out task at ``eval.temperature``; returns ``eval/*`` metrics."""
    from mcgpo.rollout import collect

    if cfg.eval.tasks == 0:
        return {}
    rollout = collect(
        model,
        tokenizer,
        env_factory,
        list(range(cfg.eval.tasks)),
        group_size=1,
        split=cfg.eval.split,
        temperature=cfg.eval.temperature,
        max_turns=cfg.env.max_turns or None,
        max_new_tokens=cfg.rollout.max_new_tokens,
        history=cfg.rollout.history,
        response_format=response_format,
        seed=seed,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
    )
    return episode_summary(rollout.table, "eval")


def run_eval(cfg: RunConfig, command: str = "") -> Any:
    """``mcgpo eval``: evaluate ``cfg.model`` and write ``eval.json`` into ``cfg.out``."""
    import json
    from pathlib import Path

    from mcgpo.training.metrics import Table
    from mcgpo.training.setup import apply_runtime, env_factory, load_model, response_format_for

    make_env = env_factory(cfg)  # a bad environment option fails before the model loads
    apply_runtime(cfg)
    model, tokenizer = load_model(cfg, make_env=make_env)
    fmt = response_format_for(cfg, tokenizer)
    stats = evaluate(model, tokenizer, make_env, cfg, response_format=fmt, seed=eval_seed(cfg.seed))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps({"command": command, **stats}, indent=2) + "\n")
    return Table.from_metrics(f"evaluation of {cfg.model} on {cfg.env.name}", {"": stats})


def eval_seed(seed: int) -> int:
    """The sampling seed of every evaluation of a run with ``seed``.

    One seed for all evaluations (common random numbers): the same policy always gets the
    same result, so "after SFT" and a training run's update-0 evaluation agree exactly, and
    differences between checkpoints are not blurred by resampling the evaluation itself.
    """
    return int(np.random.SeedSequence([seed, 0xE7A1]).generate_state(1)[0])
