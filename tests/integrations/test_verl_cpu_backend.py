"""The CPU backend pieces on their own (fast, no Ray): the ``mcgpo_cpu`` token server and its
state file, the ``cpu`` platform and engine registration (with the unpinned offload policy),
and verl's padding rows in the advantage step."""

from __future__ import annotations

import asyncio
import copy
import json

import numpy as np
import pytest

verl = pytest.importorskip("verl")

import torch  # noqa: E402

from conftest import verl_config  # noqa: E402

pytestmark = pytest.mark.verl


@pytest.fixture(scope="module")
def model_folder(tiny_policy, tmp_path_factory):
    model, tokenizer = tiny_policy
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def server(tiny_policy, model_folder):
    from mcgpo.integrations.verl.cpu_replica import CpuTokenServer

    model, tokenizer = tiny_policy
    return CpuTokenServer(str(model_folder), response_length=6, seed=0), model, tokenizer


def test_server_generates_tokens_with_their_log_probs(server):
    from mcgpo.policy import token_log_probs

    srv, model, tokenizer = server
    prompt = tokenizer("You are in the kitchen.")["input_ids"]
    out = asyncio.run(srv.generate(prompt_ids=prompt, sampling_params={"temperature": 1.0}))
    assert 1 <= len(out.token_ids) <= 6 == srv.response_length  # default: response_length
    assert len(out.log_probs) == len(out.token_ids)
    # the log-probs are the model's own at temperature 1 (the actor recomputes the same)
    ids = torch.tensor([prompt + out.token_ids])
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, len(prompt) :] = True
    expected = token_log_probs(model, ids, torch.ones_like(ids))[0][mask[0]]  # position-aligned
    torch.testing.assert_close(torch.tensor(out.log_probs), expected, atol=1e-5, rtol=1e-5)
    limited = asyncio.run(srv.generate(prompt_ids=prompt, sampling_params={"max_tokens": 2}))
    assert 1 <= len(limited.token_ids) <= 2


def test_server_refuses_top_p_and_top_k(server):
    srv, _, _ = server
    with pytest.raises(ValueError, match="top_p/top_k"):
        asyncio.run(srv.generate(prompt_ids=[1, 2], sampling_params={"top_p": 0.9}))
    with pytest.raises(ValueError, match="top_p/top_k"):
        asyncio.run(srv.generate(prompt_ids=[1, 2], sampling_params={"top_k": 5}))


def test_server_loads_weights_and_reports_their_version(server):
    srv, model, _ = server
    state = {k: v.clone() for k, v in model.state_dict().items()}
    doubled = [(k, 2 * v) for k, v in state.items()]  # lm_head.weight (tied) included
    before = asyncio.run(srv.state())["checksum"]
    assert asyncio.run(srv.load_weights(doubled, global_steps=3)) == len(doubled)
    after = asyncio.run(srv.state())
    assert after["global_steps"] == 3
    assert after["checksum"] == pytest.approx(2 * before, rel=1e-6)
    out = asyncio.run(srv.generate(prompt_ids=[1, 2], sampling_params={}))
    assert out.extra_fields["global_steps"] == 3
    with pytest.raises(KeyError, match=r"no parameter bogus\.weight"):
        asyncio.run(srv.load_weights([("bogus.weight", torch.zeros(1))], global_steps=4))
    asyncio.run(srv.load_weights(list(state.items()), global_steps=0))  # restore


