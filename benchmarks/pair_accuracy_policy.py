"""The trained-policy mode of bench_pair_accuracy.py (``--model``; issue 25, item 1).

Siblings are sampled from a policy folder with the run's own rollout (``mcgpo.rollout.collect``,
the training split, the training temperature, the preset's prompt format and budgets), and
the Monte-Carlo ground truth Q(s, a) comes from the *same* policy: a row's state is reached
again by replaying its trajectory's actions before its turn (both environments are
deterministic given the task seed and the actions), the action is taken, and the policy
plays on to the end of the episode (or the turn limit, prefix turns included), ``k`` times.

The replay rebuilds what the policy saw, not just the environment state: the prompt at a
replayed row is the prompt the rollout sampled that row from (the same observation and the
same (observation, action) history), so a continuation is the policy's own continuation of
the row (tested: the prompt ids equal the rollout's, and a continuation from the empty
prefix with the rollout's generator replays its trajectory exactly).

``collect`` starts every history empty, so continuations run in their own batched loop
(:func:`play_out`): all live continuations of a block of (row, action) keys go through one
sampler call per turn (``batch`` rows at most). Continuation i of row r draws from its own
generator seeded from ``(seed, task, r, i)``: the continuations of two actions from the same
row share their random streams (common random numbers), as in the noisy-expert oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import mcgpo
from mcgpo.rollout import (
    DEFAULT_MAX_NEW_TOKENS,
    CollectOptions,
    Rollout,
    collect,
    parse_action,
    prompt_ids,
    stop_strings,
)
from mcgpo.rollout.group_rollout import eos_ids
from mcgpo.rollout.static_decode import SAMPLERS


@dataclass(frozen=True)
class Policy:
    """A policy and the rollout settings of the preset it was trained with."""

    model: Any
    tokenizer: Any
    make_env: Callable[[], Any]
    options: CollectOptions  # the siblings' (and the continuations') sampling settings
    limit: int  # turns per trajectory, the prefix included (the rollout's turn limit)
    batch: int = 512  # the most continuations per sampler call

    @property
    def response_format(self) -> str:
        assert self.options.response_format is not None  # resolved by load_policy_setup
        return self.options.response_format

    @property
    def budget(self) -> int:
        fmt = self.response_format
        return self.options.max_new_tokens or DEFAULT_MAX_NEW_TOKENS[fmt]

    @property
    def eos(self) -> list[int]:
        return eos_ids(self.model, self.tokenizer)  # the rollout's own EOS set


def load_policy_setup(
    model_dir: str, preset: str, *, size: int, seed: int = 0, overrides: Sequence[str] = ()
) -> Policy:
    """The policy in ``model_dir`` with the rollout settings of ``preset`` (and ``overrides``,
    ``mcgpo train`` options such as ``--env.max_turns 25``); ``size`` siblings per task.
    Raises ValueError (one line) for a bad folder, preset or option."""
    from mcgpo.cli import UsageError, resolve
    from mcgpo.policy.loading import load_policy
    from mcgpo.training.build import collect_options, env_factory, response_format_for
    from mcgpo.training.config import ConfigError

    try:
        cfg = resolve("train", ["--preset", preset, "--model", model_dir, *overrides])
        make_env = env_factory(cfg)
    except (UsageError, ConfigError) as err:
        raise ValueError(str(err)) from None
    model, tokenizer = load_policy(model_dir)
    model.eval()
    fmt = response_format_for(cfg, tokenizer)
    options = collect_options(
        cfg, fmt, split="train", temperature=cfg.rollout.temperature, group_size=size, seed=seed
    )
    limit = options.max_turns or int(make_env().max_turns)
    return Policy(model, tokenizer, make_env, options, limit)


def policy_rollouts(policy: Policy, groups: int) -> Rollout:
    """``groups`` tasks (training seeds 0 .. groups - 1, group g plays task g) with the
    policy's siblings, as a training update samples them."""
    tasks = list(range(groups))
    return collect(policy.model, policy.tokenizer, policy.make_env, tasks, policy.options)


@dataclass
class Episode:
    """One environment in flight: its observation, the history the prompt shows, the end."""

    env: Any
    obs: Any
    past: list[tuple[str, str]] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def step(self, action: str) -> None:
        res = self.env.step(action)
        self.past.append((self.obs.text, action))  # what record_turn keeps for the prompt
        self.obs, self.done, self.info = res.observation, bool(res.done), dict(res.info)
        self.turns += 1

    @property
    def outcome(self) -> tuple[float, float]:
        """(success, score) of the episode as it ended."""
        return float(bool(self.info.get("won"))), float(self.info.get("score", 0.0))


def replay(policy: Policy, task: int, actions: Iterable[str]) -> Episode:
    """A fresh environment on ``task`` after ``actions`` (stopping early if one ends it)."""
    env = policy.make_env()
    ep = Episode(env, env.reset(seed=task, split=policy.options.split))
    for action in actions:
        if ep.done:
            break
        ep.step(action)
    return ep


