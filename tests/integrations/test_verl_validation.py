"""Validation under verl logs mcgpo's ``eval/*`` (success, score, turns, valid actions,
errored episodes, success per task type: the names of mcgpo's own evaluation), and a
training update whose every trajectory errored is a warning with the first error, a skipped
optimiser step, and after ``mcgpo.train.max_failed_updates`` in a row the end of the run."""

from __future__ import annotations

import asyncio
import logging

import pytest

verl = pytest.importorskip("verl")

import faulty_env  # noqa: E402

from conftest import N, TinyServer, verl_config  # noqa: E402

pytestmark = pytest.mark.verl


def test_validation_metrics_by_hand():
    """Three episodes verl kept and one session without output (a failed reset): success
    and score over the two that did not error, the other two counted as errored."""
    from mcgpo.integrations.verl.validation import episode_info, validation_metrics

    episodes = [
        episode_info(success=1.0, score=0.9, errored=False, turns=3, valid_turns=2,
                     task_type="pick"),
        episode_info(success=0.0, score=0.2, errored=False, turns=5, valid_turns=5,
                     task_type="clean"),
        episode_info(success=0.0, score=0.0, errored=True, turns=1, valid_turns=0,
                     task_type="pick"),
    ]  # fmt: skip
    infos = {key: [e[key] for e in episodes] for key in episodes[0]}
    infos["reward"] = [9.0, 0.0, 0.0]  # verl's own key, ignored here
    got = validation_metrics(infos, expected=4)
    assert got == {
        "eval/episodes": 4.0, "eval/errored": 2.0, "eval/success": 0.5,
        "eval/score": pytest.approx(0.55), "eval/turns": 4.0, "eval/valid_actions": 7 / 8,
        "eval/success/clean": 0.0, "eval/success/pick": 1.0,
    }  # fmt: skip
    all_errored = validation_metrics({k: v[2:] for k, v in infos.items()})
    assert all_errored == {"eval/episodes": 1.0, "eval/errored": 1.0}


def play(config, server, tokenizer, sessions):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from mcgpo.integrations.verl.agent_loop import McgpoEnvAgentLoop

    async def one(g, s):
        loop = McgpoEnvAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
            processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
        )  # fmt: skip
        kwargs = {"uid": f"uid-{g}", "session_id": s, "index": g, "extra_info": {}}
        return await loop.run({"temperature": 1.0}, **kwargs)

    async def every():
        return dict(zip(sessions, await asyncio.gather(*(one(g, s) for g, s in sessions))))

    return asyncio.run(every())


@pytest.fixture
def errored_episodes(tiny_policy, tmp_path, monkeypatch):
    """{(group, session): outputs} of 2 tasks x N sessions of the faulty household, the
    first sibling of task 0 to take a 2nd step raising there (its trajectory errors)."""
    from mcgpo.integrations.verl import agent_loop

    monkeypatch.syspath_prepend(str(faulty_env.install_entry_point(tmp_path / "site")))
    (tmp_path / "once").mkdir()
    model, tokenizer = tiny_policy
    config = verl_config()
    config.mcgpo.env.update(
        name=faulty_env.NAME, fault="raise", fault_seed=0, fault_turn=2,
        once=str(tmp_path / "once"),
    )  # fmt: skip
    agent_loop._unreported.clear()
    try:
        yield config, play(config, TinyServer(model, tokenizer), tokenizer,
                           [(g, s) for g in range(2) for s in range(N)])  # fmt: skip
    finally:
        for leases in agent_loop._leases.values():
            leases.close()
        agent_loop._leases.clear()
        agent_loop._unreported.clear()


def test_validation_metrics_equal_mcgpos_episode_summary(errored_episodes):
    """verl keeps each episode's final output's reward_extra_info (one list per key); from
    them the plugin's eval/* equal mcgpo's episode_summary of the episodes' StepTable, an
    errored trajectory included."""
    from mcgpo.integrations.verl.batch import step_table
    from mcgpo.integrations.verl.validation import validation_metrics
    from mcgpo.training.evaluate import episode_summary

    _, outs = errored_episodes
    finals = [outputs[-1].extra_fields["reward_extra_info"] for outputs in outs.values()]
    infos = {key: [f[key] for f in finals] for key in finals[0]}
    rows = [o.extra_fields for outputs in outs.values() for o in outputs]
    want = episode_summary(step_table(rows), "eval")
    assert want["eval/errored"] == 1.0 and want["eval/episodes"] == 2 * N
    assert want["eval/valid_actions"] > 0  # the tiny policy writes some valid actions
    got = validation_metrics(infos, expected=2 * N)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key
    # the errored trajectory carries its error for the trainer's warning
    (bad,) = [o for outputs in outs.values() for o in outputs if o.extra_fields["env_error"]]
    assert bad.extra_fields["errored"] and "step turn 2" in bad.extra_fields["env_error"]


