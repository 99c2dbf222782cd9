"""train.async_lag with ``rollout.engine vllm``: the producer samples on the run's engine.

Served by a stand-in engine (tests/training/fake_engine/hf_engine.py: mcgpo's HF sampler on
its own whole copy of the policy, weights taken through the vLLM engine's own iterators),
so the pipeline's logic runs without vLLM: a k = 1 run on the engine equals the k = 1 run
on the producer's replica bit for bit (same weights, same samples), with random delays in
the producer and the learner; every forward of batch v sees exactly θ_s(v); the trainer
never syncs the engine itself (the producer loads each version once, between batches); a
run stopped and resumed equals the uninterrupted one and its engine, which starts from the
checkpoint's weights, loads nothing for the first batch it samples; a failure on the engine
reaches the learner as one line, and the producer stops before the engine closes.
The real engine: tests/rollout/test_vllm_async.py; evaluation borrowing the engine under
FSDP2 sharded in place: tests/training/test_fsdp.py.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch
from fake_engine.hf_engine import HFEngine

import mcgpo.training.setup as setup
from mcgpo.cli import main, resolve
from mcgpo.training import pipeline, trainer
from mcgpo.training.build import rollout_seed
from mcgpo.training.metrics import read_metrics
from mcgpo.training.pipeline import RolloutProducerError, batch_version

# one-token actions: some are empty (format penalty), so the advantages are not all 0
NONZERO = ("--rollout.max_new_tokens", "1", "--eval.tasks", "1", "--tensorboard", "false")


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model" / "model.safetensors"))


def _same_weights(a, b) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _records(folder) -> list[dict]:
    """The records, times, memory and compile counters aside."""
    return [
        {k: v for k, v in r.items()
         if not k.startswith(("time", "memory/", "rollout/compile_", "compile/"))
         and not k.endswith("seconds")}
        for r in read_metrics(folder / "metrics.jsonl")
    ]  # fmt: skip


@pytest.fixture
def engines(monkeypatch):
    """``rollout.engine vllm`` served by the stand-in; the engines built, in order."""
    built: list[HFEngine] = []

    def build(cfg, model, tokenizer, folder, world):
        built.append(HFEngine(model))
        return built[-1]

    def close(self):  # the run closes its engine after its producer has stopped
        producers = [t for t in threading.enumerate() if t.name == "rollout-producer"]
        assert not any(t.is_alive() for t in producers), "the engine closed under the producer"
        self.closed = True

    monkeypatch.setattr(setup, "check_engine_installed", lambda: None)
    monkeypatch.setattr(setup, "rollout_engine", build)
    monkeypatch.setattr(HFEngine, "close", close)
    return built


def _args(smoke_args, out, *extra):
    return smoke_args(out, "--deterministic", "--threads", "1", *NONZERO, *extra)


def _fingerprint(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@pytest.mark.slow
def test_lag_one_on_the_engine_equals_the_replica_whatever_the_delays(
    smoke_args, tmp_path, engines, monkeypatch
):
    """k = 1, 4 updates, on the replica (hf) and on the engine with random sleeps in the
    producer and the learner: the same weights and records bit for bit (nonzero
    advantages); every forward of the engine in batch v sees θ_s(v); the engine loaded
    θ_1 and θ_2 and θ_3 once each, between batches, and the trainer never synced it."""
    lag, updates = 1, 4
    base = ("--train.async_lag", str(lag), "--train.updates", str(updates))
    replica, engine = tmp_path / "replica", tmp_path / "engine"
    assert main(_args(smoke_args, replica, *base)) == 0
    assert engines == []  # the hf run built no engine

    delays = random.Random(11)  # the test's own stream: not the run's RNGs
    seen: dict[int, set[float]] = {}  # batch -> fingerprints of the engine's weights
    theta: dict[int, float] = {}  # u -> fingerprint of θ_u
    numbers = {rollout_seed(0, v): v for v in range(1, updates + lag + 2)}
    real_collect, real_update = pipeline.collect, trainer.update_policy

    def watched_collect(model, tokenizer, make_env, tasks, options, engine=None, pool=None):
        assert engine is engines[0]  # the run's engine samples, not a replica
        time.sleep(delays.uniform(0, 0.2))
        v = numbers[options.seed]
        hook = engine.model.register_forward_pre_hook(
            lambda m, a: seen.setdefault(v, set()).add(_fingerprint(m))
        )
        try:
            return real_collect(
                model, tokenizer, make_env, tasks, options, engine=engine, pool=pool
            )
        finally:
            hook.remove()
            time.sleep(delays.uniform(0, 0.2))

    def slow_update(learner, *args, **kwargs):
        theta.setdefault(0, _fingerprint(learner))  # θ_0 at update 1's start
        out = real_update(learner, *args, **kwargs)
        theta[len(theta)] = _fingerprint(learner)
        time.sleep(delays.uniform(0, 0.3))
        return out

    def no_sync(self, model):
        raise AssertionError("the trainer synced the engine: the producer owns its weights")

    monkeypatch.setattr(pipeline, "collect", watched_collect)
    monkeypatch.setattr(trainer, "update_policy", slow_update)
    monkeypatch.setattr(HFEngine, "update_weights", no_sync)
    assert main(_args(smoke_args, engine, *base, "--rollout.engine", "vllm")) == 0

    assert _same_weights(replica, engine)
    assert _records(replica) == _records(engine)
    records = [r for r in read_metrics(engine / "metrics.jsonl") if "async/lag" in r]
    assert [r["async/lag"] for r in records] == [min(lag, u - 1) for u in range(1, updates + 1)]
    assert any(r["adv/std"] > 0 for r in records)  # learned from nonzero advantages
    assert len(set(theta.values())) == updates + 1  # every update moved the weights
    # batches 1 .. U + k were sampled (U + 1 is kept for a resume), each with θ_s(v) only
    assert sorted(seen) == list(range(1, updates + lag + 1))
    for v, prints in seen.items():
        assert prints == {theta[batch_version(v, lag)]}, v
    (served,) = engines
    assert served.loads == 3  # θ_1, θ_2, θ_3 (θ_0 it served from the start)
    assert served.closed


@pytest.mark.slow
def test_stopped_and_resumed_on_the_engine_equals_uninterrupted(smoke_args, tmp_path, engines):
    """k = 1 on the engine: 4 updates, or 2 then --resume to 4: the same weights and
    records bit for bit. The resumed run's engine starts from the checkpoint's θ_2: batch
    3 comes from the checkpoint (sampled with θ_1), batch 4 (θ_2) needs no load, batch 5
    (θ_3) one."""
    from mcgpo.training.pending import read_pending

    base = ("--train.async_lag", "1", "--rollout.engine", "vllm")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(_args(smoke_args, whole, *base, "--train.updates", "4")) == 0
    assert main(_args(smoke_args, parts, *base, "--train.updates", "2")) == 0
    (pending,) = read_pending(parts / "checkpoints" / "update-000002", 1, 0, 1)
    assert (pending.number, pending.version) == (3, 1)
    assert main(_args(smoke_args, parts, *base, "--train.updates", "4", "--resume")) == 0
    assert _same_weights(whole, parts)
    assert _records(whole) == _records(parts)
    assert [e.loads for e in engines] == [3, 1, 1]


@pytest.mark.slow
def test_a_failure_on_the_engine_is_one_line_and_the_producer_stops_first(
    smoke_args, tmp_path, engines, monkeypatch
):
    """The engine fails in batch 3 (its first batch after a weight load): the learner gets
    one RolloutProducerError line after updates 1 and 2, no hang; the producer thread has
    stopped when the run closes the engine."""
    real_sample = HFEngine.sample

    def failing(self, prompts, **kwargs):
        if self.loads:
            raise RuntimeError("generate failed: engine core died\nsecond line")
        return real_sample(self, prompts, **kwargs)

    monkeypatch.setattr(HFEngine, "sample", failing)
    args = _args(smoke_args, tmp_path / "r", "--train.async_lag", "1", "--train.updates", "4")
    cfg = resolve("train", [*args[1:], "--rollout.engine", "vllm"])
    clock = time.monotonic()
    with pytest.raises(RolloutProducerError) as info:
        trainer.train(cfg)
    assert str(info.value) == (
        "rollout producer failed on batch 3: RuntimeError: generate failed: engine core died"
    )
    assert isinstance(info.value.__cause__, RuntimeError)
    updates = [
        r["update"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "loss/task" in r
    ]
    assert updates == [1, 2]
    assert engines[0].closed  # after the producer stopped (the fixture checks)
    assert time.monotonic() - clock < 300  # no hang (a wide margin: a run takes seconds)


@pytest.mark.slow
def test_evaluation_borrows_the_engine_between_batches(smoke_args, tmp_path, engines, monkeypatch):
    """Where evaluation samples on the engine (a policy sharded in place; here forced on a
    whole one), the learner borrows it between two batches and loads θ_u; the producer
    loads its own version again before its next batch. Made to happen: batch 2 (θ_0)
    waits until the evaluation after update 1 (θ_1) is done. The run equals the replica
    run (evaluation by mcgpo's sampler on θ_u) bit for bit, evaluation records included;
    every evaluation sees θ_u and every batch θ_s(v)."""
    base = ("--train.async_lag", "1", "--train.updates", "3", "--eval.every", "1")
    replica, engine = tmp_path / "replica", tmp_path / "engine"
    assert main(_args(smoke_args, replica, *base)) == 0

    theta: dict[int, float] = {}
    seen: dict[int, set[float]] = {}
    evaluated_on: dict[int, float] = {}
    first_eval = threading.Event()
    real_collect, real_update = pipeline.ServedWeights.collect, trainer.update_policy
    real_eval = trainer.evaluate

    def gated_collect(self, number, *args):
        if number == 2:  # the evaluation after update 1 takes the engine first
            assert first_eval.wait(timeout=300)
        hook = self.engine.model.register_forward_pre_hook(
            lambda m, a: seen.setdefault(number, set()).add(_fingerprint(m))
        )
        try:
            return real_collect(self, number, *args)
        finally:
            hook.remove()

    def watched_eval(run, world, *, engine=None, show=False, pools=None):
        assert engine is engines[0]
        evaluated_on[run.updates_done] = _fingerprint(engine.model)
        out = real_eval(run, world, engine=engine, show=show, pools=pools)
        if run.updates_done == 1:
            first_eval.set()
        return out

    def watched_update(learner, *args, **kwargs):
        theta.setdefault(0, _fingerprint(learner))
        out = real_update(learner, *args, **kwargs)
        theta[len(theta)] = _fingerprint(learner)
        return out

    monkeypatch.setattr(trainer, "evaluates_on_engine", lambda run: run.engine is not None)
    monkeypatch.setattr(pipeline, "evaluates_on_engine", lambda run: run.engine is not None)
    monkeypatch.setattr(pipeline.ServedWeights, "collect", gated_collect)
    monkeypatch.setattr(trainer, "evaluate", watched_eval)
    monkeypatch.setattr(trainer, "update_policy", watched_update)
    assert main(_args(smoke_args, engine, *base, "--rollout.engine", "vllm")) == 0

    assert _same_weights(replica, engine)
    assert _records(replica) == _records(engine)
    assert any(r.get("adv/std", 0) > 0 for r in read_metrics(engine / "metrics.jsonl"))
    assert len(set(theta.values())) == 4
    assert evaluated_on == theta  # before training (θ_0) and after each update
    assert sorted(seen) == [1, 2, 3, 4]
    for v, prints in seen.items():
        assert prints == {theta[batch_version(v, 1)]}, v
    # θ_1 for the evaluation, θ_0 again for batch 2, then θ_1 (batch 3), θ_2 (batch 4 and
    # evaluation 2), θ_3 (evaluation 3), in whatever order the rest comes: at least 5 loads
    assert engines[0].loads >= 5


@pytest.mark.slow
def test_sigkill_at_a_random_moment_and_resume_on_the_engine(smoke_args, tmp_path, engines):
    """k = 1 on the engine (the stand-in, in the killed run's process through its
    sitecustomize): SIGKILL at a random moment after the first checkpoint, then --resume
    until done, gives the uninterrupted run's weights and records bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    base = ("--train.async_lag", "1", "--train.updates", "6", "--rollout.engine", "vllm")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(_args(smoke_args, whole, *base)) == 0
    path = os.pathsep.join([str(here.parents[1] / "src"), str(here / "fake_engine")])
    env = {**os.environ, "PYTHONPATH": path}
    args = _args(smoke_args, killed, *base)
    latest = killed / "checkpoints" / "latest"

    def start(*extra):
        cmd = [sys.executable, "-m", "mcgpo", *args, *extra]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip

    proc = start()
    deadline = time.monotonic() + 300  # a wide margin: the run takes seconds
    while proc.poll() is None and not (latest.exists() and latest.read_text().strip()):
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    time.sleep(random.Random(46).uniform(0.0, 0.2))  # 5 updates (~0.3 s each) to go
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL  # killed mid-run
    assert not (killed / "model").exists()
    proc = start("--resume")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert _same_weights(whole, killed)
    assert _records(whole) == _records(killed)


@pytest.mark.slow
def test_a_lora_policy_samples_ahead_on_the_engine_with_its_merged_weights(
    smoke_args, tmp_path, engines, monkeypatch
):
    """LoRA with k = 1 on the engine: the snapshot after update 1 holds the merged weights
    under the base model's names (what the engine serves), taken before update 2 moved the
    adapters; the engine loads it for batch 3 and the run trains the adapters."""
    from mcgpo.policy.lora import merged_model

    loaded: list[dict[str, torch.Tensor]] = []
    merged_after: dict[int, dict[str, torch.Tensor]] = {}
    real_load, real_update = HFEngine.update_weights_from, trainer.update_policy

    def load(self, weights):
        loaded.append({k: v.detach().clone() for k, v in weights.items()})
        return real_load(self, weights)

    def update(learner, *args, **kwargs):
        out = real_update(learner, *args, **kwargs)
        merged = merged_model(learner)
        merged_after[len(merged_after) + 1] = {n: p.detach().clone()
                                               for n, p in merged.named_parameters()}  # fmt: skip
        return out

    monkeypatch.setattr(HFEngine, "update_weights_from", load)
    monkeypatch.setattr(trainer, "update_policy", update)
    out = tmp_path / "run"
    lora = ("--train.lora_rank", "4", "--train.lora_alpha", "8", "--train.async_lag", "1")
    assert main(_args(smoke_args, out, *lora, "--rollout.engine", "vllm")) == 0
    (weights,) = loaded  # θ_1, for batch 3 (batches 1 and 2: θ_0, served from the start)
    assert weights.keys() == merged_after[1].keys()
    assert all(torch.equal(weights[k], merged_after[1][k]) for k in weights)
    assert any(not torch.equal(weights[k], merged_after[2][k]) for k in weights)
    from safetensors.torch import load_file

    trained = load_file(str(out / "model" / "adapter_model.safetensors"))
    assert all(w.abs().max() > 0 for k, w in trained.items() if "lora_B" in k)
