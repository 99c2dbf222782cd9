"""LoRA runs of the real CLI (train.lora_rank): the adapter folder and the merged model,
exact resume, DDP = one process, and bad LoRA options as one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ranks import launch, saved_weights
from safetensors.torch import load_file

pytest.importorskip("peft")  # the lora extra

from mcgpo.cli import main
from mcgpo.policy import load_policy
from mcgpo.training.checkpoint import latest_checkpoint, load_checkpoint

LORA = ("--train.lora_rank", "4", "--train.lora_alpha", "8")
GREEDY = ("--rollout.temperature", "0.001", "--eval.temperature", "0.001")


def adapters(folder):
    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.mark.slow
def test_lora_run_leaves_an_adapter_folder_and_a_merged_model(smoke_args, micro_model, tmp_path):
    out = tmp_path / "run"
    assert main(smoke_args(out, *LORA, "--train.lora_merge", "true")) == 0
    config = json.loads((out / "model" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    assert config["base_model_name_or_path"] == str(micro_model.resolve())
    weights = adapters(out / "model")
    # 1 layer x 7 projections x (A, B); every B moved away from its initial 0
    assert len(weights) == 14
    assert all(w.abs().max() > 0 for k, w in weights.items() if "lora_B" in k)
    assert not (out / "model" / "model.safetensors").exists()  # adapters only
    ckpt = latest_checkpoint(out)
    assert (ckpt / "model" / "adapter_config.json").is_file()
    # the merged folder is a plain model, equal to the adapter folder merged by PEFT
    merged, _ = load_policy(out / "merged")
    via_peft, _ = load_policy(out / "model")
    for (name, a), (_, b) in zip(merged.named_parameters(), via_peft.named_parameters()):
        assert torch.equal(a, b), name
    base, _ = load_policy(micro_model)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(dict(merged.named_parameters())[q], dict(base.named_parameters())[q])
    # a LoRA run's model folder is a --model for evaluation
    assert main(["eval", "--model", str(out / "model"), "--env.max_turns", "2",
                 "--eval.tasks", "1", "--out", str(tmp_path / "eval")]) == 0  # fmt: skip


@pytest.mark.slow
def test_lora_resume_after_sigkill_equals_the_uninterrupted_run(smoke_args, tmp_path):
    """A run SIGKILLed once its first checkpoint (adapters, AdamW, RNG, cursor) is written,
    then resumed, ends with the uninterrupted run's adapters and optimiser state, bit for
    bit (--deterministic, one thread; as tests/training/test_resume.py for full weights)."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    args = (*LORA, "--deterministic", "--threads", "1", "--train.updates", "3")
    assert main(smoke_args(whole, *args)) == 0
    _killed_after_first_checkpoint(smoke_args(parts, *args))
    assert not (parts / "model").exists()  # it did not finish
    assert main(smoke_args(parts, *args, "--resume")) == 0
    a, b = adapters(whole / "model"), adapters(parts / "model")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    sa, sb = (load_checkpoint(latest_checkpoint(f)) for f in (whole, parts))
    assert sa.update == sb.update == 3
    assert len(sa.optimizer["state"]) == 14  # AdamW holds the adapters' moments only
    for x, y in zip(sa.optimizer["state"].values(), sb.optimizer["state"].values()):
        assert torch.equal(x["exp_avg"], y["exp_avg"]) and torch.equal(
            x["exp_avg_sq"], y["exp_avg_sq"]
        )


