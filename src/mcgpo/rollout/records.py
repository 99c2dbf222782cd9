"""What one collection accumulates and returns: trajectories, counters, the Rollout.

:func:`mcgpo.rollout.group_rollout.collect` plays the turns; this module holds the per-trajectory
record of each turn (:func:`record_turn`, the StepTable row fields), and puts the rows,
tokens and stats of a finished collection together (:func:`assemble`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mcgpo.envs.protocol import Observation, StepResult
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.steps import StepTable

__all__ = ["Rollout", "Tally", "Trajectory", "assemble", "record_turn"]


@dataclass(frozen=True, eq=False)
class Rollout:
    """One batch of group rollouts; ``tokens`` row i belongs to ``table`` row i."""

    table: StepTable  # [R] rows, ordered by (group, slot, turn)
    tokens: TokenBatch  # [R, L] prompt + response tokens of each row
    stats: dict[str, float]  # success rate, mean turns, invalid rate, tokens, seconds, ...
    responses: tuple[str, ...] = field(default=())  # [R] decoded response text of each row
    errors: dict[int, str] = field(default_factory=dict)  # traj id -> environment error message

    def learnable(self) -> Rollout:
        """The rows of trajectories that did not hit an environment error (what is learned
        from); ``stats`` are kept, ``errors`` dropped."""
        keep = np.flatnonzero(~self.table.errored)
        return Rollout(
            self.table.select(keep),
            self.tokens.select(keep),
            self.stats,
            tuple(self.responses[i] for i in keep) if self.responses else (),
            {},
        )


@dataclass
class Trajectory:
    """Rows and token pieces of one environment, filled turn by turn."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    responses: list[list[int]] = field(default_factory=list)
    log_probs: list[list[float]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    past: list[tuple[str, str]] = field(default_factory=list)
    inadmissible: int = 0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Tally:
    """Counters of one collection: prompt-budget fallbacks, tokens, seconds."""

    no_history: int = 0  # prompts re-rendered without history
    cut: int = 0  # prompts whose oldest tokens were cut
    truncated: int = 0  # responses cut by the token budget
    generated: int = 0  # sampled tokens
    sample_seconds: float = 0.0
    env_seconds: float = 0.0


def record_turn(
    tr: Trajectory,
    obs: Observation,
    res: StepResult,
    action: str,
    valid: bool,
    e: int,
    group_size: int,
    task_type: str,
) -> None:
    ctx, nxt = obs.context, res.observation.context
    tr.rows.append(
        {
            "group": e // group_size,
            "traj": e,
            "slot": e % group_size,
            "turn": len(tr.rows),
            "reward": float(res.reward),
            "done": bool(res.done),
            "action": action,
            "action_valid": bool(valid),
            "anchor": ctx.anchor,
            "next_anchor": nxt.anchor,
            "state": ctx.state,
            "state_coarse": ctx.state_coarse,
            "progress": ctx.progress,
            "enabled": ctx.enabled,
            "progress_value": float(ctx.progress_value),
            "next_progress_value": float(nxt.progress_value),
            "task_type": task_type,
        }
    )
    tr.past.append((obs.text, action))
    tr.inadmissible += not res.info.get("action_valid", True)
    tr.done = bool(res.done)
    tr.info = res.info


def assemble(
    trajs: list[Trajectory],
    errored: list[bool],
    pad: int,
    tally: Tally,
    start: float,
) -> Rollout:
    rows: list[dict[str, Any]] = []
    prompts: list[list[int]] = []
    responses: list[list[int]] = []
    log_probs: list[list[float]] = []
    texts: list[str] = []
    for e, tr in enumerate(trajs):
        success = float(bool(tr.info.get("won", False)))
        score = float(tr.info.get("score", 0.0))
        for row in tr.rows:
            rows.append({**row, "success": success, "score": score, "errored": errored[e]})
        prompts += tr.prompts
        responses += tr.responses
        log_probs += tr.log_probs
        texts += tr.texts
    table = StepTable.from_records(rows)
    tokens = TokenBatch.from_sequences(prompts, responses, log_probs, pad_token_id=pad)
    stats = _stats(trajs, errored, table, tokens, tally)
    stats["seconds"] = time.perf_counter() - start
    stats["sample_seconds"] = tally.sample_seconds
    stats["env_seconds"] = tally.env_seconds
    return Rollout(table, tokens, stats, tuple(texts))


def _stats(
    trajs: list[Trajectory],
    errored: list[bool],
    table: StepTable,
    tokens: TokenBatch,
    tally: Tally,
) -> dict[str, float]:
    ok = [e for e, tr in enumerate(trajs) if not errored[e] and tr.rows]
    rows_ok = ~table.errored
    n_rows = int(rows_ok.sum())
    resp = tokens.response_lengths().numpy()
    prompt = tokens.sequence_lengths().numpy() - resp
    stats: dict[str, float] = {
        "trajectories": float(len(trajs)),
        "errored_trajectories": float(sum(errored)),
        "rows": float(len(table)),
        "success_rate": _mean([float(bool(trajs[e].info.get("won"))) for e in ok]),
        "score_mean": _mean([float(trajs[e].info.get("score", 0.0)) for e in ok]),
        "mean_turns": _mean([float(len(trajs[e].rows)) for e in ok]),
        "invalid_rate": float((~table.action_valid[rows_ok]).mean()) if n_rows else 0.0,
        "inadmissible_rate": sum(trajs[e].inadmissible for e in ok) / max(n_rows, 1),
        "tokens_generated": float(tally.generated),
        "response_tokens_mean": float(resp.mean()) if len(resp) else 0.0,
        "prompt_tokens_mean": float(prompt.mean()) if len(prompt) else 0.0,
        "prompt_tokens_max": float(prompt.max()) if len(prompt) else 0.0,
        "responses_truncated": float(tally.truncated),
        "prompts_no_history": float(tally.no_history),
        "prompts_cut": float(tally.cut),
    }
    by_type: dict[str, list[float]] = {}
    for e in ok:
        kind = str(trajs[e].rows[0]["task_type"])
        if kind:
            by_type.setdefault(kind, []).append(float(bool(trajs[e].info.get("won"))))
    for kind, values in sorted(by_type.items()):
        stats[f"success_rate/{kind}"] = _mean(values)
    return stats


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0
