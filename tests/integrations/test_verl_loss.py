"""The plugin's actor loss on synthetic micro-batches in verl's layout: the pair metrics at
the scale of mcgpo's own trainer over data-parallel ranks and micro-batches, and verl's
rollout correction mapped onto mcgpo's ``rollout_correction_weights`` (weights equal to
mcgpo's and to verl's own, applied as mcgpo's task loss applies them, written by the
trainer's advantage step)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from mcgpo.objectives import (  # noqa: E402
    pair_loss,
    response_log_ratio,
    rollout_correction_weights,
    task_loss,
)

pytestmark = pytest.mark.verl

ROWS = 16
# (plus, minus, c): each pair inside one micro-batch of 4 rows (rows 4k..4k+3)
PAIRS = ((0, 1, 0.5), (3, 2, 1.25), (8, 9, 0.8), (13, 12, 2.0))
# token positions whose rollout log-prob is shifted (row, token, shift): rho = exp(-shift)
SHIFTS = ((1, 0, -1.2), (4, 1, 0.9), (6, 0, -0.3), (10, 2, 1.5), (11, 1, -0.05))
LAMBDA = 0.7


def rows(seed: int = 0) -> list[dict]:
    """Per row: prompt/response ids, response mask (the last token of row 5 masked), old and
    rollout log-probs, advantage, and the model's log-probs over the whole sequence."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(ROWS):
        p = int(torch.randint(2, 5, (1,), generator=gen))
        r = int(torch.randint(3, 6, (1,), generator=gen))
        mask = torch.ones(r, dtype=torch.int64)
        if i == 5:
            mask[-1] = 0
        old = torch.randn(r, generator=gen) * 0.3 - 1.0
        rollout = old.clone()
        for row, tok, shift in SHIFTS:
            if row == i:
                rollout[tok] += shift
        out.append({
            "prompts": torch.randint(5, 50, (p,), generator=gen),
            "responses": torch.randint(5, 50, (r,), generator=gen), "response_mask": mask,
            "old_log_probs": old, "rollout_log_probs": rollout,
            "advantages": torch.full((r,), float(torch.randn(1, generator=gen))) * mask,
            "seq_log_probs": torch.randn(p + r, generator=gen) * 0.3 - 1.0,
        })  # fmt: skip
    return out


def micro_batch(
    all_rows: list[dict], take: list[int], *, dp_size: int, weights=None, mini_rows=None
):
    """A micro-batch TensorDict as verl's actor hands it to the loss (global batch info of
    the mini-batch of all the rows over ``dp_size`` ranks; ``mini_rows``: the trainer's
    ``mcgpo_mini_rows``, its learned rows), and the model output."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys = ("prompts", "responses", "response_mask", "old_log_probs", "rollout_log_probs",
            "advantages")  # fmt: skip
    data = list_of_dict_to_tensordict([{k: all_rows[i][k] for k in keys} for i in take])
    n = len(all_rows)
    partner, sign, weight = np.full(n, -1), np.zeros(n), np.zeros(n)
    for plus, minus, c in PAIRS:
        partner[plus], partner[minus], sign[plus], sign[minus] = minus, plus, 1, -1
        weight[plus] = weight[minus] = c
    data["mcgpo_row"] = torch.as_tensor(take, dtype=torch.int64)
    data["mcgpo_partner"] = torch.as_tensor(partner[take], dtype=torch.int64)
    data["mcgpo_sign"] = torch.as_tensor(sign[take], dtype=torch.int64)
    data["mcgpo_weight"] = torch.as_tensor(weight[take], dtype=torch.float32)
    if weights is not None:
        data["rollout_is_weights"] = torch.nested.as_nested_tensor(
            [weights[i][: len(all_rows[i]["responses"])] for i in take], layout=torch.jagged
        )
    if mini_rows is not None:
        data["mcgpo_mini_rows"] = torch.full((len(take),), mini_rows, dtype=torch.int64)
    tokens = int(sum(int(r["response_mask"].sum()) for r in all_rows))
    tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=tokens, global_batch_size=n)
    seq = [all_rows[i]["seq_log_probs"] for i in take]
    lengths = [len(s) for s in seq]
    log_probs = torch.nested.nested_tensor_from_jagged(
        torch.cat(seq), offsets=torch.tensor([0, *np.cumsum(lengths)])
    )
    return data, {"log_probs": log_probs}


def padded(all_rows: list[dict], key: str) -> torch.Tensor:
    width = max(len(r["responses"]) for r in all_rows)
    return torch.stack([
        torch.nn.functional.pad(r[key].float(), (0, width - len(r[key]))) for r in all_rows
    ])  # fmt: skip


def mcgpo_reference(all_rows: list[dict], weights=None):
    """mcgpo's own loss on the whole 16-row mini-batch: task (token mean) + lambda * pair."""
    width = max(len(r["responses"]) for r in all_rows)
    lp = torch.stack([
        torch.nn.functional.pad(r["seq_log_probs"][-len(r["responses"]) - 1 : -1],
                                (0, width - len(r["responses"])))
        for r in all_rows
    ])  # fmt: skip
    old, adv = padded(all_rows, "old_log_probs"), padded(all_rows, "advantages")
    mask = padded(all_rows, "response_mask").bool()
    task, _ = task_loss(
        lp, old, adv, mask, clip=0.2, dual_clip=3.0, kl_coef=0.0, kl_kind="low_var_kl",
        entropy_coef=0.0, rollout_weights=weights,
    )  # fmt: skip
    plus, minus, c = (np.array(x) for x in zip(*PAIRS, strict=True))
    pair, stats = pair_loss(response_log_ratio(lp, old, mask), plus, minus, c, np.arange(ROWS))
    return task, pair, stats