def _killed_after_first_checkpoint(args: list[str]) -> None:
    """``python -m mcgpo ARGS`` in its own process group, SIGKILLed once a checkpoint is
    complete (``checkpoints/latest`` written)."""
    out = Path(args[args.index("--out") + 1])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mcgpo", *args], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if latest.is_file() and latest.read_text().strip():
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert latest.is_file(), "the run wrote no checkpoint before it was killed"


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_lora_on_two_processes_trains_as_one(smoke_args, tmp_path, sharding):
    """DDP and FSDP2 reduce the gradients of parameters that require them, the adapters'
    only; 2 gloo ranks end with the single process's adapters up to the float rounding of
    the gradient sums' order (tests/training/test_distributed.py: about 1e-7; FSDP2 with
    its replica, on which the adapters-off reference runs: measured 1.2e-6)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *LORA, *GREEDY)) == 0
    launch(smoke_args(two, *LORA, *GREEDY, "--nproc", "2", "--train.sharding", sharding))
    a, b = adapters(one / "model"), adapters(two / "model")
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 1e-4  # they trained


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--train.lora_alpha", "8"),
         "train.lora_alpha is set but train.lora_rank is 0 (full fine-tuning); "
         "set train.lora_rank >= 1"),
        (("--train.lora_rank", "-1"), "train.lora_rank must be >= 0, got -1"),
        (("--train.lora_rank", "4", "--train.lora_dropout", "1"),
         "train.lora_dropout must be in [0, 1), got 1.0"),
        (("--train.lora_rank", "4", "--train.lora_targets", "nope_proj"),
         "train.lora_targets 'nope_proj': PEFT cannot wrap Qwen2ForCausalLM: Target modules "
         "{'nope_proj'} not found in the base model. Please check the target modules and try "
         "again."),
        (("--train.lora_rank", "4", "--train.lora_targets", "input_layernorm"),
         "train.lora_targets 'input_layernorm': PEFT cannot wrap Qwen2ForCausalLM: "),
    ],
)  # fmt: skip
def test_bad_lora_options_are_one_line_exit_2(smoke_args, tmp_path, capsys, extra, message):
    assert main(smoke_args(tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"mcgpo train: error: {message}"), err


FAKE_ENGINE = Path(__file__).parent / "fake_engine"  # its sitecustomize serves "vllm"
# as rollout.engine vllm sets them (auto): pi_old recomputed, TIS weights
AS_VLLM = ("--train.old_logprobs", "recompute", "--train.rollout_correction", "tis")
NO_REPLICA = ("--nproc", "2", "--train.sharding", "fsdp2", "--rollout.engine", "vllm")


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _no_replica(out: Path, args: list[str], weights: Path | None = None) -> None:
    """A LoRA run on 2 FSDP2 ranks without a replica, served by the stand-in engine
    (tests/training/fake_engine), which checks at each sync that the policy is sharded
    and (``weights``) writes the merged weights it was given."""
    env = {"MCGPO_TEST_EXPECT_SHARDED": "1"}
    if weights is not None:
        env["MCGPO_TEST_ENGINE_WEIGHTS"] = str(weights)
    launch(args, path=(FAKE_ENGINE,), env=env)


def test_non_linear_adapters_without_a_replica_are_refused_in_one_line(micro_model):
    # sharded in place, the engine's merged weights are computed from the shards of linear
    # layers only: an adapted embedding is refused at setup, before any sharding
    import dataclasses

    from mcgpo.training.config import ConfigError, RunConfig
    from mcgpo.training.setup import RunSetup, _with_lora
    from mcgpo.training.world import World

    model, tokenizer = load_policy(micro_model)
    cfg = RunConfig(model=str(micro_model))
    train = dataclasses.replace(
        cfg.train, lora_rank=4, lora_targets="q_proj,embed_tokens", sharding="fsdp2",
        fsdp_replica="false",
    )  # fmt: skip
    setup = RunSetup(cfg=dataclasses.replace(cfg, train=train), folder=Path("."),
                     make_env=lambda: None, model=model, tokenizer=tokenizer,
                     response_format="action")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        _with_lora(setup, World(rank=0, size=2))
    assert str(err.value) == (
        "train.lora_targets: model.embed_tokens is not a linear layer; with train.sharding "
        "fsdp2 and train.fsdp_replica false (the default with vLLM) the adapters merge from "
        "the shards for linear layers only: target linear layers or set "
        "--train.fsdp_replica true"
    )
    # the same targets with the replica (or one process) are accepted
    setup.model, _ = load_policy(micro_model)
    assert _with_lora(setup, World(rank=0, size=1)) is setup.model


@pytest.mark.slow
def test_lora_fsdp2_without_a_replica_trains_as_one_and_syncs_merged_weights(smoke_args, tmp_path):
    """``train.fsdp_replica false`` (vLLM's default): the LoRA policy is sharded in place,
    the KL reference is the learner with its adapters off, only the adapters' gradients are
    reduce-scattered, the engine gets the merged weights gathered from the shards. The run
    equals one process (the HF sampler, pi_old recomputed and TIS as the vLLM path does):
    the same adapters, merged folder and engine weights, up to the float rounding of the
    gradient sums' order, with nonzero advantages and a KL term (household-smoke's
    kl_coef 0.01). Measured on the 2-core box (torch 2.13.0+cpu): adapters 2.6e-8 apart,
    merged and engine weights 1.8e-8; bound 1e-6. A reference with the adapters left on
    (KL = 0) ends 8.9e-5 apart (measured on the smoke layout), so the bound sees the
    reference; padding passes without the reference forward hang the ranks."""
    one, two = tmp_path / "one", tmp_path / "two"
    extra = (*LORA, *GREEDY, *AS_VLLM, "--train.lora_merge", "true", "--save-rollouts")
    # test_fsdp.py's uneven layout: a rank with no row in a step pads it with zero-loss
    # passes, which run the adapters-off reference forward too (a collective)
    extra = (*extra, "--train.mini_batch_size", "4", "--train.micro_batch_size", "5")
    assert main(smoke_args(one, *extra)) == 0
    synced = tmp_path / "engine.safetensors"
    _no_replica(two, smoke_args(two, *extra, *NO_REPLICA), weights=synced)
    assert 'fsdp_replica = "auto"' in (two / "config.toml").read_text()
    import pandas as pd

    rows = pd.read_parquet(one / "rollouts" / "update-000002.parquet")
    assert (rows["advantage"].fillna(0).abs() > 1e-3).any()  # the update had a signal
    a, b = adapters(one / "model"), adapters(two / "model")
    assert len(a) == 14 and _gap(a, b) < 1e-6
    assert max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 1e-4  # they trained
    merged = saved_weights(one / "merged")
    assert _gap(merged, saved_weights(two / "merged")) < 1e-6
    engine = load_file(str(synced))  # the last sync, after update 2: W + (alpha / r) B A
    merged.pop("lm_head.weight", None)  # tied: the engine's copy names it once
    engine = {k: v for k, v in engine.items() if k in merged}
    assert _gap(merged, engine) < 1e-6


@pytest.mark.slow
def test_lora_fsdp2_resume_equals_the_uninterrupted_run(smoke_args, tmp_path):
    """FSDP2 on 2 ranks with adapters: the checkpoint holds the adapters and the AdamW
    state gathered from the shards; stopped after update 1 and resumed equals the
    uninterrupted run (within float rounding, as test_distributed.py's resume: 1e-6)."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    extra = (*LORA, *GREEDY, "--nproc", "2", "--train.sharding", "fsdp2")
    launch(smoke_args(whole, *extra))
    launch(smoke_args(split, *extra, "--train.updates", "1"))
    launch(smoke_args(split, *extra, "--resume"))
    a, b = adapters(whole / "model"), adapters(split / "model")
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6


@pytest.mark.slow
def test_lora_fsdp2_without_a_replica_resumes_as_uninterrupted(smoke_args, tmp_path):
    """Sharded in place: the checkpoint holds the adapters gathered from the shards and the
    AdamW state gathered as FSDP2's; stopped after update 1 and resumed (the adapters set
    before sharding, the optimiser state re-sharded, the stand-in engine rebuilt from the
    resumed policy) equals the uninterrupted run exactly (measured: 0.0)."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    extra = (*LORA, *GREEDY, *NO_REPLICA)
    _no_replica(whole, smoke_args(whole, *extra))
    _no_replica(split, smoke_args(split, *extra, "--train.updates", "1"))
    first = adapters(split / "checkpoints" / "update-000001" / "model")
    assert len(first) == 14 and all(v.abs().max() > 0 for k, v in first.items() if "lora_B" in k)
    _no_replica(split, smoke_args(split, *extra, "--resume"))
    assert _gap(adapters(whole / "model"), adapters(split / "model")) == 0.0


@pytest.mark.slow
def test_lora_with_a_fixed_rollout_lag_trains_the_adapters(smoke_args, tmp_path):
    # train.async_lag 1: the producer samples on a copy of the LoRA policy that follows
    # the steps (its state dict: base and adapters); the run ends with trained adapters
    out = tmp_path / "run"
    assert main(smoke_args(out, *LORA, "--train.async_lag", "1")) == 0
    weights = adapters(out / "model")
    assert len(weights) == 14
    assert all(w.abs().max() > 0 for k, w in weights.items() if "lora_B" in k)
