"""Expert demonstrations for the warm start (mcgpo.training.sft)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.envs import make_env
from mcgpo.policy import load_policy
from mcgpo.rollout.prompts import encode_prompt, encode_response, render_prompt
from mcgpo.training.config import RunConfig, SFTConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.sft import Demonstrations, expert_demonstrations, sft_loss


@pytest.fixture(scope="module")
def tokenizer(micro_model):
    return load_policy(micro_model)[1]


def config(demos: int, noise: float = 0.0) -> RunConfig:
    cfg = from_dict({"env": {"max_turns": 12}, "rollout": {"max_prompt_tokens": 4096}})
    return dataclasses.replace(cfg, sft=SFTConfig(demos=demos, noise=noise))


def expert_episode(task: int, max_turns: int = 12) -> list[str]:
    env = make_env("household")
    env.reset(seed=task, split="train")
    actions = []
    for _ in range(max_turns):
        actions.append(env.expert_action())
        if env.step(actions[-1]).done:
            break
    return actions


def test_plain_demonstrations_are_the_expert_episodes_with_rollout_prompts(tokenizer):
    demos = expert_demonstrations(lambda: make_env("household"), tokenizer, config(2), "action")
    expected = expert_episode(0) + expert_episode(1)
    assert len(demos) == len(expected) and demos.episodes == 2
    for response, action in zip(demos.responses, expected):
        assert response == encode_response(tokenizer, action)  # action + EOS
    # the first turn's prompt is the rollout's no-history prompt of task 0
    env = make_env("household")
    obs = env.reset(seed=0, split="train")
    text = render_prompt(obs, [], history=2, response_format="action")
    assert demos.prompts[0] == encode_prompt(tokenizer, text)


def test_noisy_roll_in_is_reproducible_and_labelled_by_the_expert(tokenizer):
    make = lambda: make_env("household")  # noqa: E731
    a = expert_demonstrations(make, tokenizer, config(6, noise=0.5), "action")
    b = expert_demonstrations(make, tokenizer, config(6, noise=0.5), "action")
    plain = expert_demonstrations(make, tokenizer, config(6), "action")
    assert a.prompts == b.prompts and a.responses == b.responses
    # random turns lengthen the episodes (the expert then has to recover)
    assert len(a) > len(plain)
    eos = tokenizer.eos_token_id
    for response in a.responses:
        assert response[-1] == eos and len(response) > 1


def test_sft_loss_is_the_token_mean_nll_of_the_responses(micro_model, tokenizer):
    # golden: the loss equals minus the mean log-prob of the response tokens (EOS included),
    # computed independently from the logits
    model = load_policy(micro_model)[0]
    demos = expert_demonstrations(lambda: make_env("household"), tokenizer, config(1), "action")
    batch = demos.batch(torch.arange(len(demos)).numpy(), tokenizer.pad_token_id)
    with torch.no_grad():
        loss = float(sft_loss(model, batch))
        total, count = 0.0, 0
        for prompt, response in zip(demos.prompts, demos.responses):
            ids = torch.tensor([prompt + response])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            for k, token in enumerate(response):
                total += float(logp[len(prompt) + k - 1, token])
                count += 1
    assert loss == pytest.approx(-total / count, rel=1e-5)


def test_noise_must_be_a_probability():
    from mcgpo.training.config import ConfigError

    with pytest.raises(ConfigError, match=r"sft.noise must be in \[0, 1\), got 1.0"):
        dataclasses.replace(RunConfig(), sft=SFTConfig(noise=1.0)).check()


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6)), min_size=1, max_size=40),
    size=st.integers(0, 12),
)
def test_micro_batches_partition_the_step_by_length(lengths, size):
    demos = Demonstrations([[5] * p for p, _ in lengths], [[6] * r for _, r in lengths], 1)
    rows = np.random.default_rng(len(lengths)).permutation(len(lengths))
    parts = demos.micro_batches(rows, size)
    # every row exactly once; no part above the size (0, or a size covering the step: one
    # part, the rows as given)
    assert sorted(np.concatenate(parts).tolist()) == sorted(rows.tolist())
    if size == 0 or size >= len(rows):
        assert len(parts) == 1 and parts[0].tolist() == rows.tolist()
    else:
        assert all(1 <= len(p) <= size for p in parts)
        # sorted: no row of a later part is shorter than a row of an earlier part
        total = [sum(lengths[i]) for part in parts for i in part]
        assert total == sorted(total)
    assert demos.response_tokens(rows) == sum(r for _, r in lengths)


def test_micro_batched_step_has_the_whole_steps_gradient_and_less_padding(micro_model, tokenizer):
    # The step's loss is the token mean over all its response tokens. Cut into micro-batches
    # whose NLL sums are each divided by the step's token count, the gradients add up to the
    # same gradient (float64: equal to rounding), and the token slots (rows x padded length)
    # go down because each micro-batch pads only to its own longest row.
    model = load_policy(micro_model)[0].double()
    demos = expert_demonstrations(
        lambda: make_env("household"), tokenizer, config(4, noise=0.5), "action"
    )
    rows = np.random.default_rng(0).permutation(len(demos))[:24]
    pad = tokenizer.pad_token_id

    def grads(parts, tokens):
        model.zero_grad()
        for part in parts:
            sft_loss(model, demos.batch(part, pad), tokens).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole = grads([rows], None)
    parts = demos.micro_batches(rows, 5)
    assert len(parts) == 5
    split = grads(parts, demos.response_tokens(rows))
    assert torch.allclose(whole, split, rtol=0, atol=1e-12)
    slots = lambda ps: sum(demos.batch(p, pad).input_ids.numel() for p in ps)  # noqa: E731
    assert slots(parts) < slots([rows])


def test_micro_batch_size_must_not_be_negative():
    from mcgpo.training.config import ConfigError

    with pytest.raises(ConfigError, match=r"sft\.micro_batch_size"):
        dataclasses.replace(RunConfig(), sft=SFTConfig(micro_batch_size=-1)).check()


def test_whole_step_with_its_own_count_is_bit_identical(micro_model, tokenizer):
    # sft.micro_batch_size 0 passes the step's token count explicitly; it must give the same
    # bits as the batch's own count (the warm start's loss before micro-batches existed).
    model = load_policy(micro_model)[0]
    demos = expert_demonstrations(
        lambda: make_env("household"), tokenizer, config(2, noise=0.5), "action"
    )
    rows = np.arange(len(demos))
    batch = demos.batch(rows, tokenizer.pad_token_id)
    with torch.no_grad():
        own = sft_loss(model, batch)
        given = sft_loss(model, batch, demos.response_tokens(rows))
    assert torch.equal(own, given)


def test_owners_deal_largest_first_to_the_least_loaded_rank():
    from mcgpo.training.layout import owners

    # by cost, largest first (ties keep order): 9 (job 1) -> rank 0 (loads 9, 0); 7 (job 3)
    # -> rank 1 (9, 7); 7 (job 4) -> rank 1 (9, 14); 5 (job 0) -> rank 0 (14, 14); 2 (job 2)
    # -> tie, the lower rank: rank 0 (16, 14)
    assert owners([5, 9, 2, 7, 7], 2).tolist() == [0, 0, 0, 1, 1]
    assert owners([3, 1], 4).tolist() == [0, 1]  # more ranks than jobs: some idle
    assert owners([], 2).tolist() == []


@pytest.mark.slow
@pytest.mark.parametrize("micro", ["2", "0"], ids=["dealt", "one-rank-idle"])
def test_two_processes_warm_start_as_one(tmp_path, micro_model, micro):
    """``mcgpo sft --nproc 2`` vs 1 process: the same losses at every step, final weights
    within 1e-6 (the residual is the order of the float sums) and the same evaluations.
    Micro-batches of 2 turns give each 8-turn step 4 micro-batches, 2 per rank; 0 (the
    whole step at once) leaves rank 1 without work in every step: it joins the gradient sum
    with zeros."""
    import json

    from ranks import launch, saved_weights

    from mcgpo.cli import main
    from mcgpo.training.metrics import read_metrics

    def args(out, *extra):
        return ["sft", "--preset", "household-smoke", "--model", str(micro_model), "--out",
                str(out), "--sft.demos", "6", "--sft.micro_batch_size", micro, *extra]  # fmt: skip

    one, two = tmp_path / "one", tmp_path / "two"
    assert main(args(one)) == 0
    launch(args(two, "--nproc", "2"))
    ra, rb = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    losses = [[r["sft/loss"] for r in rs if "sft/loss" in r] for rs in (ra, rb)]
    assert len(losses[0]) >= 2
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    wa, wb = saved_weights(one / "model"), saved_weights(two / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6
    sa, sb = (json.loads((f / "sft.json").read_text()) for f in (one, two))
    assert (sa["processes"], sb["processes"]) == (1, 2)
    for when in ("before", "after"):
        drop = ("eval/time",)
        assert {k: v for k, v in sa[when].items() if k not in drop} == {
            k: v for k, v in sb[when].items() if k not in drop
        }
    assert "nproc = 2" in (two / "config.toml").read_text()


def test_sft_world_checks_ignore_the_rollout_groups():
    """The warm start splits no task groups: 3 processes are fine with 16 groups; a training
    run is refused; a bad --nproc is one line."""
    from mcgpo.training.config import ConfigError
    from mcgpo.training.distributed import check_world

    cfg = dataclasses.replace(from_dict({"rollout": {"groups": 16}}), nproc=3)
    check_world(cfg, 3, "sft")
    with pytest.raises(ConfigError, match="divisible by the world size"):
        check_world(cfg, 3, "train")


@pytest.mark.parametrize("command", ["sft", "eval"])
def test_bad_nproc_is_one_line_exit_2(tmp_path, micro_model, capsys, command):
    from mcgpo.cli import main

    argv = [command, "--preset", "household-smoke", "--model", str(micro_model), "--out",
            str(tmp_path / "run"), "--nproc", "0"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nproc must be >= 1, got 0" in err