def test_the_trainer_adds_eval_metrics_to_verls_and_warns_of_errored_episodes(caplog):
    from mcgpo.integrations.verl.trainer import McgpoTrainer
    from mcgpo.integrations.verl.validation import episode_info

    episodes = [
        episode_info(success=s, score=s, errored=e, turns=2, valid_turns=2, task_type="t")
        for s, e in [(1.0, False), (0.0, False), (0.0, True)]
    ]  # fmt: skip
    infos = {key: [e[key] for e in episodes] for key in episodes[0]}
    infos["reward"] = [10.0, 0.0, 0.0]
    trainer = McgpoTrainer.__new__(McgpoTrainer)
    with caplog.at_level(logging.WARNING):
        out = trainer._val_metrics_update(
            ["src"] * 3, ["a", "b", "c"], infos, [2, 2, 2],
            expected_acc_counts={("src", u): 1 for u in "abc"},
        )  # fmt: skip
    assert out["val-core/src/reward/mean@1"] == pytest.approx(10 / 3)  # verl's own, kept
    assert out["eval/success"] == 0.5 and out["eval/errored"] == 1.0
    assert out["eval/success/t"] == 0.5
    assert "validation: 1 of 3 episodes errored" in caplog.text


def trainer_for(max_failed: int):
    from mcgpo.integrations.verl.trainer import McgpoTrainer

    trainer = McgpoTrainer.__new__(McgpoTrainer)
    trainer.global_steps = 1
    trainer._failed_updates, trainer._max_failed_updates = 0, max_failed
    trainer._first_error = "step turn 2: EnvServerLost: connection refused"
    return trainer


def credit_of(errored: bool):
    from mcgpo.bench.synthetic import synthetic_table
    from mcgpo.integrations.verl.batch import batch_credit
    from mcgpo.training.config import AlgoConfig

    records = synthetic_table(2, 4, 2, n_states=3, n_actions=2, full_length=True, seed=0)
    records = records.to_records()
    if errored:
        for r in records:
            r["errored"] = True
    return batch_credit(records, AlgoConfig(name="grpo"))


def test_an_update_whose_every_trajectory_errored_warns_each_time_and_stops_at_the_limit(caplog):
    from mcgpo.integrations.verl.trainer import credit_metrics

    failed, fine = credit_of(True), credit_of(False)
    metrics = credit_metrics(failed, None, 1, {})
    assert metrics["mcgpo/errored_trajectories"] == metrics["mcgpo/trajectories"] == 8.0
    assert credit_metrics(fine, None, 1, {})["mcgpo/errored_trajectories"] == 0.0
    trainer = trainer_for(3)
    with caplog.at_level(logging.WARNING):
        trainer._count_failed_update(failed, metrics)
        trainer._count_failed_update(fine, {})  # a good update resets the count
        trainer._count_failed_update(failed, metrics)
        trainer._count_failed_update(failed, metrics)
        with pytest.raises(RuntimeError, match=r"^mcgpo: 3 updates in a row had every "
                                               r"trajectory errored .*EnvServerLost.*"
                                               r"trainer.resume_mode=auto"):  # fmt: skip
            trainer._count_failed_update(failed, metrics)
    warnings = [
        r.getMessage() for r in caplog.records if "every trajectory errored" in r.getMessage()
    ]
    assert len(warnings) == 4  # every failed update, each with the first error
    assert all("First error: step turn 2: EnvServerLost" in w for w in warnings)
    assert "(3 in a row)" in warnings[-1] and "(1 in a row)" in warnings[1]
    never = trainer_for(0)  # mcgpo.train.max_failed_updates 0: warn, never stop
    for _ in range(5):
        never._count_failed_update(failed, metrics)
    assert never._failed_updates == 5


def test_an_update_with_nothing_to_learn_takes_no_optimiser_step(monkeypatch):
    """verl would still step AdamW on zero gradients (its weight decay moves the weights);
    mcgpo's own trainer takes no step then, and neither does the plugin's."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    calls = []
    monkeypatch.setattr(PPOTrainerSync, "_update_actor", lambda self, b, m: calls.append(b) or b)
    trainer = trainer_for(3)
    trainer.mcgpo = type("Run", (), {"algo": type("Algo", (), {"name": "grpo"})()})()
    trainer.config = verl_config()
    trainer.config.actor_rollout_ref.actor = {"use_dynamic_bsz": False}
    trainer._learned_rows, metrics = 0, {}
    assert trainer._update_actor("batch", metrics) == "batch" and calls == []
    assert metrics["mcgpo/optimizer_steps"] == 0.0
    trainer._learned_rows = 5
    trainer._update_actor("batch", metrics)
    assert calls == ["batch"]


def test_first_error_skips_padding_and_empty_messages():
    from mcgpo.integrations.verl.batch import first_error

    rows = [{"env_error": ""}, {"env_error": "pad"}, {}, {"env_error": "step turn 1: boom"}]
    assert first_error(rows, [False, True, False, False]) == "step turn 1: boom"
    assert first_error(rows[:3], [False, True, False]) == ""
    assert first_error([]) == ""
