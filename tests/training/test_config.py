"""Config dataclasses, presets and the TOML round trip."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.training.algorithms import ALGORITHMS, resolve_algo
from mcgpo.training.config import AlgoConfig, ConfigError, RunConfig, TrainConfig
from mcgpo.training.config_layout import coerce, flatten, from_dict, parse_scalar
from mcgpo.training.presets import (
    available_presets,
    load_preset,
    parse_toml,
    preset_command,
    to_toml,
)


def test_defaults_are_the_papers_recipe():
    # reference/algorithms.md 1.4: 16 x 8, lr 1e-6, KL 0.01 low_var_kl, clip 0.2, dual clip 3,
    # entropy 0.001, grad clip 1.0, 150 iterations, 512 response tokens, history 2, T_eval 0.4.
    cfg = RunConfig()
    cfg.check()
    assert (cfg.rollout.groups, cfg.rollout.group_size) == (16, 8)
    assert (cfg.train.lr, cfg.train.kl_coef, cfg.train.kl_kind) == (1e-6, 0.01, "low_var_kl")
    assert (cfg.train.clip, cfg.train.dual_clip, cfg.train.entropy_coef) == (0.2, 3.0, 0.001)
    assert (cfg.train.grad_clip, cfg.train.weight_decay, cfg.train.updates) == (1.0, 0.01, 150)
    assert (cfg.rollout.max_new_tokens, cfg.rollout.history) == (512, 2)
    assert cfg.eval.temperature == 0.4
    assert (cfg.algo.name, cfg.algo.lambda_pair) == ("mcgpo", 10.0)  # docs/algorithms/mcgpo.md


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig().train.lr = 1.0  # type: ignore[misc]


def test_from_dict_applies_nested_values_and_estimator_options():
    cfg = from_dict(
        {
            "seed": 3,
            "train": {"lr": 1e-4, "updates": 2},
            "algo": {"name": "gigpo", "gamma": 0.9, "pairs": {"kappa": 2.0}},
        }
    )
    assert cfg.seed == 3 and cfg.train.lr == 1e-4 and cfg.train.updates == 2
    assert cfg.algo.name == "gigpo"
    assert dict(cfg.algo.estimator) == {"gamma": 0.9}
    assert dict(cfg.algo.pairs) == {"kappa": 2.0}
    # untouched sections keep their defaults
    assert cfg.rollout == RunConfig().rollout


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"lr": 1.0}, "unknown key 'lr'"),
        ({"train": {"lrr": 1.0}}, "unknown key 'train.lrr' (did you mean 'train.lr'?)"),
        ({"train": 3}, "train must be a table"),
        ({"train": {"lr": "fast"}}, "train.lr: expected a number, got 'fast'"),
        ({"train": {"updates": 1.5}}, "train.updates: expected an integer, got 1.5"),
        ({"resume": "maybe"}, "resume: expected true or false, got 'maybe'"),
        ({"env": {"name": 3}}, "env.name: expected a string, got 3"),
        (
            {"train": {"nested": {"x": 1}}},
            "unknown key 'train.nested' (did you mean 'train.updates'?)",  # difflib's closest
        ),
    ],
)
def test_from_dict_rejects_unknown_keys_and_bad_values(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(data, where="preset x")
    assert str(err.value) == f"preset x: {message}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train": {"lr": 0.0}}, "train.lr must be > 0, got 0.0"),
        ({"train": {"dual_clip": 0.5}}, "train.dual_clip must be 0 (off) or > 1, got 0.5"),
        ({"train": {"kl_kind": "k9"}}, "train.kl_kind must be one of"),
        ({"rollout": {"group_size": 0}}, "rollout.group_size must be >= 1, got 0"),
        ({"rollout": {"temperature": -1}}, "rollout.temperature must be > 0 (at 0 the N"),
        ({"rollout": {"temperature": 0}}, "siblings of a task act alike), got 0.0"),
        ({"eval": {"temperature": -0.1}}, "eval.temperature must be >= 0.0, got -0.1"),
        ({"eval": {"every": -1}}, "eval.every must be >= 0, got -1"),
        ({"train": {"max_failed_updates": 0}}, "train.max_failed_updates must be >= 1, got 0"),
        ({"device": "tpu"}, "device must be cpu or cuda[:N], got 'tpu'"),
    ],
)
def test_check_names_the_bad_key(change, message):
    cfg = from_dict(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        cfg.check()


def test_coerce_and_parse_scalar():
    assert parse_scalar("true") is True and parse_scalar("False") is False
    assert parse_scalar("3") == 3 and parse_scalar("1e-4") == 1e-4 and parse_scalar("x") == "x"
    assert coerce("k", "2", float) == 2.0 and isinstance(coerce("k", "2", float), float)
    assert coerce("k", "abc", str) == "abc"
    with pytest.raises(ConfigError, match="k: expected a finite number"):
        coerce("k", "nan", float)


def test_environment_options_are_kept_flat_in_the_env_section():
    cfg = from_dict({"env": {"name": "household", "n_receptacles": 12, "task_types": ["a"]}})
    assert dict(cfg.env.options) == {"n_receptacles": 12, "task_types": ["a"]}
    assert flatten(cfg)["env.n_receptacles"] == 12
    back = from_dict(parse_toml(to_toml(cfg)))
    assert back == cfg
    with pytest.raises(ConfigError, match=re.escape("unknown key 'env.sub'")):
        from_dict({"env": {"sub": {"x": 1}}})


def test_toml_round_trip_of_the_resolved_config():
    cfg = resolve_run(from_dict({"algo": {"name": "mcgpo", "omega": 0.3}}))
    text = to_toml(cfg, "mcgpo train --algo.omega 0.3")
    assert text.splitlines()[0] == "# mcgpo train --algo.omega 0.3"
    back = from_dict(parse_toml(text))
    assert flatten(back) == {k: v for k, v in flatten(cfg).items() if v is not None}
    assert back.algo.estimator["omega"] == 0.3


def resolve_run(cfg: RunConfig) -> RunConfig:
    return dataclasses.replace(cfg, algo=resolve_algo(cfg.algo, cfg.rollout.group_size))


@settings(max_examples=60, deadline=None)
@given(
    lr=st.floats(1e-8, 1.0),
    updates=st.integers(0, 10_000),
    name=st.sampled_from(sorted(ALGORITHMS)),
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
    flag=st.booleans(),
)
def test_toml_round_trip_property(lr, updates, name, text, flag):
    cfg = from_dict(
        {
            "out": text or "x",
            "save_rollouts": flag,
            "train": {"lr": lr, "updates": updates},
            "algo": {"name": name},
        }
    )
    back = from_dict(parse_toml(to_toml(cfg)))
    assert back == cfg


def test_every_shipped_preset_loads_checks_and_names_its_command():
    names = available_presets()
    assert {
        "household-quick",
        "webshop-quick",
        "alfworld-paper",
        "webshop-paper",
        "webshop-paper-qwen3",
    } <= set(names)
    for name in names:
        cfg = from_dict(load_preset(name), where=name)
        cfg.check()
        resolve_algo(cfg.algo, cfg.rollout.group_size)
        command = preset_command(name)
        assert command.startswith("mcgpo "), name
        assert name in command, name


def test_paper_presets_follow_the_paper_recipe():
    # MCGPO's recipe (seed 000, "How to use it"; issue 13 moved it from GiGPO's 150): 16 x 8,
    # 250 updates, lr 1e-6, KL 0.01, 512 response tokens, history 2, 50 / 15 turns.
    for name, turns in (("alfworld-paper", 50), ("webshop-paper", 15)):
        cfg = from_dict(load_preset(name))
        assert (cfg.rollout.groups, cfg.rollout.group_size, cfg.train.updates) == (16, 8, 250)
        assert (cfg.train.lr, cfg.train.kl_coef, cfg.rollout.max_new_tokens) == (1e-6, 0.01, 512)
        assert (cfg.rollout.history, cfg.env.max_turns) == (2, turns)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'; known: .*household-quick"):
        load_preset("nope")


def test_resolve_algo_fills_defaults_and_checks_options():
    algo = resolve_algo(AlgoConfig(name="grpo", estimator={"norm_by_std": "false"}), 8)
    assert algo.estimator["norm_by_std"] is False  # a command-line string, coerced
    assert algo.estimator["invalid_penalty"] == 0.1  # the estimator's own default
    assert algo.pairs == {}
    mc = resolve_algo(AlgoConfig(name="mcgpo", pairs={"kappa": "2"}), 6)
    assert mc.pairs["kappa"] == 2.0 and mc.pairs["group_size"] == 6
    with pytest.raises(
        ConfigError, match=r"unknown algorithm 'ppo' \(did you mean 'progpo'\?\); known: "
    ):
        resolve_algo(AlgoConfig(name="ppo"), 8)
    with pytest.raises(ConfigError, match=r"unknown option --algo.omega for grpo; options: "):
        resolve_algo(AlgoConfig(name="grpo", estimator={"omega": 1}), 8)
    with pytest.raises(ConfigError, match=r"--algo.pairs.\* options apply only to mcgpo"):
        resolve_algo(AlgoConfig(name="grpo", pairs={"kappa": 1}), 8)
    with pytest.raises(ConfigError, match=re.escape("--algo.norm_by_std: expected true or false")):
        resolve_algo(AlgoConfig(name="grpo", estimator={"norm_by_std": "3"}), 8)


def test_estimator_tables_apply_to_the_algorithms_that_run_that_estimator():
    """[algo.graphgpo] omega = 0.2: graphgpo, mcgpo and graphgpo_shaping get it (they run
    GraphGPO's estimator), GRPO runs without it; a flat --algo.omega wins over the table."""
    cfg = from_dict({"algo": {"graphgpo": {"omega": 0.2}, "gigpo": {"gamma": 0.7}}})
    assert cfg.algo.per_estimator == {"graphgpo": {"omega": 0.2}, "gigpo": {"gamma": 0.7}}
    for name in ("graphgpo", "mcgpo", "graphgpo_shaping"):
        algo = resolve_algo(dataclasses.replace(cfg.algo, name=name), 8)
        assert algo.estimator["omega"] == 0.2, name
    assert "omega" not in resolve_algo(dataclasses.replace(cfg.algo, name="grpo"), 8).estimator
    gigpo = resolve_algo(dataclasses.replace(cfg.algo, name="gigpo"), 8).estimator
    assert gigpo["gamma"] == 0.7 and "omega" not in gigpo
    flat = from_dict({"algo": {"name": "mcgpo", "omega": 0.3}}, cfg)
    assert resolve_algo(flat.algo, 8).estimator["omega"] == 0.3
    # every table is checked, also one the chosen algorithm does not use
    with pytest.raises(ConfigError, match=r"unknown option --algo.gigpo.kappa for gigpo"):
        resolve_algo(AlgoConfig(name="grpo", per_estimator={"gigpo": {"kappa": 1}}), 8)
    with pytest.raises(ConfigError, match=r"unknown estimator table \[algo.ppo\]; estimators:"):
        resolve_algo(AlgoConfig(name="grpo", per_estimator={"ppo": {"omega": 1}}), 8)
    with pytest.raises(ConfigError, match=re.escape("--algo.graphgpo.omega")):
        resolve_algo(AlgoConfig(name="grpo", per_estimator={"graphgpo": {"omega": "x"}}), 8)


def test_estimator_tables_from_the_command_line_and_through_config_toml():
    from mcgpo.cli import resolve

    cfg = resolve("train", ["--algo.name", "grpo", "--algo.graphgpo.omega", "0.25"])
    assert cfg.algo.per_estimator == {"graphgpo": {"omega": "0.25"}}
    text = to_toml(resolve_run(cfg))  # the run folder's config.toml of a GRPO run
    assert "[algo.graphgpo]" in text
    back = from_dict(parse_toml(text))
    assert back.algo.per_estimator == {"graphgpo": {"omega": "0.25"}}
    assert "omega" not in back.algo.estimator  # GRPO's resolved options: no omega
    as_mcgpo = resolve_algo(dataclasses.replace(back.algo, name="mcgpo", estimator={}), 8)
    assert as_mcgpo.estimator["omega"] == 0.25


def test_train_config_fields_all_have_help():
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata.get("help"), f.name


def test_shared_values_come_from_their_one_definition():
    # the KL kinds are defined beside their estimators (mcgpo.objectives) and the shaping
    # coefficient in mcgpo.shaping; the config checks against / defaults to those objects
    from mcgpo import objectives, shaping

    for kind in objectives.KL_KINDS:
        TrainConfig(kl_kind=kind).check()
    with pytest.raises(ConfigError, match=", ".join(objectives.KL_KINDS)):
        TrainConfig(kl_kind="k9").check()
    assert AlgoConfig().shaping_coef == shaping.SHAPING_COEF


def test_resolve_algo_fills_every_default_from_the_options_classes():
    from mcgpo.training.algorithms import algorithm_options

    for name in ALGORITHMS:
        estimator_cls, pairs_cls = algorithm_options(name)
        algo = resolve_algo(AlgoConfig(name=name), 8)
        assert algo.estimator == estimator_cls().as_dict(), name
        want_pairs = pairs_cls(group_size=8).as_dict() if pairs_cls else {}
        assert algo.pairs == want_pairs, name


@pytest.mark.parametrize(
    ("algo", "message"),
    [
        (
            AlgoConfig(name="gigpo", estimator={"mode": "std"}),
            "gigpo: mode must be one of mean_norm, mean_std_norm, got 'std'",
        ),
        (
            AlgoConfig(name="graphgpo", estimator={"omega": "1.5"}),
            "graphgpo: option 'omega' must be in (0, 1), got 1.5",
        ),
        (
            AlgoConfig(name="progress_gpo", estimator={"base_options": {"omega": 0.2}}),
            "progress_gpo: unknown base option 'omega' for base 'grpo'; options: ",
        ),
        (
            AlgoConfig(name="mcgpo", pairs={"epsilon": "lots"}),
            "--algo.pairs.epsilon: expected a number, got 'lots'",
        ),
        (
            AlgoConfig(name="mcgpo", pairs={"group_size": "4"}),
            "--algo.pairs.group_size 4 differs from rollout.group_size 8",
        ),
        (AlgoConfig(name="mcgpo"), "build_preferences: 'group_size' must be an even integer >= 2"),
    ],
)
def test_resolve_algo_bad_values_are_one_line_config_errors(algo, message):
    group_size = 7 if not algo.pairs and algo.name == "mcgpo" else 8
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        resolve_algo(algo, group_size)
    assert "\n" not in str(err.value)


def test_resolve_algo_reads_strings_by_the_option_type():
    mc = resolve_algo(
        AlgoConfig(name="mcgpo", pairs={"max_per_fold": "none", "fold_split": "2"}), 8
    )
    assert mc.pairs["max_per_fold"] is None and mc.pairs["fold_split"] == 2
    gi = resolve_algo(AlgoConfig(name="gigpo", estimator={"similarity": "true", "gamma": "1"}), 8)
    assert gi.estimator["similarity"] is True and gi.estimator["gamma"] == 1.0
    assert isinstance(gi.estimator["gamma"], float)
