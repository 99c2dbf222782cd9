"""collect() with env.workers > 0: the rollout of in-process stepping; a crash costs one
trajectory."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from rollout_fakes import CounterSpec

from mcgpo.envs.workers import EnvSpec
from mcgpo.rollout import CollectOptions, collect

RECIPE = {"split": "train", "temperature": 1.0, "history": 2}
TIMINGS = {"seconds", "sample_seconds", "env_seconds", "chain_seconds"}


def same_rollout(a, b) -> None:
    assert a.table.to_records() == b.table.to_records()
    assert a.responses == b.responses and a.errors == b.errors
    for name in ("input_ids", "attention_mask", "response_mask", "old_log_probs"):
        assert torch.equal(getattr(a.tokens, name), getattr(b.tokens, name)), name
    assert {k: v for k, v in a.stats.items() if k not in TIMINGS} == {
        k: v for k, v in b.stats.items() if k not in TIMINGS
    }


def test_household_in_workers_equals_in_process():
    from mcgpo.policy import build_tiny_policy
    from mcgpo.rollout import environment_corpus

    model, tok = build_tiny_policy(environment_corpus(("household",), episodes=8), seed=0)
    options = CollectOptions(group_size=2, **RECIPE, max_turns=4, max_new_tokens=24, seed=3)
    spec = EnvSpec("household")
    here = collect(model, tok, spec, [0, 1, 2], options)
    there = collect(model, tok, spec, [0, 1, 2], dataclasses.replace(options, workers=2))
    assert len(here.table) == 24  # 3 tasks x 2 siblings x 4 turns, none won, none errored
    same_rollout(here, there)


def test_a_crashing_worker_costs_one_trajectory(counter_policy):
    model, tok = counter_policy
    options = CollectOptions(group_size=1, **RECIPE, max_new_tokens=6, seed=0, workers=2)
    out = collect(model, tok, CounterSpec(exit_seed=2, exit_turn=2), [0, 1, 2, 3], options)
    t = out.table
    assert out.errors == {2: "step turn 2: worker died (exit code 3); worker restarted"}
    assert set(t.traj[t.errored]) == {2} and list(t.turn[t.traj == 2]) == [0]
    for e in (0, 1, 3):  # played to the end: won, or the counter's 4 turns
        rows = t.traj == e
        assert t.done[rows][-1] and np.array_equal(t.turn[rows], np.arange(rows.sum()))
    assert out.stats["errored_trajectories"] == 1.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", -1, r"workers must be an integer >= 0, got -1"),
        ("workers", 1.5, r"workers must be an integer >= 0, got 1.5"),
        ("step_timeout", 0.0, r"step_timeout must be a finite number > 0, got 0.0"),
        ("step_timeout", float("inf"), r"step_timeout must be a finite number > 0, got inf"),
    ],
)
def test_bad_worker_options(field, value, message):
    with pytest.raises(ValueError, match=message):
        CollectOptions(group_size=1, **RECIPE, **{field: value})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"workers": -1}, "env.workers must be >= 0, got -1"),
        ({"step_timeout": 0}, "env.step_timeout must be > 0, got 0"),
        ({"step_timeout": float("inf")}, "env.step_timeout: expected a finite number, got inf"),
    ],
)
def test_config_checks_the_worker_settings(env, message):
    from mcgpo.training.config import ConfigError
    from mcgpo.training.config_layout import from_dict

    with pytest.raises(ConfigError, match=re.escape(message)):
        from_dict({"env": env}).check()  # inf is refused when read, the rest by check()


def test_the_run_config_reaches_collect():
    from mcgpo.training.build import collect_options
    from mcgpo.training.config_layout import from_dict

    cfg = from_dict({"env": {"workers": 4, "step_timeout": 2.5, "n_receptacles": 12}})
    assert cfg.env.options == {"n_receptacles": 12}  # the new keys are fields, not env options
    opts = collect_options(cfg, "think", split="train", temperature=1.0, group_size=2, seed=0)
    assert (opts.workers, opts.step_timeout) == (4, 2.5)
    default = collect_options(
        from_dict({}), "think", split="train", temperature=1.0, group_size=2, seed=0
    )
    assert (default.workers, default.step_timeout) == (0, 60.0)
