"""configs/verl/*.yaml as verl 0.9.1 runs them: composed with verl's own ppo_trainer config
(Hydra, as ``main_ppo`` loads them), validated by verl's own ``validate_config`` with
``need_reference_policy`` / ``need_critic`` as ``main_ppo`` passes them, and accepted by the
plugin; the plugin's check command and its refusals of what it cannot honour."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"
NAMES = sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def compose(name: str, *overrides: str):
    from mcgpo.integrations.verl.check import compose_config

    return compose_config(str(CONFIGS), name, overrides)


def test_every_example_is_tested():
    assert {"alfworld_mcgpo", "alfworld_graphgpo", "webshop_mcgpo", "webshop_graphgpo"} <= set(
        NAMES
    )


@pytest.mark.parametrize("name", NAMES)
def test_config_passes_verls_validation_as_main_ppo_runs_it(name):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from mcgpo.integrations.verl.config import check_verl_config, plugin_config

    cfg = compose(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        critic, ref = need_critic(cfg), need_reference_policy(cfg)
    assert critic is False and ref is True  # no critic is built; the KL loss needs the ref
    validate_config(config=cfg, use_reference_policy=ref, use_critic=critic)  # raises if bad
    assert cfg.trainer.v1.trainer_mode == "mcgpo" and cfg.trainer.use_v1
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mcgpo_env"
    assert cfg.actor_rollout_ref.actor.shuffle is False
    arr = cfg.actor_rollout_ref
    assert arr.actor.ppo_mini_batch_size <= cfg.data.train_batch_size
    assert arr.rollout.prompt_length == cfg.data.max_prompt_length
    run = plugin_config(cfg)
    check_verl_config(cfg, run)
    env, algo = name.split("_")[:2]
    assert (run.env.name, run.algo.name) == (env, algo)
    assert arr.rollout.name == ("sglang" if name.endswith("sglang") else "vllm")
    assert run.algo.pairs.get("group_size") == (8 if algo == "mcgpo" else None)
    # mini-batches in step rows as the paper presets have them (alfworld: verl caps the
    # mini-batch at train_batch_size prompts, so 128 rows, not the preset's 256)
    rows = arr.actor.ppo_mini_batch_size * arr.rollout.n
    assert rows == {"alfworld": 128, "webshop": 64}[env]


def test_the_old_configs_failure_is_what_verl_reports():
    """What the examples did before: a mini-batch larger than the batch fails verl's own
    validation (so the test above would catch a regression)."""
    from verl.utils.config import validate_config

    cfg = compose("alfworld_mcgpo", "actor_rollout_ref.actor.ppo_mini_batch_size=32")
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        validate_config(config=cfg, use_reference_policy=True, use_critic=False)
    cfg = compose("alfworld_mcgpo", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")
    with pytest.raises(ValueError, match="log_prob_micro_batch_size"):
        validate_config(config=cfg, use_reference_policy=True, use_critic=False)


REFUSED = [
    ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
    ("+critic.enable=true", "critic.enable"),
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward"),
    ("algorithm.rollout_correction.rollout_is=token", "rollout_is"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "rollout_rs"),
    ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode"),
    ("algorithm.filter_groups.enable=true", "filter_groups"),
    ("reward.reward_model.enable=true", "reward_model.enable"),
    ("custom_reward_function.path=/tmp/r.py", "custom_reward_function.path"),
    ("distillation.enabled=true", "distillation.enabled"),
    ("actor_rollout_ref.actor.shuffle=true", "actor.shuffle"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3", "ppo_micro_batch_size_per_gpu"),
    ("trainer.n_gpus_per_node=3", "ppo_mini_batch_size"),
]


@pytest.mark.parametrize(("override", "key"), REFUSED)
def test_settings_the_plugin_cannot_honour_are_refused(override, key):
    from mcgpo.integrations.verl.config import check_verl_config, plugin_config
    from mcgpo.training.config import ConfigError

    if override.startswith("+critic"):  # critic.enable exists (null): set it
        override = override[1:]
    cfg = compose("alfworld_mcgpo", override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_verl_config(cfg, plugin_config(cfg))


def test_pair_settings_are_free_without_the_pair_loss():
    """Shuffling and odd micro-batches split pairs only when there is a pair loss."""
    from mcgpo.integrations.verl.config import check_verl_config, plugin_config

    for name, extra in [
        ("alfworld_graphgpo", ()),
        ("alfworld_mcgpo", ("mcgpo.algo.lambda_pair=0",)),
    ]:
        cfg = compose(
            name, "actor_rollout_ref.actor.shuffle=true",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3", *extra,
        )  # fmt: skip
        check_verl_config(cfg, plugin_config(cfg))


def test_check_command_prints_one_line(capsys):
    from mcgpo.integrations.verl.check import main

    assert main(["--config-path", str(CONFIGS), "--config-name", "webshop_mcgpo"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("ok: mcgpo lambda_pair=1 on webshop, 16 tasks x 8 rollouts")
    assert "64 step rows, 2 GPUs, rollout vllm" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config-name", "alfworld_mcgpo", "actor_rollout_ref.actor.shuffle=true"],
         "error: actor_rollout_ref.actor.shuffle: true shuffles rows"),
        (["--config-name", "alfworld_mcgpo", "actor_rollout_ref.actor.ppo_mini_batch_size=32"],
         "error: ValueError:"),
        (["--config-name", "nope"], "error: --config-name: no nope.yaml"),
        (["--config-name", "alfworld_mcgpo", "trainer.v1.trainer_mode=ppo"],
         "error: trainer.v1.trainer_mode: 'ppo', not 'mcgpo'"),
        (["--config-name", "alfworld_mcgpo", "+mcgpo.algo.bogus=1"], "error: unknown option --algo.bogus"),
        (["--config-name", "alfworld_mcgpo", "no_such_key=1"], "error: "),
    ],
)  # fmt: skip
def test_check_command_bad_input_is_one_line_and_exit_2(capsys, args, message):
    from mcgpo.integrations.verl.check import main

    assert main(["--config-path", str(CONFIGS), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err and "Traceback" not in err