def episode_prompt(policy: Policy, ep: Episode) -> list[int]:
    """The prompt ids the rollout renders for ``ep``'s observation and history."""
    opts = policy.options
    ids, _ = prompt_ids(
        policy.tokenizer, ep.obs, ep.past, history=opts.history,
        response_format=policy.response_format, max_prompt_tokens=opts.max_prompt_tokens,
    )  # fmt: skip
    return ids


def play_out(policy: Policy, episodes: Sequence[Episode], generators: Sequence[Any]) -> None:
    """Let the policy finish every episode (done, or ``policy.limit`` turns), each episode
    sampling from its own generator; all live episodes of a turn in sampler calls of at
    most ``policy.batch`` rows."""
    if len(generators) != len(episodes):
        raise ValueError(f"play_out: {len(episodes)} episodes but {len(generators)} generators")
    opts, tok, fmt = policy.options, policy.tokenizer, policy.response_format
    draw = SAMPLERS[opts.sampler]
    eos = policy.eos
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    while True:
        live = [j for j, ep in enumerate(episodes) if not ep.done and ep.turns < policy.limit]
        if not live:
            return
        for start in range(0, len(live), policy.batch):
            chunk = live[start : start + policy.batch]
            with torch.inference_mode():
                out = draw(
                    policy.model, [episode_prompt(policy, episodes[j]) for j in chunk],
                    temperature=opts.temperature, max_new_tokens=policy.budget,
                    eos_token_id=eos, pad_token_id=pad, stop_strings=stop_strings(fmt),
                    tokenizer=tok, generator=[generators[j] for j in chunk],
                )  # fmt: skip
            texts = tok.batch_decode(out.response_ids, skip_special_tokens=True)
            for j, text in zip(chunk, texts):
                episodes[j].step(parse_action(text, fmt)[0])


def stream(seed: int, task: int, row: int, i: int, device: Any = "cpu") -> torch.Generator:
    """Continuation ``i`` of ``row``'s generator (the same for every action from the row)."""
    state = np.random.SeedSequence([seed, task, row, i]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state))


def trajectory_actions(table: mcgpo.StepTable) -> dict[int, list[str]]:
    """Trajectory id -> its actions in turn order (a StepTable's turns are 0, 1, 2, ...)."""
    out: dict[int, list[str]] = {}
    for r in np.lexsort((table.turn, table.traj)).tolist():
        out.setdefault(int(table.traj[r]), []).append(str(table.action[r]))
    return out


class PolicyOracle:
    """Monte-Carlo Q(s, a) under the policy at the states of a rollout table's rows, cached
    per (row, action); the duck type of bench_pair_accuracy's ``Oracle`` (``table``,
    ``prefix``, ``task``, ``state``, ``q``) plus :meth:`prefetch`, which estimates many keys
    in one batched loop. Group g's task seed is g (:func:`policy_rollouts`)."""

    def __init__(
        self, policy: Policy, table: mcgpo.StepTable, k: int, *, seed: int = 0, block: int = 64
    ) -> None:
        if k < 1:
            raise ValueError(f"PolicyOracle: k must be >= 1 continuations, got {k}")
        self.policy, self.table, self.k, self.seed, self.block = policy, table, k, seed, block
        self._actions = trajectory_actions(table)
        self._cache: dict[tuple[int, str], np.ndarray] = {}
        self._states: dict[int, Any] = {}
        self.continuations = 0  # episodes played so far (the cost)

    def prefix(self, row: int) -> list[str]:
        """The actions of ``row``'s trajectory before its turn (they lead to its state)."""
        return self._actions[int(self.table.traj[row])][: int(self.table.turn[row])]

    def task(self, row: int) -> int:
        return int(self.table.group[row])

    def state(self, row: int) -> Any:
        """The observation at ``row``'s state, reached by replaying its prefix."""
        if row not in self._states:
            self._states[row] = replay(self.policy, self.task(row), self.prefix(row)).obs
        return self._states[row]

    def q(self, row: int, action: str) -> np.ndarray:
        """[2] float64: mean success and mean score of ``action`` taken at ``row``'s state."""
        key = (int(row), str(action))
        if key not in self._cache:
            self.prefetch([key])
        return self._cache[key]

    def prefetch(self, keys: Iterable[tuple[int, str]]) -> None:
        """Estimate every uncached (row, action) key, ``block`` keys per batched loop."""
        todo = sorted({(int(r), str(a)) for r, a in keys} - set(self._cache))
        for start in range(0, len(todo), self.block):
            block = todo[start : start + self.block]
            episodes, generators = [], []
            device = next(self.policy.model.parameters()).device
            for row, action in block:
                task, prefix = self.task(row), [*self.prefix(row), action]
                for i in range(self.k):
                    episodes.append(replay(self.policy, task, prefix))
                    generators.append(stream(self.seed, task, row, i, device))
            play_out(self.policy, episodes, generators)
            self.continuations += len(episodes)
            outcomes = np.array([ep.outcome for ep in episodes]).reshape(len(block), self.k, 2)
            for key, values in zip(block, outcomes):
                self._cache[key] = values.mean(axis=0)
