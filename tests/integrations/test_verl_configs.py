"""configs/verl/*.yaml as verl 0.9.1 runs them: composed with verl's own ppo_trainer config
(Hydra, as ``main_ppo`` loads them), validated by verl's own ``validate_config`` with
``need_reference_policy`` / ``need_critic`` as ``main_ppo`` passes them, and accepted by the
plugin; the plugin's check command and its refusals of what it cannot honour."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
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
    # gae without a critic: no values to compute GAE from (was accepted)
    ("algorithm.adv_estimator=gae critic.enable=false", "algorithm.adv_estimator: 'gae' needs"),
    ("+critic.enable=true", "critic.enable"),
    ("algorithm.use_kl_in_reward=true", "algorithm.use_kl_in_reward"),
    ("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.adv_estimator: 'reinforce_plus"),
    ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator: 'rloo' would never run"),
    ("algorithm.norm_adv_by_std_in_grpo=false", "norm_adv_by_std_in_grpo: false is GRPO's"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "rollout_rs"),
    ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode"),
    (
        "algorithm.rollout_correction.rollout_is=token "
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "rollout_is_batch_normalize",
    ),
    (
        "algorithm.rollout_correction.rollout_is=token "
        "actor_rollout_ref.rollout.calculate_log_probs=false",
        "rollout.calculate_log_probs",
    ),
    (
        "algorithm.rollout_correction.rollout_is=sequence "
        "algorithm.rollout_correction.rollout_is_threshold='0.1_2.0'",
        "IcePop bounds [0.1, 2] are not",
    ),
    (
        "algorithm.rollout_correction.rollout_is=token "
        "algorithm.rollout_correction.rollout_is_threshold=1.0",
        "upper bound 1 <= 1",
    ),
    (
        "algorithm.rollout_correction.rollout_is=token "
        "algorithm.rollout_correction.rollout_is_threshold=abc",
        "'abc' is not a number",
    ),
    ("algorithm.rollout_correction.rollout_is=geometric", "rollout_is: 'geometric', want token"),
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
    cfg = compose("alfworld_mcgpo", *override.split(" "))
    with pytest.raises(ConfigError, match=re.escape(key)) as err:
        check_verl_config(cfg, plugin_config(cfg))
    assert "\n" not in str(err.value)


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


def test_verls_advantage_switches_are_honoured_where_they_mean_mcgpos():
    """adv_estimator naming mcgpo's algorithm, and norm_adv_by_std_in_grpo=false with GRPO
    (mcgpo's norm_by_std: false) or RLOO (no SD to divide by), are accepted and used; the
    advantages then are mcgpo's estimator's with those options."""
    import mcgpo
    from mcgpo.bench.synthetic import synthetic_table
    from mcgpo.integrations.verl.batch import batch_credit
    from mcgpo.integrations.verl.config import check_verl_config, plugin_config

    table = synthetic_table(2, 8, 3, n_states=3, n_actions=2, full_length=True, seed=0)
    cases = [
        (("mcgpo.algo.name=rloo", "algorithm.adv_estimator=rloo"), "rloo", {}),
        (("mcgpo.algo.name=rloo", "algorithm.norm_adv_by_std_in_grpo=false"), "rloo", {}),
        (("mcgpo.algo.name=grpo", "algorithm.adv_estimator=grpo"), "grpo", {}),
        (("mcgpo.algo.name=grpo", "algorithm.norm_adv_by_std_in_grpo=false"), "grpo",
         {"norm_by_std": False}),
        (("mcgpo.algo.name=grpo", "+mcgpo.algo.norm_by_std=false",
          "algorithm.norm_adv_by_std_in_grpo=false"), "grpo", {"norm_by_std": False}),
    ]  # fmt: skip
    for overrides, name, options in cases:
        cfg = compose("alfworld_graphgpo", *overrides)
        run = plugin_config(cfg)
        check_verl_config(cfg, run)
        assert run.algo.name == name
        for key, value in options.items():
            assert run.algo.estimator[key] == value
        got = batch_credit(table.to_records(), run.algo).advantages
        expected, _ = mcgpo.estimate(name, table, **options)
        np.testing.assert_array_equal(got, np.asarray(expected, np.float32))
    # the switch changes GRPO's advantages (a test that could not tell would pass anyway)
    std, _ = mcgpo.estimate("grpo", table)
    assert not np.allclose(std, mcgpo.estimate("grpo", table, norm_by_std=False)[0])


def test_grpo_std_switch_against_an_explicit_mcgpo_option_is_refused():
    from mcgpo.integrations.verl.config import plugin_config
    from mcgpo.training.config import ConfigError

    cfg = compose("alfworld_graphgpo", "mcgpo.algo.name=grpo", "+mcgpo.algo.norm_by_std=true",
                  "algorithm.norm_adv_by_std_in_grpo=false")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^algorithm.norm_adv_by_std_in_grpo: false "
                                          r"contradicts mcgpo.algo.norm_by_std: True"):  # fmt: skip
        plugin_config(cfg)


# The *-paper preset's value of each setting and where the verl config holds it. Not
# compared: train.logits_chunk (mcgpo's LM-head chunking, memory only: verl has its own),
# eval.tasks / eval.split (the validation parquet's rows, docs/integrations/verl.md "Data"),
# rollout.groups x group_size at validation (verl validates each task once, val_kwargs.n 1).
PRESET_KEYS = {
    ("rollout", "groups"): "data.train_batch_size",
    ("rollout", "group_size"): "actor_rollout_ref.rollout.n",
    ("rollout", "temperature"): "actor_rollout_ref.rollout.temperature",
    ("rollout", "max_new_tokens"): "data.max_response_length",
    ("rollout", "max_prompt_tokens"): "data.max_prompt_length",
    ("rollout", "history"): "mcgpo.rollout.history",
    ("rollout", "response_format"): "mcgpo.rollout.response_format",
    ("env", "name"): "mcgpo.env.name",
    ("env", "max_turns"): "mcgpo.env.max_turns",
    ("train", "updates"): "trainer.total_training_steps",
    ("train", "lr"): "actor_rollout_ref.actor.optim.lr",
    ("train", "weight_decay"): "actor_rollout_ref.actor.optim.weight_decay",
    ("train", "kl_coef"): "actor_rollout_ref.actor.kl_loss_coef",
    ("train", "kl_kind"): "actor_rollout_ref.actor.kl_loss_type",
    ("train", "clip"): "actor_rollout_ref.actor.clip_ratio",
    ("train", "dual_clip"): "actor_rollout_ref.actor.clip_ratio_c",
    ("train", "entropy_coef"): "actor_rollout_ref.actor.entropy_coeff",
    ("train", "grad_clip"): "actor_rollout_ref.actor.grad_clip",
    ("train", "ppo_epochs"): "actor_rollout_ref.actor.ppo_epochs",
    ("train", "micro_batch_size"): "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    ("train", "gradient_checkpointing"): "actor_rollout_ref.model.enable_gradient_checkpointing",
    ("train", "save_every"): "trainer.save_freq",
    ("eval", "every"): "trainer.test_freq",
    ("eval", "temperature"): "actor_rollout_ref.rollout.val_kwargs.temperature",
}
# Where a config may differ from its preset, and why (said in the config and the docs).
PRESET_EXCEPTIONS = {
    # verl requires ppo_mini_batch_size (prompts) <= train_batch_size: 16 x 8 = 128 rows
    ("alfworld", "train", "mini_batch_size"): 128,
}


@pytest.mark.parametrize("name", [n for n in NAMES if n.split("_")[1] in ("mcgpo", "graphgpo")])
def test_config_equals_its_paper_preset(name):
    """Each example equals src/mcgpo/presets/<env>-paper.toml setting by setting, except
    where PRESET_EXCEPTIONS says why; the estimator's omega is the resolved one."""
    from omegaconf import OmegaConf

    from mcgpo.integrations.verl.config import plugin_config
    from mcgpo.training.presets import load_preset

    env = name.split("_")[0]
    preset = load_preset(f"{env}-paper")
    cfg = compose(name)
    for (section, key), where in PRESET_KEYS.items():
        got = OmegaConf.select(cfg, where)
        assert got == preset[section][key], f"{where} = {got!r}, {env}-paper {section}.{key}"
    arr = cfg.actor_rollout_ref
    rows = arr.actor.ppo_mini_batch_size * arr.rollout.n
    want = PRESET_EXCEPTIONS.get(
        (env, "train", "mini_batch_size"), preset["train"]["mini_batch_size"]
    )
    assert rows == want
    assert arr.rollout.val_kwargs.do_sample is True  # T = 0.4 means sampling
    run = plugin_config(cfg)
    assert run.algo.estimator["omega"] == preset["algo"]["graphgpo"]["omega"]
    assert run.env.name == preset["env"]["name"]


def test_check_command_prints_one_line(capsys):
    from mcgpo.integrations.verl.check import main

    assert main(["--config-path", str(CONFIGS), "--config-name", "webshop_mcgpo"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("ok: mcgpo lambda_pair=10 on webshop, 16 tasks x 8 rollouts")
    assert "64 step rows, 2 GPUs, rollout vllm" in out
    assert out.endswith("no critic, rollout correction tis token cap 2")
    extra = ["algorithm.rollout_correction.rollout_is=sequence",
             "algorithm.rollout_correction.rollout_is_threshold='0.5_2.0'"]  # fmt: skip
    assert main(["--config-path", str(CONFIGS), "--config-name", "webshop_mcgpo", *extra]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.endswith("no critic, rollout correction mis sequence cap 2")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config-name", "alfworld_mcgpo", "actor_rollout_ref.actor.shuffle=true"],
         "error: actor_rollout_ref.actor.shuffle: true shuffles rows"),
        (["--config-name", "alfworld_mcgpo", "actor_rollout_ref.actor.ppo_mini_batch_size=32"],
         "error: ValueError:"),
        (["--config-name", "nope"], "error: --config-name: no nope.yaml"),
        (["--config-name", "alfworld_mcgpo", "trainer.v1.trainer_mode=ppo"],
         "error: trainer.v1.trainer_mode: 'ppo' is not the plugin's trainer"),
        (["--config-name", "alfworld_mcgpo", "+mcgpo.algo.bogus=1"], "error: unknown option --algo.bogus"),
        (["--config-name", "alfworld_mcgpo", "no_such_key=1"], "error: "),
    ],
)  # fmt: skip
def test_check_command_bad_input_is_one_line_and_exit_2(capsys, args, message):
    from mcgpo.integrations.verl.check import main

    assert main(["--config-path", str(CONFIGS), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err and "Traceback" not in err


def test_examples_carry_the_rollout_correction_mcgpos_rule_picks_for_vllm():
    """mcgpo's own trainer with a vLLM sampler resolves train.rollout_correction auto to tis
    (per token, cap 2); every example (vLLM or SGLang: both sample with other kernels and
    bf16) sets verl's equivalent, and still passes verl's validation (the test above)."""
    from mcgpo.integrations.verl.config import RolloutCorrection, rollout_correction
    from mcgpo.training.config import TrainConfig

    train = TrainConfig()
    want = RolloutCorrection(
        train.correction("vllm"), train.rollout_correction_level, train.rollout_correction_cap
    )
    assert want == RolloutCorrection("tis", "token", 2.0)
    for name in NAMES:
        cfg = compose(name)
        assert rollout_correction(cfg) == want, name
        assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True


ROLLOUT_KEYS = [
    ("max_prompt_tokens=1024", "data.max_prompt_length"),
    ("max_new_tokens=64", "data.max_response_length"),
    ("temperature=0.7", "actor_rollout_ref.rollout.temperature"),
    ("groups=4", "data.train_batch_size"),
    ("group_size=4", "actor_rollout_ref.rollout.n"),
    ("engine=vllm", "actor_rollout_ref.rollout.name"),
]


@pytest.mark.parametrize(("override", "verl_key"), ROLLOUT_KEYS)
def test_mcgpo_rollout_keys_verl_governs_are_refused_naming_verls_key(override, verl_key):
    """Only mcgpo.rollout.history and response_format are the plugin's; the others were
    silently replaced by verl's values."""
    from mcgpo.integrations.verl.config import plugin_config
    from mcgpo.training.config import ConfigError

    key = override.split("=")[0]
    cfg = compose("webshop_mcgpo", f"+mcgpo.rollout.{override}")
    with pytest.raises(ConfigError, match=rf"^mcgpo.rollout.{key}: verl sets this") as err:
        plugin_config(cfg)
    assert f"set {verl_key}" in str(err.value)
    plugin_config(compose("webshop_mcgpo", "mcgpo.rollout.history=1"))  # the plugin's own


def test_mcgpo_train_takes_only_max_failed_updates():
    from mcgpo.integrations.verl.config import max_failed_updates, plugin_config
    from mcgpo.training.config import ConfigError

    assert max_failed_updates(compose("webshop_mcgpo")) == 3  # mcgpo's own default
    assert max_failed_updates(compose("webshop_mcgpo", "+mcgpo.train.max_failed_updates=0")) == 0
    for bad, match in [("+mcgpo.train.max_failed_updates=-1", "want an integer >= 0"),
                       ("+mcgpo.train.lr=0.1", "^mcgpo.train.lr: verl's actor config")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            plugin_config(compose("webshop_mcgpo", bad))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("+mcgpo.env.no_such_option=1", "error: mcgpo.env 'webshop': "),
        ("mcgpo.env.name=no_such_env", "error: mcgpo.env 'no_such_env': unknown environment"),
    ],
)
def test_bad_environment_options_fail_the_check_in_one_line(capsys, override, message):
    """The check builds one environment with mcgpo.env's options, as mcgpo's own trainer
    does at set-up (before: accepted, and every agent-loop session failed on them)."""
    from mcgpo.integrations.verl.check import main

    assert main(["--config-path", str(CONFIGS), "--config-name", "webshop_mcgpo", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err, err
    if "no_such_option" in override:
        assert "no_such_option" in err


def test_bad_environment_options_stop_the_trainer_at_start_up():
    from mcgpo.integrations.verl.trainer import McgpoTrainer
    from mcgpo.training.config import ConfigError

    cfg = compose("webshop_mcgpo", "+mcgpo.env.no_such_option=1")
    with pytest.raises(ConfigError, match=r"^mcgpo.env 'webshop': .*no_such_option"):
        McgpoTrainer(cfg)
