"""The verl plugin: entry point registration, agent loop episodes, the advantage step on a
batch in verl's TransferQueue layout, and the loss on a real micro-batch TensorDict."""

from __future__ import annotations

import sys

import numpy as np
import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402

import mcgpo  # noqa: E402
from conftest import MAX_TURNS, N, verl_config  # noqa: E402
from mcgpo.objectives import pair_loss, response_log_ratio, task_loss  # noqa: E402

pytestmark = pytest.mark.verl


def test_import_verl_registers_agent_loop_trainer_and_loss():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

    # loaded through the entry point by `import verl`, not by this test
    assert "mcgpo.integrations.verl.plugin" in sys.modules
    plugin = sys.modules["mcgpo.integrations.verl.plugin"]
    assert plugin.REGISTERED == {
        "agent_loop": "mcgpo_env", "trainer": "mcgpo", "loss": "mcgpo_ppo_pair",
        "rollout": "mcgpo_cpu", "platform": "cpu",
    }  # fmt: skip
    target = _agent_loop_registry["mcgpo_env"]["_target_"]
    assert target == "mcgpo.integrations.verl.agent_loop.McgpoEnvAgentLoop"
    assert get_trainer_cls("mcgpo").__name__ == "McgpoTrainer"


def test_plugin_config_errors():
    from mcgpo.integrations.verl.config import plugin_config
    from mcgpo.training.config import ConfigError

    bad = verl_config()
    bad.mcgpo.trainer = {"lr": 1.0}
    with pytest.raises(ConfigError, match=r"^mcgpo.trainer: unknown section"):
        plugin_config(bad)
    bad = verl_config()
    bad.mcgpo.train = {"lr": 1.0}  # verl's actor config has it: named, not ignored
    with pytest.raises(ConfigError, match=r"^mcgpo.train.lr: verl's actor config "
                                          r"\(actor_rollout_ref.actor.\*\) governs"):  # fmt: skip
        plugin_config(bad)
    with pytest.raises(ConfigError, match=r"unknown option --algo.nope for mcgpo"):
        plugin_config(verl_config(nope=1))


def test_plugin_config_takes_per_estimator_tables():
    """``algo: {<estimator>: {...}}`` in the OmegaConf block, as the paper presets write
    GraphGPO's omega: used by the algorithms that run that estimator (graphgpo, mcgpo),
    ignored by one that does not (grpo), and checked against the estimator's options."""
    from mcgpo.integrations.verl.config import plugin_config
    from mcgpo.training.config import ConfigError

    table = {"graphgpo": {"omega": 0.2}}
    assert plugin_config(verl_config("graphgpo", **table)).algo.estimator["omega"] == 0.2
    assert plugin_config(verl_config("mcgpo", **table)).algo.estimator["omega"] == 0.2
    assert "omega" not in plugin_config(verl_config("grpo", **table)).algo.estimator
    # a flat option wins over the table, as on the command line
    both = verl_config("graphgpo", omega=0.3, **table)
    assert plugin_config(both).algo.estimator["omega"] == 0.3
    with pytest.raises(ConfigError, match=r"unknown option --algo.graphgpo.nope for graphgpo"):
        plugin_config(verl_config("graphgpo", graphgpo={"nope": 1}))


def test_agent_loop_runs_whole_episodes(episodes):
    _, server, outs = episodes
    rows = [o for outputs in outs.values() for o in outputs]
    assert server.calls == len(rows) > 0  # one model call per environment step
    for (uid, session), outputs in outs.items():
        assert 1 <= len(outputs) <= MAX_TURNS
        turns = [o.extra_fields["turn"] for o in outputs]
        assert turns == list(range(len(outputs)))
        last = outputs[-1].extra_fields
        assert last["done"] or len(outputs) == MAX_TURNS  # ran to the end or the turn limit
        for o in outputs:
            f = o.extra_fields
            assert (f["group"], f["traj"], f["slot"]) == (uid, f"{uid}_{session}", session)
            assert len(o.response_ids) == len(o.response_mask) == len(o.response_logprobs)
            assert f["success"] == last["success"] and not f["errored"]
        assert outputs[-1].reward_score == sum(o.extra_fields["reward"] for o in outputs)
    # the N sessions of a prompt play the same task: same first anchor
    for g in ("uid-0", "uid-1"):
        assert len({outs[(g, s)][0].extra_fields["anchor"] for s in range(N)}) == 1


