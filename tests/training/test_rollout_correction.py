"""train.rollout_correction: configuration, the update's weighting, the CLI run.

The weights themselves (golden values, injected mismatch, bit-for-bit at zero mismatch) are
tested in tests/test_objectives.py. Here: the settings and their one-line errors, ``auto``
resolved per engine and precision, the sampler's log-probs surviving the recompute of pi_old
into the weights, an update with a sequence-level correction equal to the uncorrected
update with each row's advantage scaled by its weight (the reference path), a real bf16
sampler's mismatch, and a ``mcgpo train`` smoke run that logs the metrics.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from test_update import make_batch

from mcgpo.cli import main
from mcgpo.policy.precision import cast_weights, compute
from mcgpo.policy.tiny import tiny_model, train_tokenizer
from mcgpo.rollout.sampler import sample
from mcgpo.rollout.tokens import TokenBatch
from mcgpo.training.collectives import merge_metrics
from mcgpo.training.config import ConfigError, TrainConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.metrics import read_metrics
from mcgpo.training.update import PairBatch, update_policy

TEXTS = ["go to fridge 1", "open drawer 2", "take mug 1 from table 1", "put mug 1 in/on sink 1"]
METRICS = ("ratio_mean", "ratio_max", "clipped_frac", "masked_frac", "seq_log_ratio_sd")


# --------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rollout_correction", "is", "train.rollout_correction must be one of auto, none, tis, "
         "mis; got 'is'"),
        ("rollout_correction_level", "row", "train.rollout_correction_level must be one of "
         "token, sequence; got 'row'"),
        ("rollout_correction_cap", 1.0, "train.rollout_correction_cap must be > 1 and finite, "
         "got 1.0"),
        ("rollout_correction_cap", math.inf, "train.rollout_correction_cap: expected a "
         "finite number, got inf"),  # refused where the value is read
    ],
)  # fmt: skip
def test_bad_values_are_one_line_errors_naming_the_key(key, value, message):
    with pytest.raises(ConfigError) as info:
        from_dict({"train": {key: value}}).check()
    assert str(info.value) == message


@pytest.mark.parametrize("cap", [math.inf, math.nan, 0.5])
def test_a_cap_built_in_code_is_checked_too(cap):
    with pytest.raises(ConfigError, match=r"^train.rollout_correction_cap must be > 1 and finite"):
        TrainConfig(rollout_correction_cap=cap).check()


@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_a_correction_with_pi_old_from_the_sampler_is_refused(mode):
    # pi_old = the sampler's log-probs: every ratio pi_old / sampler is 1, nothing to correct
    with pytest.raises(ConfigError) as info:
        TrainConfig(rollout_correction=mode, old_logprobs="sampler").check()
    assert str(info.value) == (
        f"train.rollout_correction {mode} needs pi_old from a training forward "
        f"(train.old_logprobs recompute or auto): with pi_old from the sampler every ratio "
        f"pi_old / sampler is 1"
    )
    TrainConfig(rollout_correction="none", old_logprobs="sampler").check()  # fine
    TrainConfig(rollout_correction=mode).check()  # auto: recomputes


def test_bad_value_on_the_command_line_is_exit_2(tmp_path, capsys):
    code = main(["train", "--out", str(tmp_path / "r"), "--train.rollout_correction", "is"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "train.rollout_correction must be one of" in err[0]


@pytest.mark.parametrize(
    ("engine", "precision", "old_logprobs", "expected"),
    [
        ("hf", "fp32", "auto", "none"),  # mcgpo's fp32 samplers: their log-probs are pi_old's
        ("hf", "fp32", "recompute", "none"),
        ("hf", "bf16-mixed", "auto", "tis"),  # the bf16 sampler differs (0.078 max on a H200)
        ("hf", "bf16", "auto", "tis"),
        ("hf", "bf16", "sampler", "none"),  # pi_old is the sampler's: nothing to correct
        ("vllm", "fp32", "auto", "tis"),  # vLLM's kernels are not the update's
        ("vllm", "fp32", "recompute", "tis"),
        ("vllm", "bf16", "sampler", "none"),
    ],
)
def test_auto_is_resolved_by_engine_and_precision(engine, precision, old_logprobs, expected):
    cfg = TrainConfig(precision=precision, old_logprobs=old_logprobs)
    assert cfg.rollout_correction == "auto"
    assert cfg.correction(engine) == expected
    for mode in ("none", "tis", "mis"):  # a set value is kept as it is
        assert dataclasses.replace(cfg, rollout_correction=mode).correction(engine) == mode


def test_a_correction_makes_auto_recompute_pi_old():
    assert not TrainConfig().recompute_old()
    assert TrainConfig(rollout_correction="tis").recompute_old()
    assert TrainConfig(rollout_correction="mis").recompute_old()
    assert not TrainConfig(rollout_correction="none").recompute_old()
    d = TrainConfig()
    assert (d.rollout_correction_level, d.rollout_correction_cap) == ("token", 2.0)


# --------------------------------------------------------------------------- the update
@pytest.fixture(scope="module")
def policy():
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    model = tiny_model(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    return model, tokenizer


def batch_with_mismatch(model, shift: list[float]) -> TokenBatch:
    """Four rows of random tokens; pi_old = the model; the sampler's log-probs are pi_old's
    minus ``shift[i]`` on each response token of row i (sequence ratio exp(n_i shift_i))."""
    batch = make_batch(model, [(4, 2), (3, 3), (5, 1), (2, 2)])
    old = batch.old_log_probs
    mask = batch.response_mask.float()
    behaviour = old - torch.tensor(shift)[:, None] * mask
    return dataclasses.replace(batch, old_log_probs=old, behaviour_log_probs=behaviour)


def step(model, batch, advantages, cfg, pairs):
    """One SGD step (lr 1) of update_policy on a copy; returns (stats, parameter change)."""
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update_policy(
        model, opt, batch, np.asarray(advantages, dtype=np.float32), cfg,
        pairs=pairs, lambda_pair=0.5,
    )  # fmt: skip
    return stats, {n: p.detach() - before[n] for n, p in model.named_parameters()}


SIMPLE = TrainConfig(grad_clip=0.0, kl_coef=0.0, entropy_coef=0.0, micro_batch_size=2)
PAIRS = PairBatch(np.array([0]), np.array([1]), np.array([1.0]))


@pytest.mark.parametrize(
    ("mode", "row_weights"),
    [
        # shifts (per token) 0.1, -0.5, 0.2, 0 on rows of 2, 3, 1, 2 response tokens:
        # sequence log-ratios 0.2, -1.5, 0.2, 0 -> rho = e^0.2, e^-1.5 = 0.22, e^0.2, 1
        # tis (cap 2): all below the cap, kept; mis keeps [0.5, 2]: row 1 (0.22) masked
        ("tis", [math.exp(0.2), math.exp(-1.5), math.exp(0.2), 1.0]),
        ("mis", [math.exp(0.2), 0.0, math.exp(0.2), 1.0]),
    ],
)
def test_sequence_correction_equals_the_uncorrected_update_with_weighted_advantages(
    policy, mode, row_weights
):
    # At theta = theta_old (the first and only step) every PPO ratio is 1, so no token is
    # clipped and the policy-gradient loss of a token is -A w; a sequence-level weight is
    # one number per row, so the corrected update is the uncorrected one with advantages
    # A_i w_i. The pair term (lambda 0.5, rows 0 > 1) is not weighted in either. pi_old is
    # recomputed (tis/mis need it), the sampler's shifted log-probs are kept beside it.
    model, _ = policy
    batch = batch_with_mismatch(model, [0.1, -0.5, 0.2, 0.0])
    adv = np.array([1.0, -0.5, 2.0, -1.0])
    cfg = dataclasses.replace(SIMPLE, rollout_correction=mode, rollout_correction_level="sequence")
    stats, delta = step(model, batch, adv, cfg, PAIRS)
    plain_cfg = dataclasses.replace(SIMPLE, old_logprobs="recompute", rollout_correction="none")
    plain, expected = step(model, batch, adv * np.array(row_weights), plain_cfg, PAIRS)
    for name in delta:
        torch.testing.assert_close(delta[name], expected[name], atol=1e-6, rtol=1e-5)
    assert stats["pi_old/recomputed"] == 1.0
    assert stats["loss/pair"] == pytest.approx(plain["loss/pair"], abs=1e-7)
    # stats over the rows: ratio mean and max of the four sequence ratios, 1 of 4 masked
    ratios = [math.exp(0.2), math.exp(-1.5), math.exp(0.2), 1.0]
    assert stats["rollout_correction/ratio_mean"] == pytest.approx(np.mean(ratios), abs=1e-5)
    assert stats["rollout_correction/ratio_max"] == pytest.approx(math.exp(0.2), abs=1e-5)
    assert stats["rollout_correction/clipped_frac"] == 0.0
    assert stats["rollout_correction/masked_frac"] == (0.25 if mode == "mis" else 0.0)
    # SD of the sequence log-ratios 0.2, -1.5, 0.2, 0 (mean -0.275)
    assert stats["rollout_correction/seq_log_ratio_sd"] == pytest.approx(
        float(np.std([0.2, -1.5, 0.2, 0.0])), abs=1e-5
    )
    assert "rollout_correction/ratio_mean" not in plain  # none logs nothing


def test_token_correction_truncates_exactly_the_shifted_tokens(policy):
    # Row 1's sampler log-probs 1 nat below pi_old: rho = e = 2.72 > cap 2 on its 3 tokens,
    # truncated to 2; the other rows' rho = 1. A = (0, 1, 0, 0): the loss is row 1's only,
    # -1 * 2 per token, token mean over 8 tokens: -6 / 8 = -0.75 (uncorrected: -3 / 8).
    model, _ = policy
    batch = batch_with_mismatch(model, [0.0, 1.0, 0.0, 0.0])
    adv = [0.0, 1.0, 0.0, 0.0]
    cfg = dataclasses.replace(SIMPLE, rollout_correction="tis")
    stats, _ = step(model, batch, adv, cfg, PairBatch.empty())
    assert stats["loss/policy"] == pytest.approx(-0.75, abs=1e-5)
    assert stats["rollout_correction/clipped_frac"] == pytest.approx(3 / 8)
    assert stats["rollout_correction/ratio_max"] == pytest.approx(math.e, rel=1e-5)
    none_cfg = dataclasses.replace(cfg, rollout_correction="none")
    plain, _ = step(model, batch, adv, none_cfg, PairBatch.empty())
    assert plain["loss/policy"] == pytest.approx(-3 / 8, abs=1e-5)


def test_bf16_sampler_gets_tis_by_default_and_its_mismatch_is_weighted():
    # A real mismatch: a bf16 model samples with its KV cache, the update recomputes pi_old
    # with whole sequences; auto resolves to tis for precision bf16-mixed.
    tokenizer = train_tokenizer(TEXTS * 4, vocab_size=300)
    model = tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1)
    model = cast_weights(model, "bf16-mixed")
    prompts = [tokenizer(t)["input_ids"] for t in TEXTS * 2]
    with compute("bf16-mixed", "cpu"):
        out = sample(
            model, prompts, temperature=1.0, max_new_tokens=10,
            generator=torch.Generator().manual_seed(0), eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    batch = TokenBatch.from_sequences(
        prompts, out.response_ids, out.log_probs, pad_token_id=tokenizer.pad_token_id
    )
    cfg = TrainConfig(precision="bf16-mixed", kl_coef=0.0, micro_batch_size=4, lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    adv = np.linspace(-1.0, 1.0, len(batch)).astype(np.float32)
    stats = update_policy(copy.deepcopy(model), opt, batch, adv, cfg)
    for name in METRICS:
        assert math.isfinite(stats[f"rollout_correction/{name}"]), name
    gap = stats["pi_old/max_abs_diff"]  # |log pi_old - log sampler|, at most, over tokens
    assert gap > 0
    assert 1.0 < stats["rollout_correction/ratio_max"] <= math.exp(gap) * (1 + 1e-6)
    assert stats["rollout_correction/weight_mean"] != 1.0
    assert stats["pi_old/ratio_max_dev_at_old"] == 0.0  # the PPO ratio is still 1 at theta_old


def test_ranks_merge_the_largest_ratio_and_average_the_rest():
    ranks = [
        {"rollout_correction/ratio_max": 1.5, "rollout_correction/ratio_mean": 1.0},
        {"rollout_correction/ratio_max": 3.0, "rollout_correction/ratio_mean": 1.2},
    ]
    merged = merge_metrics(ranks)
    assert merged["rollout_correction/ratio_max"] == 3.0
    assert merged["rollout_correction/ratio_mean"] == pytest.approx(1.1)


# --------------------------------------------------------------------------- the CLI run
@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["dynamic", "static"])
def test_smoke_run_with_tis_logs_the_metrics(smoke_args, tmp_path, sampler):
    # both HF samplers hand their per-token log-probs to the batch as the behaviour's
    out = tmp_path / "tis"
    extra = ("--train.rollout_correction", "tis", "--rollout.sampler", sampler)
    assert main(smoke_args(out, *extra)) == 0
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    assert [r["update"] for r in updates] == [1, 2]
    for r in updates:
        assert r["pi_old/recomputed"] == 1.0  # tis asks for a training forward
        for name in METRICS:
            assert math.isfinite(r[f"rollout_correction/{name}"]), name
        # fp32 sampler vs fp32 training forward: ratios 1 up to float rounding
        assert abs(r["rollout_correction/ratio_max"] - 1.0) < 1e-3
        assert r["rollout_correction/clipped_frac"] == 0.0
        assert r["rollout_correction/masked_frac"] == 0.0
    assert 'rollout_correction = "tis"' in (out / "config.toml").read_text()
