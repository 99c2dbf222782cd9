"""One actor update through verl's worker and through mcgpo's own update, from the same
weights on the same batch (run by test_verl_equivalence.py, in a fresh process).

``VERL_PLATFORM=cpu python tests/integrations/verl_update_equivalence.py OUT [--dp D]``
builds the tiny model (OUT/model, and OUT/ref for the reference) and a batch of 48 step
rows (2 tasks x 8 trajectories x 3 turns, :func:`mcgpo.bench.synthetic.synthetic_table`
seed 0: every advantage nonzero, 6 MCGPO pairs) with random prompt and response tokens.
The rows go through the plugin as verl hands them over: agent-loop ``extra_fields`` ->
:func:`~mcgpo.integrations.verl.trainer.lay_out_batch` (the trainer's layout for D
data-parallel ranks) -> :func:`~mcgpo.integrations.verl.batch.credit_fields` -> a
TensorDict in TransferQueue's layout (``agent_loop_tq``'s fields), cut into D contiguous
chunks with verl's own ``chunk_tensordict`` (its data-parallel dispatch). D processes
(``--rank R``, a gloo group of world size D) each run verl's ``ActorRolloutRefWorker``
(role ``actor``, FSDP2 engine in fp32 sharded over the D ranks) on their chunk:
``compute_log_prob`` for pi_old, a ref worker on another checkpoint for the reference, then
``update_actor`` with ``mcgpo_ppo_loss`` installed by ``set_loss_fn`` and the trainer's
``extra_info`` (``trainer_base._update_actor``).

Clipping binds: pi_old as the update sees it is the worker's log-prob plus a shift on some
tokens (:func:`clip_shift`), so the first ratios are 0.67, 1.49 or 4.5 there: PPO's clip
(0.8 / 1.2) binds for tokens of either advantage sign and the dual clip (3) for negative
ones. Both sides train on the same shifted pi_old.

mcgpo's side (one process, the reference path): the same model folder loaded with
transformers, the same rows as a :class:`~mcgpo.rollout.tokens.TokenBatch`, ordered so that
mcgpo's mini-batch k is the union of the D ranks' mini-batches k (for D = 1 verl's order),
advantages and pairs from :func:`mcgpo.training.algorithms.assign_credit` on the StepTable,
and :func:`mcgpo.training.update.update_policy` with the same settings: 2 mini-batches of 24
rows (the groups argument makes each mini-batch those rows), micro-batches of 4, clip 0.2,
dual clip 3, KL 0.5 (low_var_kl), entropy 0.01, lambda_pair 1, grad clip 1, AdamW (lr 1e-2,
betas 0.9/0.999, weight decay 0.01, eps 1: see the test for why), one epoch. Also run:
mcgpo with lambda_pair 0 and with KL 0, and for D > 1 with the pair term scaled by D and
by 1/D (controls: each moves the weights by far more than the tolerance, so a wrong
data-parallel scale of the pair term fails).

``--tis``: verl's rollout correction on, with the clip still binding: pi_old is shifted by
:func:`clip_shift` as above, the sampler's log-probs (``rollout_log_probs``) are that pi_old
shifted again by :func:`tis_shift` (rollout weights 3.3, truncated at the cap 2, and 0.61),
and verl's update gets the ``rollout_is_weights`` the mcgpo trainer writes for
``rollout_is: token``, ``rollout_is_threshold: 2``
(:func:`~mcgpo.integrations.verl.loss.rollout_is_weights`); mcgpo's update gets the same
sampler log-probs with ``train.rollout_correction tis`` (cap 2), recomputes pi_old itself
and adds the same :func:`clip_shift` to it (``old_shift``). Control: mcgpo without the
correction.

The mcgpo side and the shared setup are in verl_equivalence_mcgpo.py.

Writes OUT/result.json (atomically).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
from verl_equivalence_mcgpo import (
    BETAS,
    CLIP,
    DUAL_CLIP,
    ENTROPY,
    EPS,
    GRAD_CLIP,
    KL,
    LAMBDA,
    LR,
    MICRO,
    MINI_PROMPTS,
    TIS_CAP,
    WD,
    N,
    build_model,
    mcgpo_update,
    plugin_run_config,
    rows_and_tokens,
)  # fmt: skip


def stage(name: str) -> None:
    print(f"verl_update_equivalence: {name}", flush=True)


def verl_config(model: Path):
    from hydra import compose, initialize_config_module

    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    fp32 = "{param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}"
    overrides = [
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"{actor}.strategy=fsdp2", f"+{actor}.fsdp_config.mixed_precision={fp32}",
        f"+actor_rollout_ref.ref.fsdp_config.mixed_precision={fp32}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
        f"{actor}.fsdp_config.use_torch_compile=false", f"{actor}.use_torch_compile=false",
        f"{actor}.ppo_mini_batch_size={MINI_PROMPTS}", f"{actor}.ppo_micro_batch_size_per_gpu={MICRO}",
        f"{actor}.ppo_epochs=1", f"{actor}.shuffle=false",
        f"{actor}.clip_ratio={CLIP}", f"{actor}.clip_ratio_low={CLIP}", f"{actor}.clip_ratio_high={CLIP}",
        f"{actor}.clip_ratio_c={DUAL_CLIP}", f"{actor}.loss_agg_mode=token-mean",
        f"{actor}.use_kl_loss=true", f"{actor}.kl_loss_coef={KL}", f"{actor}.kl_loss_type=low_var_kl",
        f"{actor}.entropy_coeff={ENTROPY}", f"{actor}.grad_clip={GRAD_CLIP}",
        f"{actor}.optim.lr={LR}", f"{actor}.optim.weight_decay={WD}",
        f"{actor}.optim.clip_grad={GRAD_CLIP}", f"{actor}.optim.betas=[{BETAS[0]},{BETAS[1]}]",
        f"{actor}.optim.override_optimizer_config={{eps: {EPS}}}",
        f"{rollout}.name=mcgpo_cpu", f"{rollout}.n={N}", f"{rollout}.temperature=1.0",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={MICRO}",
        f"{rollout}.tensor_model_parallel_size=1",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "data.train_batch_size=2", "algorithm.adv_estimator=grpo",
    ]  # fmt: skip
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def tq_rows(records, prompts, responses):
    """Rows in TransferQueue's layout, as ``agent_loop_tq._agent_loop_postprocess`` puts them."""
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields = []
    for extra, p, r in zip(records, prompts, responses, strict=True):
        prompt, response = torch.tensor(p), torch.tensor(r)
        ids = torch.cat([prompt, response])
        fields.append({
            "prompts": prompt, "responses": response,
            "response_mask": torch.ones(len(r), dtype=torch.int64),
            "loss_mask": torch.ones(len(r), dtype=torch.int64),
            "input_ids": ids, "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(len(ids)), "extra_fields": dict(extra),
        })  # fmt: skip
    return list_of_dict_to_tensordict(fields)