def test_server_keeps_its_state_file_current(tiny_policy, model_folder, tmp_path):
    """The file a driver reads after verl's main_ppo has ended (the server lived in a Ray
    worker): written at start, after each generate and each load_weights, whole."""
    from mcgpo.integrations.verl.cpu_replica import CpuTokenServer

    model, tokenizer = tiny_policy
    path = tmp_path / "servers" / "mcgpo_cpu_server_0.json"  # the folder does not exist yet
    srv = CpuTokenServer(str(model_folder), response_length=4, seed=0, state_path=path)

    def written() -> dict:
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
        return json.loads(path.read_text())

    initial = sum(float(p.detach().double().sum()) for p in model.parameters())
    assert written() == {"requests": 0, "global_steps": None, "checksum": initial,
                         "weight_loads": 0}  # fmt: skip
    prompt = tokenizer("You are in the kitchen.")["input_ids"]
    for k in (1, 2):
        asyncio.run(srv.generate(prompt_ids=prompt, sampling_params={}))
        assert written()["requests"] == k
    doubled = [(k, 2 * v) for k, v in model.state_dict().items()]
    asyncio.run(srv.load_weights(doubled, global_steps=1))
    state = written()
    assert state == asyncio.run(srv.state())
    assert (state["requests"], state["global_steps"], state["weight_loads"]) == (2, 1, 1)
    assert state["checksum"] == pytest.approx(2 * initial, rel=1e-12)  # x2 is exact in fp32
    asyncio.run(srv.set_global_steps(5))
    assert written()["global_steps"] == 5
    # a failed load (unknown name) leaves the file as it was
    with pytest.raises(KeyError):
        asyncio.run(srv.load_weights([("bogus.weight", torch.zeros(1))], global_steps=6))
    assert written() == {**state, "global_steps": 5}


def test_state_file_is_named_per_replica_from_the_environment(monkeypatch, tmp_path):
    from mcgpo.integrations.verl.cpu_replica import STATE_ENV, state_file

    monkeypatch.delenv(STATE_ENV, raising=False)
    assert state_file(0) is None
    assert state_file(1, tmp_path) == tmp_path / "mcgpo_cpu_server_1.json"
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "s"))
    assert state_file(3) == tmp_path / "s" / "mcgpo_cpu_server_3.json"
    monkeypatch.setenv(STATE_ENV, "")  # set but empty: no file
    assert state_file(0) is None


def test_cpu_platform_and_engine_registration():
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from mcgpo.integrations.verl.cpu_platform import PlatformCPU, register_cpu_engine
    from mcgpo.integrations.verl.cpu_replica import CpuReplica

    platform = PlatformRegistry.get("cpu")()
    assert isinstance(platform, PlatformCPU)
    assert (platform.device_name, platform.communication_backend_name()) == ("cpu", "gloo")
    assert platform.device_module.current_device() == "cpu"
    assert torch.zeros(1).to(platform.current_device()).device.type == "cpu"
    register_cpu_engine()
    register_cpu_engine()  # idempotent: verl asserts on a second registration otherwise
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["language_model"][backend]["cpu"] is FSDPEngineWithLMHead
    # the reference engine asks for pinned offload, which needs an accelerator: unpinned,
    # still torch's policy (FSDP2 checks the type), patched once
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    policy = transformer_impl.CPUOffloadPolicy
    assert issubclass(policy, CPUOffloadPolicy) and policy is not CPUOffloadPolicy
    assert policy(pin_memory=True).pin_memory is False
    register_cpu_engine()
    assert transformer_impl.CPUOffloadPolicy is policy
    assert RolloutReplicaRegistry.get("mcgpo_cpu") is CpuReplica
    assert _ROLLOUT_REGISTRY[("mcgpo_cpu", "async")].endswith("cpu_replica.CpuServerAdapter")


def test_padding_rows_are_left_out_of_the_advantage_step(episodes):
    from mcgpo.integrations.verl.batch import batch_credit
    from mcgpo.integrations.verl.config import plugin_config

    _, _, outs = episodes
    rows = [o.extra_fields for key in sorted(outs) for o in outs[key]]
    algo = plugin_config(verl_config("mcgpo")).algo
    plain = batch_credit(rows, algo)
    # verl's upsample_batch_to_divisible_size copies row 0's fields into each padding row
    padded = rows + [copy.deepcopy(rows[0]) for _ in range(3)]
    flags = [False] * len(rows) + [True] * 3
    got = batch_credit(padded, algo, flags)
    n = len(rows)
    np.testing.assert_array_equal(got.advantages[:n], plain.advantages)
    np.testing.assert_array_equal(got.partner[:n], plain.partner)
    assert not got.learn[n:].any() and (got.advantages[n:] == 0).all()
    np.testing.assert_array_equal(got.rows, np.arange(n))
    assert (got.partner[n:] == -1).all() and (got.sign[n:] == 0).all()
    with pytest.raises(ValueError, match="padding has 2 flags"):
        batch_credit(rows, algo, [False, True])
