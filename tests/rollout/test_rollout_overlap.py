"""collect(overlap_env=True): environment steps overlapped with decoding, the same rollout.

P fixed pieces of the environments: some step (in threads) while others decode, the decoder
taking the pieces in the order their steps finish. Each environment's turn reads only its
own observation, history and generator, so the overlapped rollout equals the sequential one
token for token: the same rows (every StepTable column), responses, token ids and errors,
whatever the timing; the log-probs agree to float rounding (a row is decoded in other
company: 1e-5, as in test_rollout_streams.py). That rounding can, rarely, move a draw across
a boundary of the inverse CDF: then one trajectory takes the neighbouring token id from that
turn on (a near tie; under 1e-4 of tokens, hypothesis found one). The comparison with the
sequential rollout allows exactly that and nothing else (``assert_same_but_near_ties``). For
a fixed P a row's company is fixed (its piece's live rows), so two overlapped rollouts agree
bit for bit, log-probs included, whatever the step times.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rollout_fakes import CounterEnv, CounterSpec

from mcgpo.rollout import CollectOptions, collect
from mcgpo.rollout import group_rollout as rollout_module
from mcgpo.rollout import turns as turns_module
from mcgpo.rollout.group_rollout import env_pieces

N = 3
OPTIONS = {"split": "train", "temperature": 1.0, "history": 2, "max_new_tokens": 6}


def run(policy, tasks, env=CounterEnv, **kw):
    options = CollectOptions(group_size=N, **{**OPTIONS, **kw})
    return collect(*policy, env, tasks, options)


def assert_same_rollout(a, b):
    for name, column in a.table.columns().items():
        np.testing.assert_array_equal(column, b.table.columns()[name], err_msg=name)
    assert a.responses == b.responses and a.errors == b.errors
    ta, tb = a.tokens, b.tokens
    assert torch.equal(ta.input_ids, tb.input_ids) and torch.equal(
        ta.response_mask, tb.response_mask
    )
    torch.testing.assert_close(ta.old_log_probs, tb.old_log_probs, atol=1e-5, rtol=0)
    timing = ("seconds", "sample_seconds", "env_seconds", "chain_seconds")
    assert {k: v for k, v in a.stats.items() if k not in timing} == {
        k: v for k, v in b.stats.items() if k not in timing
    }


def assert_identical(a, b):
    """The same rollout, bit for bit: every column, token and log-prob."""
    assert_same_rollout(a, b)
    assert torch.equal(a.tokens.old_log_probs, b.tokens.old_log_probs)


def response_ids(rollout) -> dict[int, list[int]]:
    """Each trajectory's response token ids, its turns one after another."""
    out: dict[int, list[int]] = {}
    ids, mask = rollout.tokens.input_ids, rollout.tokens.response_mask.bool()
    for row, traj in enumerate(rollout.table.traj.tolist()):
        out.setdefault(traj, []).extend(ids[row][mask[row]].tolist())
    return out


def assert_same_but_near_ties(sequential, overlapped):
    """The same rollout, or one trajectory whose tokens agree up to a draw that fell on the
    neighbouring token id (an inverse-CDF boundary moved by float rounding)."""
    a, b = response_ids(sequential), response_ids(overlapped)
    differ = [t for t in sorted(set(a) | set(b)) if a.get(t) != b.get(t)]
    if not differ:
        assert_same_rollout(sequential, overlapped)
        return
    assert len(differ) == 1, differ  # a near tie is rare: two at once is a bug
    x, y = a[differ[0]], b[differ[0]]
    first = next(i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q)
    assert abs(x[first] - y[first]) == 1, (first, x[first], y[first])


