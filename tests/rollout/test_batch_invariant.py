"""collect(batch_invariant=True): every row decoded in a sampler call of its own.

A row's arithmetic then never depends on which rows share its call, so what the default
mode gives only up to float rounding (and, at a rare near tie, a neighbouring token: see
test_rollout_overlap.py) holds bit for bit, log-probs included: the overlapped rollout is
the sequential one (the property over tasks, seeds, samplers and pieces is in
test_rollout_overlap.py), and a group played alone (a rank's block) is the group inside the
whole batch. Rows decoded alone still draw from their own generators, so the mode changes
only the last bits of the log-probs against the default, never the streams.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_fakes import CounterEnv
from test_rollout_overlap import (
    OPTIONS,
    N,
    ServedCounter,
    SlowCounter,
    assert_identical,
    response_ids,
    run,
)
from test_rollout_streams import group_rows

from mcgpo.rollout import CollectOptions, collect
from mcgpo.training.config import ConfigError
from mcgpo.training.overrides import resolve_command


def test_the_near_tie_of_the_default_mode_is_gone(counter_policy):
    """tasks [0, 0], seed 5081: in the default mode the overlapped rollout may draw token 226
    where the sequential one draws 225 (test_rollout_overlap.py); decoded row by row the two
    are one rollout, bit for bit."""
    kw = {"seed": 5081, "sampler": "dynamic", "batch_invariant": True}
    sequential = run(counter_policy, [0, 0], **kw)
    overlapped = run(counter_policy, [0, 0], overlap_env=True, **kw)
    assert_identical(sequential, overlapped)


@pytest.mark.parametrize("env", [SlowCounter, ServedCounter])
def test_random_step_times_and_a_failing_environment_change_no_bit(counter_policy, env):
    tasks = [4, 1, 5, 2]
    kw = {"env": env, "seed": 3, "batch_invariant": True}
    sequential = run(counter_policy, tasks, **kw)
    overlapped = run(counter_policy, tasks, overlap_env=True, overlap_pieces=3, **kw)
    assert sequential.errors and sequential.table.errored.any()
    assert_identical(sequential, overlapped)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=2, max_size=4), st.data())
def test_a_group_alone_is_the_group_in_the_batch_bit_for_bit(counter_policy, tasks, data):
    """What a rank playing a block of groups samples (group_offset), exactly."""
    k = data.draw(st.integers(0, len(tasks) - 1), label="k")
    whole = run(counter_policy, tasks, seed=11, batch_invariant=True)
    alone = run(counter_policy, [tasks[k]], seed=11, group_offset=k, batch_invariant=True)
    fields, ids, old = group_rows(whole, k)
    fields_1, ids_1, old_1 = group_rows(alone, 0)
    assert fields == fields_1 and ids == ids_1
    assert all(torch.equal(a, b) for a, b in zip(old, old_1, strict=True))


def test_the_streams_are_the_default_modes(counter_policy):
    """Row by row draws each row from its own generator as the batched call does: the same
    tokens (no near tie on this case), log-probs within float rounding, not bit for bit."""
    default = run(counter_policy, [3, 1, 4], seed=7)
    alone = run(counter_policy, [3, 1, 4], seed=7, batch_invariant=True)
    assert response_ids(default) == response_ids(alone)
    np.testing.assert_array_equal(default.table.action, alone.table.action)
    torch.testing.assert_close(
        default.tokens.old_log_probs, alone.tokens.old_log_probs, atol=1e-5, rtol=0
    )


def test_bad_values_and_an_engine_are_refused_in_one_line(counter_policy):
    with pytest.raises(ValueError, match=r"^batch_invariant must be true or false, got 1$"):
        CollectOptions(group_size=N, **OPTIONS, batch_invariant=1)
    options = CollectOptions(group_size=N, **OPTIONS, batch_invariant=True)
    with pytest.raises(ValueError, match=r"^batch_invariant: a rollout engine batches"):
        collect(*counter_policy, CounterEnv, [0], options, engine=object())
    args = ["--rollout.batch_invariant", "true", "--rollout.engine", "vllm", "--out", "x"]
    with pytest.raises(ConfigError, match=r"^rollout.batch_invariant needs rollout.engine hf"):
        resolve_command("train", args)
    cfg = resolve_command("train", ["--rollout.batch_invariant", "true", "--out", "x"])
    assert cfg.rollout.batch_invariant is True
