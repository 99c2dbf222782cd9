"""configs/verl/*_lora.yaml and configs/verl/lora/adapters.yaml: verl 0.9.1's own LoRA
settings on the examples. tests/integrations/test_verl_configs.py already composes every
example (these included) and runs verl's validate_config and the plugin's check on it; here:
the LoRA settings themselves, that verl then takes the reference from the actor with the
adapters off, and that a variant differs from its full-fine-tuning example in the LoRA
settings and the GPU count only (so the two cannot drift apart)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"
VARIANTS = sorted(p.stem for p in CONFIGS.glob("*_lora.yaml"))
# what lora/adapters.yaml and a *_lora.yaml set over their example
LORA_KEYS = {
    ("actor_rollout_ref", "model", "lora_rank"): 64,
    ("actor_rollout_ref", "model", "lora_alpha"): 32,
    ("actor_rollout_ref", "model", "target_modules"): [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ],
    ("actor_rollout_ref", "model", "lora", "merge"): True,
    ("trainer", "n_gpus_per_node"): 1,
}  # fmt: skip


def compose(name: str, *overrides: str):
    from mcgpo.integrations.verl.check import compose_config

    return compose_config(str(CONFIGS), name, overrides)


def _plain(cfg, *, resolve: bool = True) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=resolve)


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def test_every_mcgpo_example_has_a_lora_variant():
    assert VARIANTS == ["alfworld_mcgpo_lora", "webshop_mcgpo_lora"]


@pytest.mark.parametrize("name", VARIANTS)
def test_lora_variant_sets_verls_lora_keys_and_takes_the_reference_from_the_actor(name):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from mcgpo.integrations.verl.config import check_verl_config, plugin_config

    cfg = compose(name)
    tree = _plain(cfg)
    for path, value in LORA_KEYS.items():
        assert _get(tree, path) == value, path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref, critic = need_reference_policy(cfg), need_critic(cfg)
    assert ref is True and critic is False  # the KL loss needs a reference ...
    validate_config(config=cfg, use_reference_policy=ref, use_critic=critic)
    # ... which verl's trainer (v1 trainer_base._init_resource_pool_mgr, main_ppo) then
    # computes in the actor with the adapters off: ref_in_actor, no ActorRolloutRef role
    model = cfg.actor_rollout_ref.model
    rank = model.get("lora", {}).get("rank", 0) or model.get("lora_rank", 0)
    assert rank > 0
    run = plugin_config(cfg)
    check_verl_config(cfg, run)  # the plugin's pair loss and checks, unchanged
    assert run.algo.name == "mcgpo" and run.algo.lambda_pair > 0


@pytest.mark.parametrize("name", VARIANTS)
def test_lora_variant_differs_from_its_example_in_the_lora_settings_only(name):
    # unresolved: what follows from these by interpolation (a run folder named after the
    # experiment, the rollout's GPU count) is the same expression in both
    base = _plain(compose(name.removesuffix("_lora")), resolve=False)
    lora = _plain(compose(name), resolve=False)
    for path in LORA_KEYS:
        parent_l, parent_b = _get(lora, path[:-1]), _get(base, path[:-1])
        parent_l.pop(path[-1])
        parent_b.pop(path[-1], None)
    assert lora["trainer"].pop("experiment_name") == name
    base["trainer"].pop("experiment_name")
    assert lora == base


def test_the_lora_group_applies_to_any_example_from_the_command_line():
    tree = _plain(compose("alfworld_graphgpo", "+lora=adapters"))
    assert _get(tree, ("actor_rollout_ref", "model", "lora_rank")) == 64
    assert _get(tree, ("trainer", "n_gpus_per_node")) == 2  # the group leaves the GPUs alone
