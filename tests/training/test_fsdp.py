"""FSDP2 (``--train.sharding fsdp2``) on CPU gloo: 2 ranks vs 1 process, resume, saved folders.

The runs sample at temperature 0.001 (the arg-max), as tests/training/test_distributed.py
does and for the same reason: one generator serves the whole batch in collect today.
Measured on the 2-core test machine (torch 2.13.0+cpu): after two household-smoke updates
the FSDP2 weights differ from the single process's by 6e-8 (smoke layout) and 2.3e-8
(mini_batch_size 4, micro_batch_size 5); the bound asserted is 1e-6. The residual is float
rounding: each rank sums its own micro-batches' gradients, FSDP2 reduce-scatters the two
ranks' sums (an average, undone by the loss scale W), and the global norm for the clip is
the ranks' shard norms combined; one process adds the same terms in another order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ranks import launch, saved_weights

from mcgpo.cli import main
from mcgpo.training.distributed import SINGLE, distributed_learner

GREEDY = ("--rollout.temperature", "0.001", "--eval.temperature", "0.001", "--tensorboard", "false")
FSDP2 = ("--nproc", "2", "--train.sharding", "fsdp2")


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _rows(folder: Path, update: int, ranks: int):
    import pandas as pd

    names = [f"update-{update:06d}.parquet"] if ranks == 1 else [
        f"update-{update:06d}-rank{r}.parquet" for r in range(ranks)
    ]  # fmt: skip
    return pd.concat([pd.read_parquet(folder / "rollouts" / n) for n in names], ignore_index=True)


def _same_rollouts(first: tuple[Path, int], second: tuple[Path, int]) -> None:
    """Two runs' saved rollouts (folder, ranks) hold the same rows, actions, rewards and
    pairs in both updates, and the same advantages."""
    for update in (1, 2):
        a, b = _rows(first[0], update, first[1]), _rows(second[0], update, second[1])
        assert len(a) == len(b) > 0
        for column in ["slot", "turn", "action", "reward", "state", "response", "pair_role"]:
            assert a[column].tolist() == b[column].tolist(), column
        np.testing.assert_allclose(a["advantage"], b["advantage"], rtol=0, atol=1e-12)


def test_bad_sharding_is_one_line_exit_2(tmp_path, smoke_args, capsys):
    assert main(smoke_args(tmp_path / "run", "--train.sharding", "zero3")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "train.sharding must be one of ddp, fsdp2; got 'zero3'" in err


def test_no_replica_needs_the_vllm_engine_one_line_exit_2(tmp_path, smoke_args, capsys):
    # without a replica nothing could generate with mcgpo's own samplers
    assert main(smoke_args(tmp_path / "run", "--train.fsdp_replica", "false")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "train.fsdp_replica false needs rollout.engine vllm" in err
    assert main(smoke_args(tmp_path / "run2", "--train.fsdp_replica", "no")) == 2
    assert "train.fsdp_replica must be one of auto, true, false; got 'no'" in (
        capsys.readouterr().err
    )


def test_the_replica_is_kept_for_mcgpo_samplers_and_dropped_for_vllm_by_default() -> None:
    from mcgpo.training.config import TrainConfig

    assert TrainConfig().keep_replica("hf") and not TrainConfig().keep_replica("vllm")
    assert TrainConfig(fsdp_replica="true").keep_replica("vllm")
    assert not TrainConfig(fsdp_replica="false").keep_replica("vllm")


def test_fsdp2_with_logits_chunk_is_accepted() -> None:
    # once refused (the chunked head ran outside FSDP2's root all-gather); the learner's
    # PolicyForward now runs it inside the root's forward (trained and compared with one
    # process in tests/training/test_distributed_chunk.py)
    import dataclasses

    from mcgpo.training.config import RunConfig
    from mcgpo.training.distributed import check_world

    cfg = RunConfig()
    train = dataclasses.replace(cfg.train, sharding="fsdp2", logits_chunk=8)
    cfg = dataclasses.replace(cfg, nproc=2, train=train)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, groups=2))
    assert check_world(cfg, 2) is None


def test_one_process_learner_is_the_model_itself() -> None:
    # W = 1 is the reference path: no process group, no wrapper, whatever the sharding
    model = torch.nn.Linear(2, 2)
    assert distributed_learner(model, "fsdp2", SINGLE) is model
    assert distributed_learner(model, "ddp", SINGLE) is model


def test_fsdp2_ranks_make_equally_many_passes_per_step() -> None:
    """Rank 0 has micro-batches (2, 0, 1) in three steps, rank 1 (1, 3, 0): each rank pads
    every step to the larger count with empty row sets (zero-loss passes)."""
    from mcgpo.training import layout as plan

    def layout(counts: list[int]) -> plan.Layout:
        steps = [[np.arange(2, dtype=np.int64) for _ in range(c)] for c in counts]
        return plan.Layout(steps, [4, 6, 2], [10, 12, 3], 0, 0, 8)

    mine = [[2, 0, 1], [1, 3, 0]]
    shares = [layout(counts) for counts in mine]
    for rank in (0, 1):
        padded = plan.same_pass_count(shares[rank], shares)
        assert [len(s) for s in padded.steps] == [2, 3, 1]
        real = [sum(len(rows) > 0 for rows in s) for s in padded.steps]
        assert real == mine[rank]  # the rank's own micro-batches first, unchanged
        assert padded.rows == [4, 6, 2] and padded.tokens == [10, 12, 3]


@pytest.mark.slow
def test_fsdp2_two_processes_train_as_one(tmp_path, smoke_args):
    """2 FSDP2 ranks vs 1 process on an uneven layout: mini_batch_size 4 puts each 12-row
    group in a step of its own (a rank holds no row of the other's step: it pads with a
    zero-loss pass), micro_batch_size 5 cuts 3 micro-batches per step. The rows, advantages
    and pairs are the same; the gradient norm is the global one; weights within 1e-6."""
    extra = (*GREEDY, "--save-rollouts", "--train.mini_batch_size", "4")
    extra = (*extra, "--train.micro_batch_size", "5")
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(smoke_args(one, *extra)) == 0
    launch(smoke_args(two, *extra, *FSDP2))
    _same_rollouts((one, 1), (two, 2))
    from mcgpo.training.metrics import read_metrics

    ra, rb = (
        [r for r in read_metrics(f / "metrics.jsonl") if "update/rows" in r] for f in (one, two)
    )
    assert [r["update/optimizer_steps"] for r in ra] == [r["update/optimizer_steps"] for r in rb]
    np.testing.assert_allclose(
        [r["update/grad_norm"] for r in ra], [r["update/grad_norm"] for r in rb], rtol=1e-5
    )
    assert _gap(saved_weights(one / "model"), saved_weights(two / "model")) < 1e-6
    assert 'sharding = "fsdp2"' in (two / "config.toml").read_text()


@pytest.mark.slow
def test_fsdp2_resume_equals_uninterrupted_and_folders_load_in_one_process(tmp_path, smoke_args):
    """Stopped after update 1 and resumed (2 ranks both times) equals 2 uninterrupted
    ranks: the sharded AdamW state was gathered into the checkpoint and re-sharded. The
    checkpoint holds the full state (every parameter's full shape, by name); the final
    model folder loads and evaluates in a single process."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    launch(smoke_args(whole, *GREEDY, *FSDP2))
    launch(smoke_args(split, *GREEDY, *FSDP2, "--train.updates", "1"))
    state = torch.load(split / "checkpoints" / "update-000001" / "trainer.pt", weights_only=True)
    shapes = {
        k: tuple(v.shape)
        for k, v in saved_weights(split / "checkpoints/update-000001/model").items()
    }
    moments = state["optimizer"]["state"]
    assert set(moments) <= set(shapes) and len(moments) > 0
    assert all(tuple(m["exp_avg"].shape) == shapes[name] for name, m in moments.items())
    launch(smoke_args(split, *GREEDY, *FSDP2, "--resume"))
    assert _gap(saved_weights(whole / "model"), saved_weights(split / "model")) == 0.0
    # the saved folder is an ordinary --model folder for one process
    from mcgpo.policy import load_policy

    model, _ = load_policy(whole / "model")
    loaded = {k: v for k, v in model.state_dict().items() if k in saved_weights(whole / "model")}
    assert _gap(loaded, saved_weights(whole / "model")) == 0.0
    out = tmp_path / "eval"
    args = ["eval", "--preset", "household-smoke", "--model", str(whole / "model"), "--out"]
    assert main([*args, str(out), "--eval.temperature", "0.001", "--eval.tasks", "2"]) == 0
    assert (out / "eval.json").is_file()


FAKE_ENGINE = Path(__file__).parent / "fake_engine"  # its sitecustomize serves "vllm"


@pytest.mark.slow
def test_fsdp2_without_a_replica_trains_evaluates_and_saves_as_with_one(tmp_path, smoke_args):
    """``train.fsdp_replica false``: the policy is sharded in place, the engine samples and
    evaluates, syncs and saves gather the shards. Served by a stand-in engine that samples
    with mcgpo's HF sampler from its own copy (tests/training/fake_engine), the run equals
    2 FSDP2 ranks with a replica and the HF engine: the same rollouts and evaluations,
    the saved weights within 1e-6 (float rounding apart, both are FSDP2's update), the
    checkpoint's weights the final model's. The stand-in checks at every sync that the
    policy it is given is sharded, i.e. no rank keeps a whole copy. Both runs recompute
    pi_old and weight by TIS, as a vLLM run does (auto)."""
    extra = (*GREEDY, "--save-rollouts", "--train.rollout_correction", "tis")
    extra = (*extra, "--train.old_logprobs", "recompute", "--eval.every", "1")
    hf, drop = tmp_path / "hf", tmp_path / "drop"
    launch(smoke_args(hf, *extra, *FSDP2))
    launch(
        smoke_args(drop, *extra, *FSDP2, "--rollout.engine", "vllm"),
        path=(FAKE_ENGINE,),
        env={"MCGPO_TEST_EXPECT_SHARDED": "1"},
    )
    assert 'fsdp_replica = "auto"' in (drop / "config.toml").read_text()
    _same_rollouts((hf, 2), (drop, 2))
    from mcgpo.training.metrics import read_metrics

    def evals(folder: Path) -> list[tuple[int, float]]:
        rows = read_metrics(folder / "metrics.jsonl")
        return [(r["update"], r["eval/success"]) for r in rows if "eval/success" in r]

    assert len(evals(hf)) == 3 and evals(hf) == evals(drop)  # before, after 1 and after 2
    final = saved_weights(drop / "model")
    assert _gap(saved_weights(hf / "model"), final) < 1e-6
    assert _gap(saved_weights(drop / "checkpoints" / "update-000002" / "model"), final) == 0.0
    assert not any(k.startswith("policy.") for k in final)  # the policy's own names


@pytest.mark.slow
def test_fsdp2_without_a_replica_resumes_as_uninterrupted(tmp_path, smoke_args):
    """Stopped after update 1 and resumed without a replica equals the uninterrupted run:
    the checkpoint's gathered weights and optimiser state re-shard as they were; the
    stand-in engine is rebuilt from the resumed weights."""
    args = (*GREEDY, *FSDP2, "--rollout.engine", "vllm")
    fake = {"path": (FAKE_ENGINE,), "env": {"MCGPO_TEST_EXPECT_SHARDED": "1"}}
    whole, split = tmp_path / "whole", tmp_path / "split"
    launch(smoke_args(whole, *args), **fake)
    launch(smoke_args(split, *args, "--train.updates", "1"), **fake)
    launch(smoke_args(split, *args, "--resume"), **fake)
    assert _gap(saved_weights(whole / "model"), saved_weights(split / "model")) == 0.0


@pytest.mark.slow
def test_fsdp2_without_a_replica_samples_ahead_on_the_engine_as_with_one(tmp_path, smoke_args):
    """``train.async_lag 1`` with the policy sharded in place: each rank's producer samples
    on its engine (the stand-in), which loads the snapshots the learners gathered after
    each update; each evaluation borrows the engine between two batches, loading θ_u
    gathered from the shards (a collective in the learners' threads). The run equals 2
    FSDP2 ranks with a replica and the HF producer: the same rollouts and evaluations, the
    weights within 1e-6."""
    extra = (*GREEDY, "--save-rollouts", "--train.rollout_correction", "tis")
    extra = (*extra, "--train.old_logprobs", "recompute", "--eval.every", "1")
    extra = (*extra, "--train.async_lag", "1", "--train.updates", "3")
    hf, drop = tmp_path / "hf", tmp_path / "drop"
    launch(smoke_args(hf, *extra, *FSDP2))
    launch(
        smoke_args(drop, *extra, *FSDP2, "--rollout.engine", "vllm"),
        path=(FAKE_ENGINE,),
        env={"MCGPO_TEST_EXPECT_SHARDED": "1"},
    )
    _same_rollouts((hf, 2), (drop, 2))
    from mcgpo.training.metrics import read_metrics

    def records(folder: Path, key: str) -> list[tuple[int, float]]:
        return [(r["update"], r[key]) for r in read_metrics(folder / "metrics.jsonl") if key in r]

    assert len(records(hf, "eval/success")) == 4
    assert records(hf, "eval/success") == records(drop, "eval/success")
    assert [lag for _, lag in records(drop, "async/lag")] == [0, 1, 1]
    a, b = records(hf, "pi_old/max_abs_diff"), records(drop, "pi_old/max_abs_diff")
    assert len(a) == len(b) == 3  # the engine's batches were sampled with the replica's θ
    assert all(abs(x - y) < 1e-5 for (_, x), (_, y) in zip(a, b))
    assert _gap(saved_weights(hf / "model"), saved_weights(drop / "model")) < 1e-6
