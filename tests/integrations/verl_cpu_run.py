"""One verl training update end to end on the CPU, through verl's own entry point (run by
test_verl_end_to_end.py).

``python tests/integrations/verl_cpu_run.py OUT`` (with ``VERL_PLATFORM=cpu`` and ``src`` on
``PYTHONPATH``):

1. installs the test environment ``e2e_fork`` (``e2e_fork_env.py``) as a ``mcgpo.envs``
   plugin in OUT/site, which goes on ``PYTHONPATH`` of every Ray worker;
2. builds the tiny model and a tokenizer trained on that environment's text (OUT/init) and
   warm-starts it with ``mcgpo sft`` on the expert's demonstrations (OUT/sft/model, the
   folder verl loads): the expert knows the hidden way out, the observations do not show
   it, so the cloned policy picks each path about half the time and wins sometimes;
3. writes a parquet of ``PROMPTS`` tasks;
4. runs ``verl.trainer.main_ppo.main`` (Hydra's entry, with :func:`overrides` as its
   command line; ``main`` -> ``validate_config`` -> ``run_ppo`` -> ``ray.init(**ray_kwargs
   .ray_init)`` -> ``TaskRunnerV1``) for one update on two data-parallel ranks;
5. reads what verl left: the ``mcgpo_cpu`` servers' state files
   (``MCGPO_CPU_SERVER_STATE``, one per replica) and the actor's Hugging Face checkpoint of
   step 1, and writes OUT/result.json. verl's metrics go to OUT/metrics.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PROMPTS, N, MAX_TURNS, DP = 8, 8, 2, 2
MINI_BATCH = 4  # prompts per mini-batch: 4 x 8 = 32 rows, 16 per rank
MICRO_BATCH = 4  # rows per micro-batch per rank: even, so pairs stay in one
LR, WEIGHT_DECAY, KL_COEF = 1e-3, 0.01, 0.1
SFT = {"demos": 200, "epochs": 4, "noise": 0.5, "lr": 1e-2, "batch_size": 16}
HERE = Path(__file__).resolve().parent


START = time.monotonic()


def stage(name: str) -> None:
    """One ``verl_cpu_run: <stage>`` line (seconds since the start), so a stalled run's last
    output names the stage."""
    print(f"verl_cpu_run: {time.monotonic() - START:.0f} s: {name}", flush=True)


def checksum(folder: Path) -> float:
    """The float64 sum of a saved model's parameters (as ``CpuTokenServer`` computes it)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return sum(float(p.detach().double().sum()) for p in model.parameters())


def build_model(out: Path) -> Path:
    """The tiny model + tokenizer (OUT/init), warm-started by ``mcgpo sft`` (OUT/sft/model)."""
    from e2e_fork_env import NAME

    from mcgpo.cli import main as mcgpo_main
    from mcgpo.policy import tiny_model, train_tokenizer
    from mcgpo.rollout import environment_corpus

    tokenizer = train_tokenizer(environment_corpus((NAME,), episodes=16), vocab_size=300)
    # verl's dataset renders the (unused) prompt column with the chat template
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    model = tiny_model(tokenizer, seed=0, hidden_size=32, num_layers=1)
    model.save_pretrained(out / "init")
    tokenizer.save_pretrained(out / "init")
    args = ["sft", "--model", str(out / "init"), "--out", str(out / "sft"), "--env.name", NAME,
            "--env.max_turns", str(MAX_TURNS), "--rollout.history", "1",
            "--rollout.response_format", "action", "--rollout.max_new_tokens", "8",
            "--rollout.max_prompt_tokens", "512", "--eval.tasks", "32",
            "--eval.temperature", "1.0", "--threads", "1", "--progress", "false"]  # fmt: skip
    for key, value in SFT.items():
        args += [f"--sft.{key}", str(value)]
    code = mcgpo_main(args)
    if code:
        raise SystemExit(f"verl_cpu_run: mcgpo sft exited with {code}")
    return out / "sft" / "model"


def write_tasks(path: Path) -> None:
    import pandas as pd

    rows = [
        {"data_source": "e2e_fork", "prompt": [{"role": "user", "content": "task"}],
         "extra_info": {"seed": i, "split": "train", "index": i}}
        for i in range(PROMPTS)
    ]  # fmt: skip
    pd.DataFrame(rows).to_parquet(path)


def worker_env(out: Path) -> dict[str, str]:
    """What every Ray worker needs (``ray_kwargs.ray_init.runtime_env.env_vars``)."""
    return {
        "VERL_PLATFORM": "cpu",
        "PYTHONPATH": os.environ["PYTHONPATH"],  # src and the env plugin (main sets both)
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl"),
        "MCGPO_CPU_SERVER_STATE": str(out / "servers"),
    }


