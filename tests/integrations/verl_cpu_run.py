"""One verl training update end to end on the CPU (run by test_verl_end_to_end.py).

``python tests/integrations/verl_cpu_run.py OUT`` (with ``VERL_PLATFORM=cpu``) builds the
tiny model and its tokenizer in OUT/model, a 2-task parquet, composes verl's own
``ppo_trainer`` config with the plugin's switches (``trainer.v1.trainer_mode=mcgpo``,
agent loop ``mcgpo_env``, rollout ``mcgpo_cpu``, FSDP2 on gloo), and runs what
``main_ppo``'s ``TaskRunnerV1.run`` runs (TransferQueue, ``trainer.init()``, the agent loop
manager, ``trainer.fit``) for one update, in this process so the rollout server can be
read afterwards. Writes OUT/result.json; verl's metrics go to OUT/metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROMPTS, N, MAX_TURNS = 2, 2, 2


def stage(name: str) -> None:
    """One ``verl_cpu_run: <stage>`` line, so a stalled run's last output names the stage."""
    print(f"verl_cpu_run: {name}", flush=True)


def build_model(out: Path) -> float:
    """Save the tiny model + tokenizer as a Hugging Face directory; its parameter sum."""
    import torch

    from mcgpo.policy import tiny_model, train_tokenizer
    from mcgpo.rollout import environment_corpus

    tokenizer = train_tokenizer(environment_corpus(("household",), episodes=4), vocab_size=400)
    # verl's dataset renders the (unused) prompt column with the chat template
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return sum(float(p.double().sum()) for p in model.parameters() if p.dtype == torch.float32)


def write_tasks(path: Path) -> None:
    import pandas as pd

    rows = [
        {"data_source": "household", "prompt": [{"role": "user", "content": "task"}],
         "extra_info": {"seed": i, "split": "train", "index": i}}
        for i in range(PROMPTS)
    ]  # fmt: skip
    pd.DataFrame(rows).to_parquet(path)


def overrides(out: Path) -> list[str]:
    tasks, model = out / "tasks.parquet", out / "model"
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        f"data.train_files={tasks}", f"data.val_files={tasks}",
        f"data.train_batch_size={PROMPTS}", "data.max_prompt_length=512",
        "data.max_response_length=8", "data.filter_overlong_prompts=false",
        "data.dataloader_num_workers=0", "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.strategy=fsdp2", f"{actor}.ppo_mini_batch_size={PROMPTS}",
        f"{actor}.ppo_micro_batch_size_per_gpu=4", f"{actor}.use_kl_loss=false",
        f"{actor}.shuffle=false", f"{actor}.optim.lr=1e-2", f"{actor}.optim.weight_decay=0.01",
        f"{rollout}.name=mcgpo_cpu", f"{rollout}.n={N}", f"{rollout}.prompt_length=512",
        f"{rollout}.response_length=8", f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=4", f"{rollout}.calculate_log_probs=true",
        f"{rollout}.agent.default_agent_loop=mcgpo_env", f"{rollout}.agent.num_workers=1",
        "algorithm.use_kl_in_reward=false", "algorithm.adv_estimator=grpo",
        "trainer.use_v1=true", "trainer.v1.trainer_mode=mcgpo", "trainer.device=cpu",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_training_steps=1",
        "trainer.total_epochs=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out / 'ckpt'}",
        "+mcgpo.env.name=household", f"+mcgpo.env.max_turns={MAX_TURNS}",
        "+mcgpo.rollout.history=1", "+mcgpo.rollout.response_format=action",
        "+mcgpo.algo.name=mcgpo",
    ]  # fmt: skip


def run(out: Path) -> dict:
    import ray
    import transfer_queue as tq
    import verl  # noqa: F401  (loads the mcgpo plugin: platform, replica, loop, trainer)
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ, get_trainer_cls

    stage("building the model and tasks")
    initial = build_model(out / "model")
    write_tasks(out / "tasks.parquet")
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides(out))
    env = {k: os.environ[k] for k in ("VERL_PLATFORM", "PYTHONPATH") if k in os.environ}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", TRANSFER_QUEUE_ENABLE="1")
    # logical GPUs: verl's resource pools count "GPU"; nothing uses CUDA. Ray renices its
    # workers to 15; beside a busy process of the same scheduling group (a benchmark, the
    # rest of a CI job) they then get ~3% of a core and the run stalls for many minutes in
    # the first actor's start (TransferQueueController): worker_niceness 0 keeps them even.
    ray.init(
        num_cpus=100, num_gpus=1, runtime_env={"env_vars": env}, include_dashboard=False,
        _system_config={"worker_niceness": 0},
    )  # fmt: skip
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    stage("Ray started; starting TransferQueue")
    tq.init(config.transfer_queue)
    try:
        stage("TransferQueue up; trainer.init()")
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
        trainer.init()
        stage("trainer up; starting the agent loop manager")
        manager = AgentLoopManagerTQ.create(
            config=config, llm_client=trainer.get_llm_client(),
            teacher_client=trainer.get_teacher_client(),
            reward_loop_worker_handles=trainer.get_reward_handles(),
        )  # fmt: skip
        stage("agent loop manager up; trainer.fit()")
        trainer.fit(manager)
        stage("fit() done; reading the replica")
        server = trainer.llm_server_manager.get_replicas()[0].servers[0]
        state = ray.get(server.state.remote())
        steps = trainer.global_steps
    finally:
        tq.close()
        ray.shutdown()
    return {"initial_checksum": initial, "server": state, "global_steps": steps}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    os.environ.setdefault("VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl"))
    result = run(out)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / "result.json")
    stage("done")