def clip_shift(row: int, length: int) -> list[float]:
    """delta added to pi_old's log-prob of each token of batch row ``row`` (verl's order), so
    that the first ratio exp(-delta) is 0.67 on the first token of every third row (PPO's
    clip binds where A < 0), 1.49 on the next rows' (binds where A > 0), and 4.5 on the
    second token of every fourth row (the dual clip binds where A < 0)."""
    shift = [0.0] * length
    shift[0] = {0: 0.4, 1: -0.4, 2: 0.0}[row % 3]
    if row % 4 == 2 and length > 1:
        shift[1] = -1.5
    return shift


def tis_shift(row: int, length: int) -> list[float]:
    """e added to the sampler's log-probs on top of pi_old's (``--tis``: the sampler's are
    pi_old + e), so that the rollout weight pi_old / pi_sampler = exp(-e) is 3.3 on the last
    token of every odd row (TIS truncates it at the cap 2) and 0.61 on the first token of
    every fifth row; 1 elsewhere. Independent of :func:`clip_shift`, which still makes PPO's
    clip and dual clip bind."""
    shift = [0.0] * length
    if row % 2 == 1:
        shift[-1] = -1.2
    if row % 5 == 0:
        shift[0] += 0.5
    return shift


def verl_update(config, ref_config, data, first_row: int, tis: bool = False) -> dict:
    """pi_old from the actor worker's compute_log_prob (then shifted by :func:`clip_shift`;
    ``first_row``: the chunk's first row in the batch), the reference log-probs from a ref
    worker (``ref_config``: another model folder), then one update_actor; the new weights
    (gathered from every rank: all ranks must call this). With ``tis`` the sampler's
    log-probs (``rollout_log_probs``) are that pi_old shifted again by :func:`tis_shift`,
    and the update gets the ``rollout_is_weights`` the mcgpo trainer's advantage step would
    write for verl's ``rollout_is: token``, ``rollout_is_threshold: TIS_CAP``: the clip and
    the cap both bind."""
    import torch
    from verl.trainer.ppo.v1.trainer_base import response_from_nested
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine_workers import ActorRolloutRefWorker

    from mcgpo.integrations.verl.config import RolloutCorrection
    from mcgpo.integrations.verl.loss import mcgpo_ppo_loss, rollout_is_weights

    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()
    actor_config = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    worker.set_loss_fn(partial(mcgpo_ppo_loss, config=actor_config, lambda_pair=LAMBDA))
    infer = data.clone()
    tu.assign_non_tensor(infer, calculate_entropy=True, compute_loss=False, temperature=1.0)
    out = worker.compute_log_prob(infer)
    raw = response_from_nested(out["log_probs"], data["response_mask"])
    shifted = torch.nested.as_nested_tensor(
        [t + torch.tensor(clip_shift(first_row + i, len(t)), dtype=t.dtype)
         for i, t in enumerate(raw.unbind())], layout=torch.jagged,
    )  # fmt: skip
    old, behaviour, correction = shifted, shifted, {}
    if tis:
        behaviour = torch.nested.as_nested_tensor(
            [t + torch.tensor(tis_shift(first_row + i, len(t)), dtype=t.dtype)
             for i, t in enumerate(shifted.unbind())], layout=torch.jagged,
        )  # fmt: skip
        data["rollout_is_weights"], correction = rollout_is_weights(
            old, behaviour, data["response_mask"], RolloutCorrection("tis", "token", TIS_CAP)
        )
    ref_worker = ActorRolloutRefWorker(ref_config.actor_rollout_ref, role="ref")
    ref_worker.init_model()
    infer = data.clone()
    tu.assign_non_tensor(infer, calculate_entropy=False, compute_loss=False, temperature=1.0)
    ref = response_from_nested(ref_worker.compute_ref_log_prob(infer)["log_probs"],
                               data["response_mask"])  # fmt: skip
    data["old_log_probs"], data["ref_log_prob"] = old, ref
    rows = MINI_PROMPTS * N  # the mini-batch over all ranks, as the trainer passes it
    tu.assign_non_tensor(
        data, calculate_entropy=True, distillation_use_topk=False, distillation_only=False,
        global_batch_size=rows, mini_batch_size=rows, epochs=1, seed=42,
        dataloader_kwargs={"shuffle": False}, temperature=1.0,
    )  # fmt: skip
    metrics = tu.get(worker.update_actor(data), "metrics")
    module = worker.actor.engine.module
    state = {}
    for name, value in module.state_dict().items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        state[name] = value.detach().to(torch.float64).clone()
    return {
        "state": state, "old": [t.tolist() for t in old.unbind()],
        "raw_old": [t.tolist() for t in raw.unbind()],
        "behaviour": [t.tolist() for t in behaviour.unbind()], "correction": correction,
        "ref": [t.tolist() for t in ref.unbind()], "metrics": metrics,
    }  # fmt: skip


