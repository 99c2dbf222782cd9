"""Which verl trainers and modes the plugin runs under: only its own synchronous v1 trainer
``mcgpo``, which runs verl's synchronous code paths; every other verl trainer or mode that
would use the plugin's agent loop is refused in one line, at the check command, at the
trainer's start-up and where the agent loop is built (verl's own trainers call no plugin
code before their first rollout)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

verl = pytest.importorskip("verl")

from conftest import verl_config  # noqa: E402

pytestmark = pytest.mark.verl
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "verl"

# (override, the key the one-line refusal starts with)
UNSUPPORTED = [
    ("trainer.v1.trainer_mode=sync", "trainer.v1.trainer_mode: 'sync' is not the plugin's"),
    ("trainer.v1.trainer_mode=colocate_async", "trainer.v1.trainer_mode: 'colocate_async'"),
    ("trainer.v1.trainer_mode=separate_async", "trainer.v1.trainer_mode: 'separate_async'"),
    ("trainer.use_v1=false", "trainer.use_v1: False"),
    ("+async_training.staleness_threshold=0.1", "async_training: verl.experimental.fully_async"),
    ("+rollout.nnodes=1", "rollout: a top-level rollout block is verl.experimental.one_step"),
    ("+trainer.v1.sampler.custom_sampler.path=my.py", "trainer.v1.sampler.custom_sampler"),
    ("+trainer.v1.sync.parameter_sync_step=2", "trainer.v1.sync.parameter_sync_step"),
]


@pytest.mark.parametrize(("override", "start"), UNSUPPORTED)
def test_the_check_refuses_every_unsupported_trainer_and_mode(capsys, override, start):
    from mcgpo.integrations.verl.check import main

    code = main(["--config-path", str(CONFIGS), "--config-name", "webshop_mcgpo", override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {start}"), err
    assert "\n" not in err and "trainer.v1.trainer_mode=mcgpo" in err  # what to set instead
    assert "train.async_lag" in err  # mcgpo's own reproducible asynchrony


def test_verls_fully_async_config_is_refused():
    """verl's own experimental config (fully_async_ppo_trainer.yaml, composed from verl's
    package) with the plugin's settings: refused by its async_training block."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mcgpo.integrations.verl.config import check_trainer
    from mcgpo.training.config import ConfigError

    folder = Path(verl.__file__).parent / "experimental" / "fully_async_policy" / "config"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        cfg = compose("fully_async_ppo_trainer", overrides=["trainer.v1.trainer_mode=mcgpo"])
    with pytest.raises(ConfigError, match=r"^async_training: verl.experimental.fully_async"):
        check_trainer(cfg)


def test_the_trainer_refuses_them_at_start_up():
    """McgpoTrainer.__init__ runs the same refusals before any worker starts."""
    from mcgpo.integrations.verl.check import compose_config
    from mcgpo.integrations.verl.trainer import McgpoTrainer
    from mcgpo.training.config import ConfigError

    for override, start in UNSUPPORTED[3:]:  # the trainer_mode ones never reach this class
        cfg = compose_config(str(CONFIGS), "webshop_mcgpo", [override])
        with pytest.raises(ConfigError, match="^" + start.split(":")[0]):
            McgpoTrainer(cfg)


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_the_agent_loop_refuses_verls_own_trainers(tiny_policy, mode, caplog):
    """Under verl's own trainers the agent loop is the plugin's first code to run: it is
    refused when built, before any environment, with the same line (also logged)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from mcgpo.integrations.verl.agent_loop import McgpoEnvAgentLoop
    from mcgpo.training.config import ConfigError

    _, tokenizer = tiny_policy
    config = verl_config()
    config.trainer.v1.trainer_mode = mode

    async def build() -> None:
        McgpoEnvAgentLoop(
            trainer_config=DictConfigWrap(config), server_manager=None, tokenizer=tokenizer,
            processor=None, dataset_cls=None, data_config=DictConfigWrap(config.data),
        )  # fmt: skip

    with pytest.raises(ConfigError, match=rf"^trainer.v1.trainer_mode: '{mode}'"):
        asyncio.run(build())
    assert any("trainer.v1.trainer_mode" in r.getMessage() for r in caplog.records)


def test_the_mcgpo_trainer_runs_verls_synchronous_paths():
    """verl's base trainer treats every trainer_mode but "sync" as async (ReplayBufferAsync,
    gen_batch_size forced to 1, TransferQueue checkpoints); the mcgpo trainer reads as sync
    there, so it gets verl's synchronous replay buffer with whole batches."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from mcgpo.integrations.verl.check import compose_config
    from mcgpo.integrations.verl.trainer import McgpoTrainer

    cfg = compose_config(str(CONFIGS), "webshop_mcgpo", [])
    assert cfg.trainer.v1.trainer_mode == "mcgpo"
    trainer = McgpoTrainer(cfg)
    assert trainer.trainer_mode == "sync"
    assert type(trainer.replay_buffer) is ReplayBuffer  # not ReplayBufferAsync
    assert trainer.replay_buffer.trainer_mode == "sync"
    assert trainer.replay_buffer.gen_batch_size == cfg.data.train_batch_size  # not 1
    assert trainer.parameter_sync_step == 1