def test_a_near_tie_moves_one_draw_to_the_neighbouring_token(counter_policy):
    """The case hypothesis found (two halves decode the rows that one call decodes
    sequentially): with this machine's kernels trajectory 4 draws token 225 in one, 226 in
    the other (other kernels round otherwise: then the two may agree)."""
    sequential = run(counter_policy, [0, 0], seed=5081, sampler="dynamic")
    overlapped = run(counter_policy, [0, 0], seed=5081, sampler="dynamic", overlap_env=True)
    assert_same_but_near_ties(sequential, overlapped)
    a, b = response_ids(sequential), response_ids(overlapped)
    if a != b:
        assert [t for t in a if a[t] != b[t]] == [4]
        first = next(i for i, (p, q) in enumerate(zip(a[4], b[4], strict=False)) if p != q)
        assert {a[4][first], b[4][first]} == {225, 226}


def test_pieces_are_contiguous_blocks_of_near_equal_size():
    assert env_pieces(8, 2) == [range(0, 4), range(4, 8)]
    assert env_pieces(8, 3) == [range(0, 2), range(2, 5), range(5, 8)]
    assert env_pieces(3, 5) == [range(0, 1), range(1, 2), range(2, 3)]  # empty ones left out


@pytest.mark.parametrize("pieces", [1, 0, True, 2.0, "3"])
def test_bad_piece_counts_are_refused_in_one_line(pieces):
    with pytest.raises(ValueError, match=r"^overlap_pieces must be an integer >= 2, got "):
        CollectOptions(group_size=N, **OPTIONS, overlap_pieces=pieces)


@settings(max_examples=12, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=4),
    st.integers(0, 2**31),
    st.sampled_from(["dynamic", "static"]),
    st.integers(2, 7),
    st.booleans(),
)
def test_overlapped_rollout_is_the_sequential_one(
    counter_policy, tasks, seed, sampler, pieces, alone
):
    """Up to near ties; with batch_invariant (each row decoded alone) bit for bit."""
    kw = {"seed": seed, "sampler": sampler, "batch_invariant": alone}
    sequential = run(counter_policy, tasks, **kw)
    overlapped = run(counter_policy, tasks, overlap_env=True, overlap_pieces=pieces, **kw)
    assert len(sequential.table) > 0
    if alone:
        assert_identical(sequential, overlapped)
    else:
        assert_same_but_near_ties(sequential, overlapped)


class SlowCounter(CounterEnv):
    """A counter whose steps take a random while (its own stream), and that fails at turn 2
    of task 4: timings change, the rollout must not."""

    def __init__(self) -> None:
        super().__init__(fail_seed=4, fail_turn=2)
        self.pauses = random.Random()

    def step(self, action):
        time.sleep(self.pauses.uniform(0, 0.01))
        return super().step(action)


class ServedCounter(SlowCounter):
    """As a served environment's client: the pool steps its slots from threads, and the two
    halves' steps may run at once (``EnvPool.steps_at_once``)."""

    concurrent_steps = True


@pytest.mark.parametrize("pieces", [2, 3, 5])
@pytest.mark.parametrize("env", [SlowCounter, ServedCounter])
def test_random_step_times_and_a_failing_environment_change_nothing(counter_policy, env, pieces):
    tasks = [4, 1, 5, 2]
    sequential = run(counter_policy, tasks, env=env, seed=3)
    overlapped = run(
        counter_policy, tasks, env=env, seed=3, overlap_env=True, overlap_pieces=pieces
    )
    assert sequential.errors and sequential.table.errored.any()  # task 4's siblings failed
    assert_same_rollout(sequential, overlapped)
    # the longest chain of calls one environment waited on: within the wall time; in the
    # sequential rollout every live environment is in every call
    for r in (sequential, overlapped):
        assert 0 < r.stats["chain_seconds"] <= r.stats["seconds"]
    s = sequential.stats
    assert s["chain_seconds"] <= s["sample_seconds"] + s["env_seconds"] + 1e-9