def prepare(out: Path, dp: int):
    """The batch as the trainer lays it out for ``dp`` ranks: (table, order, credit result,
    layout stats, prompts, responses, the TensorDict of the rows in that order)."""
    from mcgpo.integrations.verl.batch import credit_fields
    from mcgpo.integrations.verl.trainer import lay_out_batch

    table, records, prompts, responses = rows_and_tokens()
    work = np.array([len(p) + len(r) for p, r in zip(prompts, responses)], dtype=float)
    order, result, stats = lay_out_batch(
        records, [False] * len(records), work, plugin_run_config(), group_size=N, dp_size=dp,
        mini_batch_rows=MINI_PROMPTS * N,
    )  # fmt: skip
    order = [int(i) for i in order]
    data = tq_rows([records[i] for i in order], [prompts[i] for i in order],
                   [responses[i] for i in order])  # fmt: skip
    for key, value in credit_fields(result, data["response_mask"]).items():
        data[key] = value
    return table, order, result, stats, prompts, responses, data


def rank_main(out: Path, rank: int, dp: int, tis: bool) -> None:
    """One data-parallel rank of verl's side: its chunk through the workers; OUT/rank<R>.pt."""
    import torch
    import verl  # noqa: F401  (loads the plugin: the cpu platform and engine)
    from verl.utils import tensordict_utils as tu

    torch.manual_seed(0)
    data = prepare(out, dp)[-1]
    chunk = tu.chunk_tensordict(data, dp)[rank]
    side = verl_update(verl_config(out / "model"), verl_config(out / "ref"), chunk,
                       first_row=rank * (len(data) // dp), tis=tis)  # fmt: skip
    if rank != 0:
        side.pop("state")
    torch.save(side, out / f"rank{rank}.pt")


def launch_ranks(out: Path, dp: int, tis: bool) -> list[dict]:
    """verl's side on ``dp`` processes (a gloo group); each rank's results."""
    import torch

    with socket.socket() as s:  # a free port for the gloo group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(dp):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(dp), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(dp), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        cmd = [sys.executable, __file__, str(out), "--dp", str(dp), "--rank", str(rank),
               *(["--tis"] if tis else [])]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise RuntimeError(f"verl ranks exited with {codes}")
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(dp)]


