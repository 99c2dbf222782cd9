"""The shared setup of verl_update_equivalence.py and mcgpo's side of it: the settings, the
tiny models, the batch's rows and tokens, the plugin's run config, and mcgpo's own update
(:func:`mcgpo.training.update.update_policy`) of the rows in a given order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

GROUPS, N, TURNS = 2, 8, 3
MINI_PROMPTS = 3  # verl's ppo_mini_batch_size: 3 x N = 24 rows per mini-batch, 2 of them
MICRO = 4
LR, WD, EPS, BETAS = 1e-2, 0.01, 1.0, (0.9, 0.999)
CLIP, DUAL_CLIP, KL, ENTROPY, LAMBDA, GRAD_CLIP = 0.2, 3.0, 0.5, 0.01, 1.0, 1.0
TIS_CAP = 2.0  # the rollout correction's cap in the --tis run (verl: rollout_is_threshold)


def build_model(out: Path, seed: int = 0) -> None:
    """The tiny model (``seed`` sets its weights) and its tokenizer, as a model folder."""
    from mcgpo.policy import tiny_model, train_tokenizer
    from mcgpo.rollout import environment_corpus

    tokenizer = train_tokenizer(environment_corpus(("household",), episodes=4), vocab_size=400)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = tiny_model(tokenizer, seed=seed, hidden_size=32, num_layers=1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def rows_and_tokens():
    """The StepTable, its records as the agent loop's extra_fields, and per-row tokens."""
    from mcgpo.bench.synthetic import synthetic_table

    table = synthetic_table(GROUPS, N, TURNS, n_states=3, n_actions=2, full_length=True, seed=0)
    rng = np.random.default_rng(7)
    prompts = [
        rng.integers(5, 400, size=int(rng.integers(4, 9))).tolist() for _ in range(len(table))
    ]
    responses = [
        rng.integers(5, 400, size=int(rng.integers(2, 5))).tolist() for _ in range(len(table))
    ]
    return table, table.to_records(), prompts, responses


def plugin_run_config():
    from omegaconf import OmegaConf

    from mcgpo.integrations.verl.config import plugin_config

    block = {"env": {"name": "household"}, "algo": {"name": "mcgpo", "lambda_pair": LAMBDA}}
    return plugin_config(
        OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": N}}, "mcgpo": block})
    )


def mcgpo_update(model_dir, ref_dir, table, order, prompts, responses, old, *, kl, lam,
                 per_mini_batch=False, tis=False, old_shift=None):  # fmt: skip
    """mcgpo's own update of the same rows in the same order: the new weights, its stats
    (a list, one per mini-batch, with ``per_mini_batch``: one update_policy call per
    mini-batch with the same optimizer, which is the same sequence of AdamW steps), and
    the credit. ``old``: pi_old per row; with ``tis`` the sampler's log-probs instead, and
    the update recomputes pi_old with a training forward and weights the policy-gradient
    tokens by train.rollout_correction tis (token level, cap TIS_CAP), as mcgpo's trainer
    does with a mismatched sampler. ``old_shift`` (per row, per response token): added to
    that recomputed pi_old, as the equivalence shifts verl's (so that PPO's clip binds
    with the correction on too)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mcgpo.rollout.tokens import TokenBatch
    from mcgpo.training.algorithms import assign_credit
    from mcgpo.training.config import TrainConfig
    from mcgpo.training.layout import PairBatch
    from mcgpo.training.update import update_policy

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.config._attn_implementation = "sdpa"
    ref = AutoModelForCausalLM.from_pretrained(ref_dir, torch_dtype=torch.float32).eval()
    ref.config._attn_implementation = "sdpa"
    for p in ref.parameters():
        p.requires_grad_(False)
    run = plugin_run_config()
    credit = assign_credit(table.select(order), run.algo)
    batch = TokenBatch.from_sequences(
        [prompts[i] for i in order], [responses[i] for i in order], old, pad_token_id=0
    )
    cfg = TrainConfig(
        mini_batch_size=MINI_PROMPTS * N, micro_batch_size=MICRO, clip=CLIP, dual_clip=DUAL_CLIP,
        kl_coef=kl, kl_kind="low_var_kl", entropy_coef=ENTROPY, grad_clip=GRAD_CLIP,
        ppo_epochs=1, precision="fp32", lr=LR, weight_decay=WD,
        old_logprobs="recompute" if tis else "sampler",
        rollout_correction="tis" if tis else "none", rollout_correction_level="token",
        rollout_correction_cap=TIS_CAP,
    )  # fmt: skip
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=LR, betas=BETAS, eps=EPS,
        weight_decay=WD,
    )  # fmt: skip
    pairs = PairBatch(credit.plus, credit.minus, credit.weight)
    rows = MINI_PROMPTS * N
    groups = np.arange(len(order)) // rows  # verl's contiguous mini-batches
    ref_model = ref if kl > 0 else None
    if old_shift is not None:  # update_policy's recomputed pi_old, shifted
        import dataclasses
        from unittest import mock

        from mcgpo.training import update as update_module

        shift = TokenBatch.from_sequences(
            [prompts[i] for i in order], [responses[i] for i in order], old_shift, pad_token_id=0
        ).old_log_probs
        recompute = update_module.old_log_probs_for_update

        def shifted(model, given, *args, **kwargs):
            given, stats = recompute(model, given, *args, **kwargs)
            assert torch.equal(given.input_ids, batch.input_ids)  # the rows in this order
            return dataclasses.replace(given, old_log_probs=given.old_log_probs + shift), stats

        with mock.patch.object(update_module, "old_log_probs_for_update", shifted):
            return mcgpo_update(model_dir, ref_dir, table, order, prompts, responses, old,
                                kl=kl, lam=lam, per_mini_batch=per_mini_batch, tis=tis)  # fmt: skip
    if per_mini_batch:
        stats = []
        for k in range(len(order) // rows):
            take = np.arange(k * rows, (k + 1) * rows)
            inside = np.isin(pairs.plus, take) & np.isin(pairs.minus, take)
            part = PairBatch(pairs.plus[inside] - k * rows, pairs.minus[inside] - k * rows,
                             pairs.weight[inside])  # fmt: skip
            stats.append(update_policy(
                model, optimizer, batch.select(take), credit.advantages[take], cfg, pairs=part,
                lambda_pair=lam, ref_model=ref_model, groups=groups[take],
            ))  # fmt: skip
    else:
        stats = update_policy(
            model, optimizer, batch, credit.advantages, cfg, pairs=pairs, lambda_pair=lam,
            ref_model=ref_model, groups=groups,
        )  # fmt: skip
    state = {k: v.detach().to(torch.float64).clone() for k, v in model.state_dict().items()}
    return state, stats, credit