def actor_config():
    from verl.workers.config import ActorConfig

    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=4)
    assert (config.clip_ratio_low, config.clip_ratio_high, config.clip_ratio_c) == (0.2, 0.2, 3.0)
    return config


def run_ranks(all_rows, ranks, *, weights=None, mini_rows=None):
    """``mcgpo_ppo_loss`` on each micro-batch of each rank; (each rank's summed loss, each
    rank's metrics as verl's worker collects them: one Metric per key, a value per
    micro-batch)."""
    from verl.utils.metric import Metric

    from mcgpo.integrations.verl.loss import mcgpo_ppo_loss

    config, losses, collected = actor_config(), [], []
    for micro_batches in ranks:
        total, metrics = 0.0, {}
        for take in micro_batches:
            data, out = micro_batch(
                all_rows, take, dp_size=len(ranks), weights=weights, mini_rows=mini_rows
            )
            loss, m = mcgpo_ppo_loss(config, out, data, lambda_pair=LAMBDA)
            total = total + loss
            for key, value in m.items():
                if isinstance(value, Metric):
                    metrics.setdefault(key, value.init_list()).append(value)
        losses.append(total)
        collected.append(metrics)
    return losses, collected


@pytest.mark.parametrize("dp", [1, 2])
def test_pair_metrics_are_the_mini_batch_values_over_ranks_and_micro_batches(dp):
    """16 rows as dp ranks x micro-batches of 4 rows, every pair inside a micro-batch. After
    verl's aggregation (Metric.aggregate_dp: mean over ranks, then the metric's own
    aggregation over micro-batches), actor/pair_loss is mcgpo's pair loss of the whole
    mini-batch (what mcgpo's trainer logs as loss/pair), not that divided by the micro-batch
    count (4 here when it was a MEAN); the pair counts are totals, the accuracy their ratio;
    and the ranks' mean summed loss is mcgpo's task + lambda * pair (the data-parallel scale
    of the gradient)."""
    from verl.utils.metric import Metric

    from mcgpo.integrations.verl.trainer import pair_accuracy

    all_rows = rows()
    micro = [list(range(k, k + 4)) for k in range(0, ROWS, 4)]
    ranks = [micro[r * len(micro) // dp : (r + 1) * len(micro) // dp] for r in range(dp)]
    losses, collected = run_ranks(all_rows, ranks)
    task, pair, stats = mcgpo_reference(all_rows)
    assert stats["pairs"] == 4 and float(pair) > 0.1

    def agg(key: str) -> float:
        return float(Metric.aggregate_dp([metrics[key] for metrics in collected]))

    np.testing.assert_allclose(agg("actor/pair_loss"), float(pair), rtol=1e-6)
    # what it logged before (a MEAN over the micro-batches of the scaled term): the pair
    # loss over the micro-batches per rank, 4 / dp here, 8 in the recipe (64 rows per rank
    # and mini-batch, micro-batches of 8)
    before = []
    for metrics in collected:
        before.append(Metric("mean"))
        before[-1].extend(metrics["actor/pair_loss"].values)
    before = Metric.aggregate_dp(before)
    np.testing.assert_allclose(before, float(pair) / (4 // dp), rtol=1e-6)
    assert agg("actor/pairs") == 4.0 and agg("actor/pairs_split") == 0.0
    correct = agg("actor/pairs_correct")
    assert correct == round(stats["pair_accuracy"] * 4)
    reduced = {"actor/pairs": agg("actor/pairs"), "actor/pairs_correct": correct}
    assert pair_accuracy(reduced) == {"actor/pair_accuracy": stats["pair_accuracy"]}
    assert pair_accuracy({"actor/pairs": 0.0}) == {}
    mean_loss = sum(losses) / dp  # FSDP averages the ranks' gradients
    torch.testing.assert_close(mean_loss, task + LAMBDA * pair)


def padding_row(template: dict) -> dict:
    """A synthetic padding row as verl makes it (trainer/ppo/padding_utils.py): a real row's
    shape with its response mask zeroed (no tokens, no advantage, no pair)."""
    row = {k: v.clone() for k, v in template.items()}
    row["response_mask"] = torch.zeros_like(row["response_mask"])
    row["advantages"] = torch.zeros_like(row["advantages"])
    return row


@pytest.mark.parametrize("dp", [1, 2])
def test_pair_loss_is_normalised_as_mcgpos_on_a_batch_with_padding_rows(dp):
    """verl pads a batch to a multiple of the mini-batch (here 16 real rows + 8 padding
    rows, spread over the micro-batches as its balancing spreads them); verl's
    global_batch_size counts them, mcgpo's mini-batches hold none. With the trainer's
    mcgpo_mini_rows (16) the pair loss, its metric and the summed loss equal mcgpo's own on
    the 16 real rows; normalised by global_batch_size it was 16/24 of it."""
    from verl.utils.metric import Metric

    all_rows = rows() + [padding_row(r) for r in rows(seed=1)[:8]]
    micro = [[0, 1, 2, 3], [4, 5, 16, 17], [6, 7, 18, 19], [8, 9, 10, 11], [12, 13, 14, 15],
             [20, 21, 22, 23]]  # fmt: skip
    ranks = [micro[r * len(micro) // dp : (r + 1) * len(micro) // dp] for r in range(dp)]
    task, pair, _ = mcgpo_reference(all_rows[:ROWS])
    assert float(pair) > 0.1

    def agg(collected, key: str) -> float:
        return float(Metric.aggregate_dp([metrics[key] for metrics in collected]))

    losses, collected = run_ranks(all_rows, ranks, mini_rows=ROWS)
    np.testing.assert_allclose(agg(collected, "actor/pair_loss"), float(pair), rtol=1e-6)
    torch.testing.assert_close(sum(losses) / dp, task + LAMBDA * pair)
    # verl's global_batch_size alone (what the loss used before): 16 / 24 of mcgpo's
    _, before = run_ranks(all_rows, ranks)
    np.testing.assert_allclose(agg(before, "actor/pair_loss"), float(pair) * 16 / 24, rtol=1e-6)


def test_mini_batch_learned_rows_counts_each_mini_batch_over_the_ranks():
    """Rank d holds rows [d*S, (d+1)*S) and cuts them into mini-batches of rows_per_rank in
    order, so mini-batch j is chunk j of every rank (hand-counted)."""
    from mcgpo.integrations.verl.batch import mini_batch_learned_rows

    learn = np.array([1, 1, 0, 1, 1, 0, 0, 0], dtype=bool)
    got = mini_batch_learned_rows(learn, dp_size=2, rows_per_rank=2)
    np.testing.assert_array_equal(got, [3, 3, 1, 1, 3, 3, 1, 1])
    got = mini_batch_learned_rows(learn, dp_size=1, rows_per_rank=4)
    np.testing.assert_array_equal(got, [3, 3, 3, 3, 1, 1, 1, 1])


CORRECTIONS = [  # verl's rollout_is, rollout_is_threshold -> mcgpo's mode
    ("token", 2.0, "tis"),
    ("sequence", 2.0, "tis"),
    ("token", "0.5_2.0", "mis"),
    ("sequence", "0.4_2.5", "mis"),
]


def verl_block(level, threshold, **rollout_correction):
    return OmegaConf.create({
        "algorithm": {"rollout_correction": {
            "rollout_is": level, "rollout_is_threshold": threshold, **rollout_correction}},
        "actor_rollout_ref": {"rollout": {"calculate_log_probs": True}},
    })  # fmt: skip


@pytest.mark.parametrize(("level", "threshold", "mode"), CORRECTIONS)
def test_rollout_weights_are_mcgpos_and_verls(level, threshold, mode):
    """verl's settings map onto mcgpo's function; the plugin's weights (nested, as the
    trainer writes them) equal mcgpo's rollout_correction_weights and verl's own
    compute_rollout_correction_weights on the same batch, and the caps bind."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    from mcgpo.integrations.verl.config import rollout_correction
    from mcgpo.integrations.verl.loss import rollout_is_weights

    correction = rollout_correction(verl_block(level, threshold))
    upper = float(str(threshold).split("_")[-1])
    assert (correction.mode, correction.level, correction.cap) == (mode, level, upper)
    all_rows = rows()
    old, behaviour = padded(all_rows, "old_log_probs"), padded(all_rows, "rollout_log_probs")
    mask = padded(all_rows, "response_mask").bool()
    nested = {
        k: torch.nested.as_nested_tensor([r[k] for r in all_rows], layout=torch.jagged)
        for k in ("old_log_probs", "rollout_log_probs", "response_mask")
    }
    got, stats = rollout_is_weights(nested["old_log_probs"], nested["rollout_log_probs"],
                                    nested["response_mask"], correction)  # fmt: skip
    got = got.to_padded_tensor(0.0)
    mine, mine_stats = rollout_correction_weights(old, behaviour, mask, mode=mode, level=level,
                                                  cap=upper)  # fmt: skip
    assert torch.equal(got, mine) and stats == mine_stats
    theirs, _ = compute_rollout_correction_weights(
        old - behaviour, mask.float(), rollout_is=level, rollout_is_threshold=threshold
    )
    torch.testing.assert_close(got, theirs * mask, rtol=1e-6, atol=0)
    key = "clipped_frac" if mode == "tis" else "masked_frac"
    assert stats[f"rollout_correction/{key}"] > 0
    if level == "token":  # exactly the shifted tokens move off 1
        moved = {(int(b), int(t)) for b, t in torch.nonzero((got != 1) & mask)}
        assert moved == {(row, tok) for row, tok, _ in SHIFTS}


def test_loss_applies_rollout_weights_as_mcgpos_task_loss():
    """With rollout_is_weights in the micro-batches (as the trainer writes them), the ranks'
    loss is mcgpo's task_loss(rollout_weights=w) + lambda * pair (the pair term unweighted),
    and differs from the unweighted one."""
    from mcgpo.integrations.verl.config import rollout_correction
    from mcgpo.integrations.verl.loss import rollout_is_weights

    all_rows = rows()
    correction = rollout_correction(verl_block("token", 1.5))
    old, behaviour = padded(all_rows, "old_log_probs"), padded(all_rows, "rollout_log_probs")
    mask = padded(all_rows, "response_mask").bool()
    weights, _ = rollout_is_weights(old, behaviour, mask, correction)
    micro = [list(range(k, k + 4)) for k in range(0, ROWS, 4)]
    losses, _ = run_ranks(all_rows, [micro[:2], micro[2:]], weights=weights)
    task, pair, _ = mcgpo_reference(all_rows, weights=weights)
    torch.testing.assert_close(sum(losses) / 2, task + LAMBDA * pair)
    plain, _, _ = mcgpo_reference(all_rows)
    assert abs(float(task - plain)) > 1e-4


class FakeBatch(SimpleNamespace):
    """The parts of verl's KVBatchMeta the advantage step reads."""

    def __len__(self) -> int:
        return len(self.keys)


def test_trainer_advantage_step_writes_mcgpos_weights(monkeypatch):
    """McgpoTrainer._compute_advantage (TransferQueue faked by a dict) writes the credit and
    rollout_is_weights = the plugin's weights on the credit's response mask, and logs
    mcgpo's rollout_correction/* metrics; without rollout_is it writes no weights."""
    from tensordict import TensorDict

    from mcgpo.bench.synthetic import synthetic_table
    from mcgpo.integrations.verl import trainer as trainer_module
    from mcgpo.integrations.verl.batch import batch_credit
    from mcgpo.integrations.verl.config import plugin_config, rollout_correction
    from mcgpo.integrations.verl.loss import rollout_is_weights

    table = synthetic_table(2, 4, 2, n_states=3, n_actions=2, full_length=True, seed=0)
    records = table.to_records()
    all_rows = rows()[: len(records)]
    store = {
        k: torch.nested.as_nested_tensor([r[k] for r in all_rows], layout=torch.jagged)
        for k in ("old_log_probs", "rollout_log_probs", "response_mask")
    }

    def kv_batch_get(keys, partition_id, select_fields):
        return TensorDict({k: store[k] for k in select_fields}, batch_size=len(keys))

    def kv_batch_put(keys, partition_id, fields):
        store.update(dict(fields.items()))
        return batch

    monkeypatch.setattr(trainer_module.tq, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(trainer_module.tq, "kv_batch_put", kv_batch_put)
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"n": 4, "calculate_log_probs": True},
                              "actor": {"ppo_mini_batch_size": 2}},
        "algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}},
        "mcgpo": {"env": {"name": "household"}, "algo": {"name": "grpo"}},
    })  # fmt: skip
    batch = FakeBatch(keys=[f"k{i}" for i in range(len(records))], partition_id="train")
    trainer = trainer_module.McgpoTrainer.__new__(trainer_module.McgpoTrainer)
    trainer.config, trainer.global_steps = config, 1
    trainer._failed_updates, trainer._max_failed_updates, trainer._first_error = 0, 3, ""
    trainer.mcgpo = plugin_config(config)
    trainer._correction = rollout_correction(config)
    trainer._dp_size = lambda: 1
    result = batch_credit(records, trainer.mcgpo.algo)
    trainer._credit = (list(batch.keys), result, None, {})
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)
    expected, stats = rollout_is_weights(store["old_log_probs"], store["rollout_log_probs"],
                                         store["response_mask"], trainer._correction)  # fmt: skip
    torch.testing.assert_close(store["rollout_is_weights"].to_padded_tensor(0.0),
                               expected.to_padded_tensor(0.0), rtol=0, atol=0)  # fmt: skip
    assert metrics["rollout_correction/ratio_max"] == stats["rollout_correction/ratio_max"] > 2.0
    adv = store["advantages"].to_padded_tensor(0.0)[:, 0]
    np.testing.assert_array_equal(adv.numpy(), result.advantages)
    # the pair loss's normaliser: 2 prompts x 4 = 8 rows per mini-batch, all learned
    np.testing.assert_array_equal(store["mcgpo_mini_rows"].numpy(), [8] * len(records))
    trainer._correction, trainer._credit = None, (list(batch.keys), result, None, {})
    del store["rollout_is_weights"]
    trainer._compute_advantage(batch, {})
    assert "rollout_is_weights" not in store
