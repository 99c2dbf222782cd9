"""configs/verl/*.yaml compose with verl 0.9.1's own ppo_trainer config (Hydra, as
``main_ppo`` loads them) and hold a plugin block that mcgpo accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.yaml")))
def test_config_composes_and_is_accepted(name):
    from hydra import compose, initialize_config_dir

    from mcgpo.integrations.verl.config import plugin_config

    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name=name)
    assert cfg.trainer.v1.trainer_mode == "mcgpo" and cfg.trainer.use_v1
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mcgpo_env"
    assert cfg.actor_rollout_ref.actor.shuffle is False
    run = plugin_config(cfg)
    env, algo = name.split("_")
    assert (run.env.name, run.algo.name) == (env, algo)
    assert run.algo.pairs.get("group_size") == (8 if algo == "mcgpo" else None)