def overrides(out: Path, model: Path) -> list[str]:
    """``main_ppo``'s command line: verl's ``ppo_trainer`` config with the plugin's switches,
    the CPU platform's settings and Ray's (``ray_kwargs.ray_init``, passed to ``ray.init``)."""
    tasks = out / "tasks.parquet"
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    ray = "ray_kwargs.ray_init"
    env = [f"+{ray}.runtime_env.env_vars.{k}='{v}'" for k, v in worker_env(out).items()]
    return [
        f"hydra.run.dir='{out / 'hydra'}'",
        f"data.train_files='{tasks}'", f"data.val_files='{tasks}'",
        f"data.train_batch_size={PROMPTS}", "data.max_prompt_length=512",
        "data.max_response_length=8", "data.filter_overlong_prompts=false",
        "data.dataloader_num_workers=0", "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path='{model}'", "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"{actor}.strategy=fsdp2", f"{actor}.ppo_mini_batch_size={MINI_BATCH}",
        f"{actor}.ppo_micro_batch_size_per_gpu={MICRO_BATCH}", f"{actor}.shuffle=false",
        f"{actor}.use_kl_loss=true", f"{actor}.kl_loss_coef={KL_COEF}",
        f"{actor}.kl_loss_type=low_var_kl", f"{actor}.optim.lr={LR}",
        f"{actor}.optim.weight_decay={WEIGHT_DECAY}",
        f"{actor}.checkpoint.save_contents=[hf_model]",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"{rollout}.name=mcgpo_cpu", f"{rollout}.n={N}", f"{rollout}.prompt_length=512",
        f"{rollout}.response_length=8", f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={MICRO_BATCH}",
        f"{rollout}.calculate_log_probs=true",
        f"{rollout}.agent.default_agent_loop=mcgpo_env", f"{rollout}.agent.num_workers=1",
        "algorithm.use_kl_in_reward=false", "algorithm.adv_estimator=grpo",
        # verl's rollout correction, mapped onto mcgpo's (token-level TIS, cap 2)
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "transfer_queue.enable=true",
        "trainer.use_v1=true", "trainer.v1.trainer_mode=mcgpo", "trainer.device=cpu",
        f"trainer.n_gpus_per_node={DP}", "trainer.nnodes=1", "trainer.total_training_steps=1",
        "trainer.total_epochs=1", "trainer.val_before_train=false",
        # validation after the update (the last step), logged with the step's metrics: one
        # sampled episode per task (val_kwargs.n 1) at T = 1 (mcgpo_cpu samples; greedy is
        # verl's default)
        "trainer.test_freq=1", f"{rollout}.val_kwargs.do_sample=true",
        f"{rollout}.val_kwargs.temperature=1.0", f"{rollout}.val_kwargs.n=1",
        "trainer.save_freq=1", "trainer.logger=[console,file]",
        f"trainer.default_local_dir='{out / 'ckpt'}'",
        "+mcgpo.env.name=e2e_fork", f"+mcgpo.env.max_turns={MAX_TURNS}",
        "+mcgpo.rollout.history=1", "+mcgpo.rollout.response_format=action",
        "+mcgpo.algo.name=mcgpo", "+mcgpo.algo.lambda_pair=1.0",
        # Ray: logical GPUs (verl's resource pools count "GPU"; nothing uses CUDA). Ray
        # renices its workers to 15; beside a busy process of the same scheduling group (a
        # benchmark, the rest of a CI job) they then get ~3% of a core and the run stalls for
        # minutes in the first actor's start: worker_niceness 0 keeps them even (issue 17).
        f"{ray}.num_cpus=100", f"+{ray}.num_gpus={DP}", f"+{ray}.include_dashboard=false",
        f"+{ray}._system_config.worker_niceness=0",
        *env,
    ]  # fmt: skip


def run(out: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from e2e_fork_env import install

    site = install(out / "site")
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
    )
    stage("building the tiny model and warm-starting it (mcgpo sft)")
    model = build_model(out)
    initial = checksum(model)
    write_tasks(out / "tasks.parquet")
    stage("running verl.trainer.main_ppo")
    import ray
    from verl.trainer.main_ppo import main

    sys.argv = ["verl.trainer.main_ppo", *overrides(out, model)]
    try:
        main()  # Hydra: an exception is printed and exits 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
    stage("main_ppo done; reading the servers' state and the checkpoint")
    servers = {p.stem: json.loads(p.read_text()) for p in sorted((out / "servers").glob("*.json"))}
    hf = out / "ckpt" / "global_step_1" / "actor" / "huggingface"
    return {
        "initial_checksum": initial, "servers": servers,
        "trained_checksum": checksum(hf) if hf.is_dir() else None,
        "sft": json.loads((out / "sft" / "sft.json").read_text()),
    }  # fmt: skip


if __name__ == "__main__":
    out = Path(sys.argv[1]).resolve()
    result = run(out)
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(out / "result.json")
    stage("done")