@pytest.mark.parametrize("sampler", ["dynamic", "static"])
@pytest.mark.parametrize("env", [SlowCounter, ServedCounter])
def test_a_fixed_piece_count_reproduces_the_log_probs_bit_for_bit(counter_policy, env, sampler):
    """Random step times change the order in which the pieces decode, never a row's company."""
    tasks = [4, 1, 5, 2, 0]
    kw = {"env": env, "seed": 11, "sampler": sampler, "overlap_env": True, "overlap_pieces": 3}
    first, second = run(counter_policy, tasks, **kw), run(counter_policy, tasks, **kw)
    assert_same_rollout(first, second)
    assert torch.equal(first.tokens.old_log_probs, second.tokens.old_log_probs)


@pytest.mark.slow
@pytest.mark.parametrize("pieces", [2, 3])
def test_environments_in_worker_processes_overlap_the_same(counter_policy, pieces):
    tasks = [0, 1, 2]
    sequential = run(counter_policy, tasks, env=CounterSpec(), seed=5, workers=2)
    overlapped = run(
        counter_policy, tasks, env=CounterSpec(), seed=5, workers=2, overlap_env=True,
        overlap_pieces=pieces,
    )  # fmt: skip
    assert_same_rollout(sequential, overlapped)


def test_one_half_steps_while_the_other_decodes(counter_policy, monkeypatch):
    """The first step of half A (environments 0 .. n/2 - 1) waits until half B's first
    decode has begun: it can only end in time if the two run at once (wide margin)."""
    tasks = [0, 1]  # 6 environments: halves 0-2 and 3-5
    b_decoding = threading.Event()
    seen: dict[str, bool] = {}
    real = turns_module.SAMPLERS["dynamic"]

    def sampler(model, prompts, *, generator, **kw):
        if len(prompts) and generator[0] is generators_of_b[0]:
            b_decoding.set()
        return real(model, prompts, generator=generator, **kw)

    real_sampling = rollout_module._sampling
    generators_of_b: list = []

    def sampling(*args, **kwargs):
        s = real_sampling(*args, **kwargs)
        generators_of_b[:] = s.generators[3:]
        return s

    class WaitingCounter(CounterEnv):
        def step(self, action):
            if self.turn == 0 and "first" not in seen:
                seen["first"] = b_decoding.wait(timeout=120)
                seen["thread"] = threading.current_thread() is not threading.main_thread()
            return super().step(action)

    monkeypatch.setitem(turns_module.SAMPLERS, "dynamic", sampler)
    monkeypatch.setattr(rollout_module, "_sampling", sampling)
    run(counter_policy, tasks, env=WaitingCounter, seed=1, overlap_env=True)
    assert seen == {"first": True, "thread": True}


def test_next_prompts_are_built_in_the_stepper_threads(counter_policy, monkeypatch):
    """Overlapped, a piece's rows are recorded and its next prompts tokenized (one batch call)
    in the thread that stepped it, beside other pieces' decoding; only the first turn's are
    built by the decoder. Sequentially every turn's are built in one call by the caller."""
    real = turns_module.prompts_ids
    threads: list[tuple[str, int]] = []

    def spy(tokenizer, decisions, **kw):
        threads.append((threading.current_thread().name, len(decisions)))
        return real(tokenizer, decisions, **kw)

    monkeypatch.setattr(turns_module, "prompts_ids", spy)
    tasks = [0, 1]  # 6 environments: pieces 0-2 and 3-5
    overlapped = run(counter_policy, tasks, seed=2, overlap_env=True)
    me = threading.current_thread().name
    assert [t for t in threads if t[0] == me] == [(me, 3)] * 2  # each piece's first turn
    later = [name for name, _ in threads if name != me]
    assert later and all(name.startswith("env-step") for name in later)
    threads.clear()
    sequential = run(counter_policy, tasks, seed=2)
    assert {name for name, _ in threads} == {threading.current_thread().name}
    assert threads[0][1] == 6  # all live rows in one call
    assert_same_but_near_ties(sequential, overlapped)