def mcgpo_permutation(rows: int, dp: int) -> list[int]:
    """verl positions in mcgpo's order: mini-batch k = the ranks' mini-batches k, in rank
    order (rank d holds verl positions [d*S, (d+1)*S), its mini-batch k the k-th m rows)."""
    per_rank, mini = rows // dp, MINI_PROMPTS * N // dp
    return [d * per_rank + k * mini + j for k in range(per_rank // mini) for d in range(dp)
            for j in range(mini)]  # fmt: skip


def run(out: Path, dp: int, tis: bool = False) -> dict:
    import torch
    import verl  # noqa: F401  (loads the plugin: the cpu platform and engine)
    from transformers import AutoModelForCausalLM

    from mcgpo.policy.logprobs import token_log_probs
    from mcgpo.rollout.tokens import TokenBatch

    torch.manual_seed(0)
    stage(f"building the model and the batch (dp = {dp})")
    build_model(out / "model")
    build_model(out / "ref", seed=1)  # the reference: another checkpoint, so KL > 0 at once
    table, order, result, stats, prompts, responses, _ = prepare(out, dp)
    stage(f"verl: {dp} rank(s): worker init, compute_log_prob, update_actor")
    ranks = launch_ranks(out, dp, tis)
    raw_old = [row for side in ranks for row in side["raw_old"]]
    verl_ref = [row for side in ranks for row in side["ref"]]
    theirs = ranks[0]["state"]
    initial = AutoModelForCausalLM.from_pretrained(out / "model", torch_dtype=torch.float32)
    init = {k: v.to(torch.float64) for k, v in initial.state_dict().items()}
    stage("mcgpo: update_policy (and the controls)")
    perm = mcgpo_permutation(len(order), dp)
    rows = [order[i] for i in perm]
    given = [row for side in ranks for row in side["behaviour" if tis else "old"]]
    same = (out / "model", out / "ref", table, rows, prompts, responses,
            [given[i] for i in perm])  # fmt: skip
    # with tis mcgpo recomputes pi_old (the worker's, within LOGPROB_TOL) and then takes the
    # same clip_shift verl's pi_old has, row by row in its own order
    old_shift = [clip_shift(i, len(responses[order[i]])) for i in perm] if tis else None
    mine, mine_stats, credit = mcgpo_update(*same, kl=KL, lam=LAMBDA, tis=tis,
                                            old_shift=old_shift)  # fmt: skip
    # per mini-batch: one call each (with tis each call would recompute pi_old at its own
    # weights, which verl does once: so only without it)
    step_stats = []
    stepwise = mine
    if not tis:
        stepwise, step_stats, _ = mcgpo_update(*same, kl=KL, lam=LAMBDA, per_mini_batch=True)
    controls = {"no_pair": (KL, 0.0, tis), "no_kl": (0.0, LAMBDA, tis)}
    if dp > 1:
        controls.update(pair_times_dp=(KL, LAMBDA * dp, tis), pair_over_dp=(KL, LAMBDA / dp, tis))
    if tis:  # the sampler's log-probs as pi_old, no weights: what verl's path would be without
        controls["no_correction"] = (KL, LAMBDA, False)
    names = sorted(set(mine) & set(theirs))

    def max_diff(a, b):
        return max(float((a[k] - b[k]).abs().max()) for k in names)

    control = {k: max_diff(mcgpo_update(*same, kl=kl, lam=lam, tis=t,
                                        old_shift=old_shift if t else None)[0], theirs)
               for k, (kl, lam, t) in controls.items()}  # fmt: skip

    def logprob_diff(folder, verl_values):
        """Max |mcgpo's log-prob - verl's| on the response tokens, model from ``folder``."""
        model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
        batch = TokenBatch.from_sequences(
            [prompts[i] for i in order], [responses[i] for i in order], verl_values,
            pad_token_id=0,
        )  # fmt: skip
        with torch.no_grad():
            lp = token_log_probs(model, batch.input_ids, batch.attention_mask,
                                 positions=batch.response_mask)  # fmt: skip
        return float((lp - batch.old_log_probs)[batch.response_mask].abs().max())

    metrics = {}  # verl's per-mini-batch metrics (lists of numbers; a scalar as a list)
    for key, value in ranks[0]["metrics"].items():
        values = value if isinstance(value, list) else [value]
        if all(isinstance(x, (int, float)) for x in values):
            metrics[key] = [float(x) for x in values]
    plus = np.flatnonzero(result.sign > 0)
    verl_correction = {}
    if tis:  # over the whole batch, as the trainer's advantage step computes them
        from mcgpo.integrations.verl.config import RolloutCorrection
        from mcgpo.integrations.verl.loss import rollout_is_weights

        def nested(key):
            rows = [torch.tensor(r) for side in ranks for r in side[key]]
            return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

        mask = torch.nested.as_nested_tensor(
            [torch.ones(len(r), dtype=torch.int64) for side in ranks for r in side["old"]],
            layout=torch.jagged,
        )  # fmt: skip
        _, verl_correction = rollout_is_weights(
            nested("old"), nested("behaviour"), mask, RolloutCorrection("tis", "token", TIS_CAP)
        )
    return {
        "dp": dp,
        "tis": tis,
        "verl_correction": verl_correction,
        "mcgpo_correction": {
            k: v for k, v in mine_stats.items() if k.startswith("rollout_correction/")
        },
        "rows": len(order),
        "names_only_verl": sorted(set(theirs) - set(mine)),
        "names_only_mcgpo": sorted(set(mine) - set(theirs)),
        "plugin_advantages": result.advantages[perm].tolist(),  # in mcgpo's order
        "mcgpo_advantages": np.asarray(credit.advantages, np.float32).tolist(),
        "plugin_pairs": sorted(zip(plus.tolist(), result.partner[plus].tolist())),
        "mcgpo_pairs": sorted((perm[a], perm[b]) for a, b in zip(credit.plus, credit.minus)),
        "pair_ranks": sorted({int(p) // (len(order) // dp) for p in plus}),
        "layout_pairs": stats.pairs,
        "layout_split_after": stats.split_after,
        "old_logprob_diff": logprob_diff(out / "model", raw_old),
        "ref_logprob_diff": logprob_diff(out / "ref", verl_ref),
        "stepwise_vs_single_call": max_diff(stepwise, mine),
        "mcgpo_step_losses": [
            s["loss/task"] + LAMBDA * s.get("loss/pair", 0.0) for s in step_stats
        ],
        "mcgpo_step_kl": [s["loss/kl"] for s in step_stats],
        "mcgpo_step_pg": [s["loss/policy"] for s in step_stats],
        "mcgpo_step_pair": [s.get("loss/pair", 0.0) for s in step_stats],
        "mcgpo_step_clipfrac": [s["policy/pg_clipfrac"] for s in step_stats],
        "mcgpo_step_clipfrac_lower": [s["policy/pg_clipfrac_lower"] for s in step_stats],
        "weights_vs_verl": max_diff(mine, theirs),
        "weights_moved": max_diff(init, theirs),
        **{f"control_{k}_vs_verl": v for k, v in control.items()},
        "verl_metrics": metrics,
        "mcgpo_stats": {k: float(v) for k, v in mine_stats.items()},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--dp", type=int, default=1, help="data-parallel ranks of verl's side")
    parser.add_argument("--tis", action="store_true", help="verl's rollout correction (TIS)")
    parser.add_argument("--rank", type=int, default=None, help="(internal) run this rank")
    args = parser.parse_args(argv)
    if args.rank is not None:
        rank_main(args.out, args.rank, args.dp, args.tis)
        return
    result = run(args.out, args.dp, args.tis)
    tmp = args.out / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(args.out / "result.json")
    stage("done")


if __name__ == "__main__":
    main()
