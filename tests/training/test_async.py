"""train.async_lag: rollouts sampled ahead of the update with a fixed lag (training/pipeline.py).

What must hold whatever the timing: batch v is sampled entirely with θ_s(v), s(v) =
max(0, v - 1 - k), so update u's lag is min(k, u - 1); a run with random delays in the
producer and the learner equals the same run without them, bit for bit; k = 0 is the
sequential trainer; the first update of k = 1 (batch 1 from θ_0) equals the sequential
update with the same π_old settings; a producer failure ends the run with one line.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from mcgpo.cli import main
from mcgpo.training import pipeline, trainer
from mcgpo.training.build import rollout_seed
from mcgpo.training.config import ConfigError, TrainConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.metrics import read_metrics
from mcgpo.training.pipeline import RolloutProducerError, batch_version


def weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model" / "model.safetensors"))


def same_weights(a, b) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def update_records(folder) -> list[dict]:
    """The update records, times and memory aside (what the runs must agree on)."""
    out = []
    for r in read_metrics(folder / "metrics.jsonl"):
        out.append({k: v for k, v in r.items() if not k.startswith(("time", "memory/"))
                    and not k.endswith("seconds")})  # fmt: skip
    return out


# one-token actions: some are empty (format penalty), so the advantages are not all 0
NONZERO = ("--rollout.max_new_tokens", "1", "--eval.tasks", "1")


@pytest.fixture
def run(smoke_args):
    def train(out, *extra):
        args = smoke_args(out, "--deterministic", "--threads", "1", *NONZERO, *extra)
        assert main(args) == 0

    return train


# ------------------------------------------------------------------- version arithmetic
def test_batch_versions_by_hand():
    # k = 0: batch v from θ_{v-1} (the sequential trainer)
    assert [batch_version(v, 0) for v in range(1, 6)] == [0, 1, 2, 3, 4]
    # k = 1: batches 1 and 2 from θ_0, then batch v from θ_{v-2}
    assert [batch_version(v, 1) for v in range(1, 6)] == [0, 0, 1, 2, 3]
    # k = 2: batches 1..3 from θ_0
    assert [batch_version(v, 2) for v in range(1, 6)] == [0, 0, 0, 1, 2]


@given(st.integers(1, 10_000), st.integers(0, 50))
def test_lag_of_update_u_is_min_k_u_minus_1(u, k):
    # update u starts from θ_{u-1} and learns from batch u, sampled with θ_s(u)
    assert (u - 1) - batch_version(u, k) == min(k, u - 1)


# --------------------------------------------------------------------------- configuration
def test_lag_resolves_pi_old_and_the_correction():
    stale = TrainConfig(async_lag=1)
    assert stale.recompute_old() and stale.correction() == "tis"
    fresh = TrainConfig()  # fp32, hf: the sampler's pi_old, no correction (as before)
    assert not fresh.recompute_old() and fresh.correction() == "none"
    # an explicit choice stands
    assert TrainConfig(async_lag=1, rollout_correction="mis").correction() == "mis"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"train": {"async_lag": -1}}, "train.async_lag must be >= 0, got -1"),
        (
            {"train": {"async_lag": 1, "old_logprobs": "sampler"}},
            "train.async_lag 1 needs pi_old from a training forward (train.old_logprobs "
            "recompute or auto): the sampler's log-probs are of weights 1 update(s) old",
        ),
        (
            {"train": {"async_lag": 2}, "rollout": {"engine": "vllm", "vllm_sleep": True}},
            "train.async_lag 2 needs rollout.vllm_sleep false: the engine samples the next "
            "batch while the update runs, so it cannot sleep through it",
        ),
        (
            {"rollout": {"overlap_pieces": 4}},
            "rollout.overlap_pieces 4 needs rollout.overlap_env true (the pieces are how "
            "overlapped environment steps cut the rollouts)",
        ),
    ],
)
def test_what_cannot_hold_is_refused_in_one_line(settings, message):
    with pytest.raises(ConfigError) as info:
        from_dict(settings).check()
    assert str(info.value) == message


def test_the_engine_samples_ahead_unless_it_sleeps():
    """rollout.engine vllm with k >= 1 is accepted (the producer samples on the engine);
    only its sleep mode cannot hold, and sleep with k = 0 stays as it was."""
    from_dict({"train": {"async_lag": 1}, "rollout": {"engine": "vllm"}}).check()
    from_dict({"rollout": {"engine": "vllm", "vllm_sleep": True}}).check()
    from_dict({"train": {"async_lag": 1}, "rollout": {"vllm_sleep": True}}).check()  # hf


def test_the_cli_refuses_with_exit_2(smoke_args, tmp_path, capsys):
    args = smoke_args(tmp_path / "r", "--train.async_lag", "1", "--train.old_logprobs", "sampler")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mcgpo train: error: train.async_lag 1 needs pi_old") and "\n" not in err
    args = smoke_args(tmp_path / "s", "--train.async_lag", "1", "--rollout.engine", "vllm",
                      "--rollout.vllm_sleep", "true")  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "mcgpo train: error: train.async_lag 1 needs rollout.vllm_sleep false: the engine "
        "samples the next batch while the update runs, so it cannot sleep through it"
    )
    assert not (tmp_path / "s" / "config.toml").exists()


# ------------------------------------------------------------------------------ runs
@pytest.mark.slow
def test_lag_zero_is_the_sequential_trainer(run, tmp_path):
    run(tmp_path / "default")
    run(tmp_path / "zero", "--train.async_lag", "0")
    assert same_weights(tmp_path / "default", tmp_path / "zero")
    assert update_records(tmp_path / "default") == update_records(tmp_path / "zero")
    assert not any("async/lag" in r for r in read_metrics(tmp_path / "zero" / "metrics.jsonl"))
    assert not list((tmp_path / "zero").glob("checkpoints/*/pending.pt"))


@pytest.mark.slow
def test_first_update_of_lag_one_is_the_sequential_update(run, tmp_path):
    """Batch 1 comes from θ_0 at any lag: with the same π_old settings (recomputed, tis),
    update 1 of k = 1 equals update 1 of the sequential trainer bit for bit."""
    same = ("--train.updates", "1", "--train.old_logprobs", "recompute")
    run(tmp_path / "k0", *same, "--train.rollout_correction", "tis")
    run(tmp_path / "k1", *same, "--train.async_lag", "1")
    assert same_weights(tmp_path / "k0", tmp_path / "k1")
    a, b = update_records(tmp_path / "k0"), update_records(tmp_path / "k1")
    assert next(r for r in a if "loss/task" in r)["loss/task"] != 0
    b = [{k: v for k, v in r.items() if k != "async/lag"} for r in b]
    assert a == b


def _fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@pytest.mark.slow
def test_random_delays_change_nothing_and_every_batch_has_one_version(run, tmp_path, monkeypatch):
    """k = 1, 5 updates: random sleeps in the producer (before and after each batch) and in
    the learner (after each update) give the run without them, bit for bit. Every forward
    of the sampler, in every turn of every group of batch v, sees θ_s(v); update u's lag is
    min(k, u - 1)."""
    lag, updates = 1, 5
    base = ("--train.async_lag", str(lag), "--train.updates", str(updates))
    run(tmp_path / "plain", *base)

    delays = random.Random(7)  # the test's own stream: not the run's RNGs
    seen: dict[int, set[float]] = {}  # batch -> fingerprints of the weights at each forward
    theta: dict[int, float] = {}  # u -> fingerprint of θ_u
    numbers = {rollout_seed(0, v): v for v in range(1, updates + lag + 2)}
    real_collect, real_batch, real_update = pipeline.collect, pipeline.collect_batch, None

    def watched_collect(model, tokenizer, make_env, tasks, options, engine=None, pool=None):
        v = numbers[options.seed]
        hook = model.register_forward_pre_hook(
            lambda m, a: seen.setdefault(v, set()).add(_fingerprint(m))
        )
        try:
            return real_collect(
                model, tokenizer, make_env, tasks, options, engine=engine, pool=pool
            )
        finally:
            hook.remove()

    def slow_batch(*args, **kwargs):
        time.sleep(delays.uniform(0, 0.3))
        out = real_batch(*args, **kwargs)
        time.sleep(delays.uniform(0, 0.3))
        return out

    real_update = trainer.update_policy

    def slow_update(learner, *args, **kwargs):
        theta.setdefault(0, _fingerprint(learner))  # θ_0 at update 1's start
        out = real_update(learner, *args, **kwargs)
        theta[len(theta)] = _fingerprint(learner)
        time.sleep(delays.uniform(0, 0.3))
        return out

    monkeypatch.setattr(pipeline, "collect", watched_collect)
    monkeypatch.setattr(pipeline, "collect_batch", slow_batch)
    monkeypatch.setattr(trainer, "update_policy", slow_update)
    run(tmp_path / "delayed", *base)

    assert same_weights(tmp_path / "plain", tmp_path / "delayed")
    assert update_records(tmp_path / "plain") == update_records(tmp_path / "delayed")
    records = [r for r in read_metrics(tmp_path / "delayed" / "metrics.jsonl") if "async/lag" in r]
    assert [r["async/lag"] for r in records] == [min(lag, u - 1) for u in range(1, updates + 1)]
    assert len(set(theta.values())) == updates + 1  # every update moved the weights
    assert any(r["adv/std"] > 0 for r in records)  # and learned from nonzero advantages
    # batches 1 .. U + k were sampled (U + 1 is kept for a resume), each with one version
    assert sorted(seen) == list(range(1, updates + lag + 1))
    for v, prints in seen.items():
        assert prints == {theta[batch_version(v, lag)]}, v


@pytest.mark.slow
def test_lag_two_is_exact_and_lags_by_two(run, tmp_path, monkeypatch):
    run(tmp_path / "plain", "--train.async_lag", "2", "--train.updates", "4")
    real = pipeline.collect_batch
    delays = random.Random(3)

    def slow(*args, **kwargs):
        time.sleep(delays.uniform(0, 0.4))
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "collect_batch", slow)
    run(tmp_path / "delayed", "--train.async_lag", "2", "--train.updates", "4")
    assert same_weights(tmp_path / "plain", tmp_path / "delayed")
    records = [r for r in read_metrics(tmp_path / "delayed" / "metrics.jsonl") if "async/lag" in r]
    assert [r["async/lag"] for r in records] == [0, 1, 2, 2]


@pytest.mark.slow
def test_a_producer_failure_reaches_the_learner_as_one_line(smoke_args, tmp_path, monkeypatch):
    from mcgpo.cli import resolve
    from mcgpo.training.trainer import train

    real = pipeline.collect_batch

    def failing(run, model, number, cursor, **kwargs):
        if number == 3:
            raise OSError("environment server went away\nsecond line")
        return real(run, model, number, cursor, **kwargs)

    monkeypatch.setattr(pipeline, "collect_batch", failing)
    cfg = resolve("train", smoke_args(tmp_path / "r", "--train.async_lag", "1",
                                      "--train.updates", "4")[1:])  # fmt: skip
    clock = time.monotonic()
    with pytest.raises(RolloutProducerError) as info:
        train(cfg)
    assert str(info.value) == (
        "rollout producer failed on batch 3: OSError: environment server went away"
    )
    assert isinstance(info.value.__cause__, OSError)  # the producer's traceback travels along
    # batch 3 is taken by update 3: updates 1 and 2 were done and logged
    updates = [
        r["update"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "loss/task" in r
    ]
    assert updates == [1, 2]
    assert time.monotonic() - clock < 300  # no hang (a wide margin: a run takes seconds)


@pytest.mark.slow
def test_a_producer_failure_is_one_line_and_exit_1_on_the_cli(
    smoke_args, tmp_path, monkeypatch, capsys
):
    real = pipeline.collect_batch

    def failing(run, model, number, cursor, **kwargs):
        if number == 2:
            raise OSError("environment server went away\nsecond line")
        return real(run, model, number, cursor, **kwargs)

    monkeypatch.setattr(pipeline, "collect_batch", failing)
    args = smoke_args(tmp_path / "r", "--train.async_lag", "1", "--train.updates", "3")
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "mcgpo train: error: rollout producer failed on batch 2: OSError: environment "
        "server went away"
    )
    assert not any("Traceback" in line for line in err)


@pytest.mark.slow
def test_overlapped_environment_steps_train_as_the_sequential_run(run, tmp_path):
    """rollout.overlap_env with k = 1: every update's rows and responses are the sequential
    rollout's; the weights agree to float rounding (rows decoded in other company give
    log-probs that differ in the last bits, and k = 1 weighs tokens by them)."""
    import pandas as pd

    base = ("--train.async_lag", "1", "--train.updates", "3", "--save-rollouts")
    run(tmp_path / "plain", *base)
    run(tmp_path / "overlap", *base, "--rollout.overlap_env", "true")
    for update in (1, 2, 3):
        name = f"rollouts/update-{update:06d}.parquet"
        a, b = (
            pd.read_parquet(tmp_path / "plain" / name),
            pd.read_parquet(tmp_path / "overlap" / name),
        )
        for column in ("group", "slot", "turn", "action", "reward", "state", "response"):
            assert a[column].tolist() == b[column].tolist(), (update, column)
        np.testing.assert_allclose(a["advantage"], b["advantage"], rtol=0, atol=1e-12)
    wa, wb = weights(tmp_path / "plain"), weights(tmp_path / "overlap")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


@pytest.mark.slow
def test_row_by_row_decoding_makes_the_overlapped_run_the_sequential_one_bit_for_bit(run, tmp_path):
    """With rollout.batch_invariant a row's log-probs no longer depend on its company, so the
    overlapped run of k = 1 (whose correction weighs tokens by them) ends with the very
    weights and records of the sequential one."""
    base = ("--train.async_lag", "1", "--train.updates", "3", "--rollout.batch_invariant", "true")
    run(tmp_path / "plain", *base)
    run(tmp_path / "overlap", *base, "--rollout.overlap_env", "true")
    assert same_weights(tmp_path / "plain", tmp_path / "overlap")
    assert update_records(tmp_path / "plain") == update_records(tmp_path / "overlap")
    first = next(r for r in update_records(tmp_path / "plain") if "adv/std" in r)
    assert first["adv/std"] > 0.1  # a learning signal, not zeros against zeros
