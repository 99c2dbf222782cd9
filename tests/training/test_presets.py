"""The paper presets hold MCGPO's training recipe (seed 000 "How to use it") and GraphGPO's
distance discount per environment; the Qwen3 variant differs from webshop-paper only in the
response format."""

from __future__ import annotations

import dataclasses
from importlib import resources

import pytest

from mcgpo.training.algorithms import resolve_algo
from mcgpo.training.config import RunConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.presets import load_preset, preset_command

PAPER_PRESETS = {  # name -> (environment, turns, response format)
    "alfworld-paper": ("alfworld", 50, "think"),
    "webshop-paper": ("webshop", 15, "think"),
    "webshop-paper-qwen3": ("webshop", 15, "action"),
}


def preset_text(name: str) -> str:
    return (resources.files("mcgpo") / "presets" / f"{name}.toml").read_text(encoding="utf-8")


def preset(name: str) -> RunConfig:
    cfg = from_dict(load_preset(name), where=name)
    cfg.check()
    return cfg


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_paper_presets_hold_mcgpos_recipe(name):
    env, turns, response_format = PAPER_PRESETS[name]
    cfg = preset(name)
    # 16 task groups x 8 rollouts; 250 updates; temperature 1.0; lr 1e-6 constant (the RL
    # optimiser has no schedule); weight decay 0.01; KL 0.01; 512 response tokens; history 2
    assert (cfg.rollout.groups, cfg.rollout.group_size, cfg.train.updates) == (16, 8, 250)
    assert (cfg.rollout.temperature, cfg.train.lr, cfg.train.weight_decay) == (1.0, 1e-6, 0.01)
    assert (cfg.train.kl_coef, cfg.rollout.max_new_tokens, cfg.rollout.history) == (0.01, 512, 2)
    assert (cfg.env.name, cfg.env.max_turns, cfg.rollout.response_format) == (
        env,
        turns,
        response_format,
    )
    assert cfg.algo.name == "mcgpo" and cfg.device == "cuda"
    # evaluation as verl-agent runs it: 128 held-out tasks of valid_seen at T = 0.4
    assert (cfg.eval.tasks, cfg.eval.split, cfg.eval.temperature) == (128, "valid_seen", 0.4)
    assert name in preset_command(name)


@pytest.mark.parametrize(("name", "omega"), [("alfworld-paper", 0.10), ("webshop-paper", 0.20)])
def test_graphgpo_distance_discount_is_the_environments_and_both_arms_get_it(name, omega):
    cfg = preset(name)
    for algo in ("mcgpo", "graphgpo", "graphgpo_shaping"):  # the arms `mcgpo bench` compares
        resolved = resolve_algo(dataclasses.replace(cfg.algo, name=algo), cfg.rollout.group_size)
        assert resolved.estimator["omega"] == omega, algo


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_every_method_of_a_bench_runs_from_the_paper_presets(name):
    """omega sits in [algo.graphgpo]: GraphGPO's arms get it, the others run without it."""
    cfg = preset(name)
    assert "omega" not in cfg.algo.estimator and "omega" in cfg.algo.per_estimator["graphgpo"]
    for algo in ("grpo", "rloo", "gigpo", "hgpo", "progpo", "progress_gpo"):
        resolved = resolve_algo(dataclasses.replace(cfg.algo, name=algo), 8)
        assert "omega" not in resolved.estimator, algo


def test_qwen3_variant_is_webshop_paper_with_action_only_responses():
    qwen3, qwen25 = preset("webshop-paper-qwen3"), preset("webshop-paper")
    same = dataclasses.replace(
        qwen3, rollout=dataclasses.replace(qwen3.rollout, response_format="think")
    )
    assert same == qwen25
    # the comment says how thinking is switched off (the prompt layer, by response format)
    comment = preset_text("webshop-paper-qwen3")
    assert "enable_thinking=False" in comment and "done by the prompt layer" in comment


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_paper_preset_comments_name_the_sources(name):
    comment = preset_text(name)
    assert "seed 000" in comment
    if name != "webshop-paper-qwen3":  # the variant points to webshop-paper for the sources
        for source in ("MCGPO", "GraphGPO", "verl-agent", "ours", "valid_seen"):
            assert source in comment, source


def _flat(value, prefix=""):
    """{dotted key: leaf} of a nested dict (a config's dataclasses.asdict)."""
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out.update(_flat(inner, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def test_household_mid_is_household_quick_with_the_changes_its_comment_names():
    """issue 25's preset (MCGPO's regime) changes exactly what its comment says: no
    distractors, four task types, 25 turns, 12 SFT epochs; everything else is
    household-quick's, so the two compare."""
    quick = _flat(dataclasses.asdict(preset("household-quick")))
    mid = _flat(dataclasses.asdict(preset("household-mid")))
    changed = {k for k in quick.keys() | mid.keys() if quick.get(k) != mid.get(k)}
    assert changed == {
        "env.max_turns", "env.options.n_distractors", "env.options.task_types",
        "sft.epochs",
    }  # fmt: skip
    assert (mid["env.max_turns"], mid["env.options.n_distractors"], mid["sft.epochs"]) == (
        25, 0, 12,
    )  # fmt: skip
    assert sorted(mid["env.options.task_types"]) == [
        "look_at_obj_in_light", "pick_and_place_simple", "pick_cool_then_place_in_recep",
        "pick_heat_then_place_in_recep",
    ]  # fmt: skip