def _tq_batch(outs):
    """The rows as _agent_loop_postprocess puts them into TransferQueue (verl's layout)."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    fields = []
    for (uid, session), outputs in outs.items():
        for o in outputs[:-1]:  # verl copies the final output's score to the others
            o.reward_score = outputs[-1].reward_score
        for o in outputs:
            field = o.as_dict()
            field.update(uid=uid, session_id=session)
            field["loss_mask"] = field["response_mask"]
            field.pop("multi_modal_data", None)
            fields.append(field)
    return list_of_dict_to_tensordict(fields)


@pytest.mark.parametrize("algo", ["mcgpo", "gigpo", "grpo"])
def test_advantage_step_equals_mcgpo_estimate(episodes, algo):
    from mcgpo.integrations.verl.batch import STEP_FIELDS, batch_credit, credit_fields
    from mcgpo.integrations.verl.config import plugin_config

    _, _, outs = episodes
    data = _tq_batch(outs)
    run = plugin_config(verl_config(algo))
    result = batch_credit(data, run.algo)
    # the same rows given to mcgpo directly, with verl's uuid strings as ids
    rows = [{k: f[k] for k in STEP_FIELDS} for f in data["extra_fields"]]
    table = mcgpo.StepTable.from_records(rows)
    estimator = "graphgpo" if algo == "mcgpo" else algo
    expected, _ = mcgpo.estimate(estimator, table, **run.algo.estimator)
    np.testing.assert_array_equal(result.advantages, expected)
    fields = credit_fields(result, data["response_mask"])
    mask = data["response_mask"].to_padded_tensor(0).float()
    got = fields["advantages"].to_padded_tensor(0.0)
    torch.testing.assert_close(got, torch.as_tensor(expected)[:, None] * mask, rtol=0, atol=0)
    if algo == "mcgpo":
        prefs = mcgpo.build_preferences(table, **run.algo.pairs)
        plus = np.flatnonzero(result.sign > 0)
        assert sorted(plus.tolist()) == sorted(prefs.plus.tolist())
        np.testing.assert_array_equal(result.partner[prefs.plus], prefs.minus)


def _micro_batch(outs, seed=0):
    """A micro-batch TensorDict as verl's actor hands it to the loss, and its log-probs."""
    from verl.utils import tensordict_utils as tu

    from mcgpo.integrations.verl.batch import batch_credit, credit_fields
    from mcgpo.integrations.verl.config import plugin_config

    data = _tq_batch(outs)
    result = batch_credit(data, plugin_config(verl_config("mcgpo", **{})).algo)
    for key, value in credit_fields(result, data["response_mask"]).items():
        data[key] = value
    # the tiny untrained policy rarely wins, so preferences are set by hand on real rows:
    # row 0 preferred to row 1 (c = 0.5), row 6 preferred to row 3 (c = 1.25)
    partner, sign, weight = np.full(len(data), -1), np.zeros(len(data)), np.zeros(len(data))
    for plus, minus, c in ((0, 1, 0.5), (6, 3, 1.25)):
        partner[plus], partner[minus], sign[plus], sign[minus] = minus, plus, 1, -1
        weight[plus] = weight[minus] = c
    data["mcgpo_partner"] = torch.as_tensor(partner, dtype=torch.int64)
    data["mcgpo_sign"] = torch.as_tensor(sign, dtype=torch.int64)
    data["mcgpo_weight"] = torch.as_tensor(weight, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    old = [torch.randn(len(r), generator=gen) * 0.1 - 1 for r in data["responses"].unbind()]
    data["old_log_probs"] = torch.nested.as_nested_tensor(old, layout=torch.jagged)
    seq = [len(p) + len(r) for p, r in zip(data["prompts"].unbind(), data["responses"].unbind())]
    log_probs = torch.randn(sum(seq), generator=gen) * 0.1 - 1
    log_probs = torch.nested.nested_tensor_from_jagged(
        log_probs, offsets=torch.tensor([0, *np.cumsum(seq)])
    )
    tokens = int(data["response_mask"].values().sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=tokens, global_batch_size=len(seq))
    return data, {"log_probs": log_probs}


def test_loss_equals_mcgpo_task_plus_pair_loss(episodes):
    from verl.workers.config import ActorConfig
    from verl.workers.utils.padding import no_padding_2_padding

    from mcgpo.integrations.verl.loss import mcgpo_ppo_loss

    _, _, outs = episodes
    data, model_output = _micro_batch(outs)
    config = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=N)
    loss, metrics = mcgpo_ppo_loss(config, model_output, data, lambda_pair=0.7)
    # mcgpo's own loss on the same rows and the same per-token log-probs
    lp = no_padding_2_padding(model_output["log_probs"], data)
    old = data["old_log_probs"].to_padded_tensor(0.0)
    mask = data["response_mask"].to_padded_tensor(0).bool()
    adv = data["advantages"].to_padded_tensor(0.0)
    task, _ = task_loss(
        lp, old, adv, mask, clip=config.clip_ratio_low, clip_high=config.clip_ratio_high,
        dual_clip=config.clip_ratio_c, kl_coef=0.0, kl_kind="low_var_kl", entropy_coef=0.0,
    )  # fmt: skip
    d = response_log_ratio(lp, old, mask)
    pair, stats = pair_loss(d, np.array([0, 6]), np.array([1, 3]), np.array([0.5, 1.25]),
                            np.arange(len(d)))  # fmt: skip
    assert stats["pairs"] == 2 and stats["pairs_split"] == 0
    assert float(pair) != 0.0
    torch.testing.assert_close(loss, task + 0.7 * pair)
    assert float(metrics["actor/pairs"].values[0]) == 2.0


def test_micro_batch_pairs_counts_split_pairs(episodes):
    from mcgpo.integrations.verl.loss import micro_batch_pairs

    _, _, outs = episodes
    data, _ = _micro_batch(outs)
    rows = torch.tensor([0, 1, 3])  # holds pair (0, 1) whole and only row 3 of (6, 3)
    sub = {k: data[k][rows] for k in ("mcgpo_row", "mcgpo_partner", "mcgpo_sign", "mcgpo_weight")}
    got_rows, plus, minus, weight = micro_batch_pairs(sub)
    assert got_rows.tolist() == [0, 1, 3]
    assert plus.tolist() == [0, 6] and minus.tolist() == [1, 3] and weight.tolist() == [0.5, 1.25]
    _, stats = pair_loss(torch.zeros(3), plus, minus, weight, got_rows)
    assert stats["pairs"] == 1 and stats["pairs_split"] == 1
