"""Qwen2.5-Instruct- and Qwen3-shaped model folders, built offline (mcgpo.policy.shapes).

Random weights at tiny sizes, but the real architecture classes, a Qwen2Tokenizer with the
real special tokens and pre-tokenizer, the chat template and the EOS / pad choices of the
instruct folders. Checks: loading, EOS/pad resolution, chat rendering by the prompt layer
(Qwen3's thinking switch follows the response format), and one training update end to end.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from mcgpo.cli import main
from mcgpo.envs import make_env
from mcgpo.policy import load_policy
from mcgpo.policy.shapes import SHAPES, save_shaped_folder, shaped_config, shaped_tokenizer
from mcgpo.rollout import environment_corpus, prompt_ids, render_prompt
from mcgpo.rollout.prompts import default_response_format
from mcgpo.training.metrics import read_metrics

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1100)  # fmt: skip
SHAPE_OF = {"qwen2.5": "qwen2.5-1.5b", "qwen3": "qwen3-4b"}
CLASS_OF = {"qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@pytest.fixture(scope="module", params=["qwen2.5", "qwen3"])
def folder(request, tmp_path_factory):
    family = request.param
    extra = {"head_dim": 8} if family == "qwen3" else {}
    texts = environment_corpus(("household",), episodes=4)
    path = tmp_path_factory.mktemp(family) / "model"
    save_shaped_folder(path, SHAPE_OF[family], texts, **TINY, **extra)
    return family, path


def test_folder_has_the_files_and_choices_of_the_instruct_folder(folder):
    family, path = folder
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names  # fmt: skip
    tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "Qwen2Tokenizer"
    assert (tok_cfg["eos_token"], tok_cfg["pad_token"]) == ("<|im_end|>", "<|endoftext|>")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [CLASS_OF[family]]


def test_load_resolves_eos_pad_and_attention(folder):
    family, path = folder
    model, tok = load_policy(path)
    assert type(model).__name__ == CLASS_OF[family]
    assert type(tok).__name__ == "Qwen2Tokenizer"  # AutoTokenizer picks the declared class
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert (tok.eos_token_id, tok.pad_token_id) == (im_end, endoftext)
    assert model.generation_config.eos_token_id == [im_end, endoftext]
    assert model.config._attn_implementation == "sdpa"
    # special tokens are one id each, and text round-trips through the byte-level BPE
    text = "<|im_start|>user\ngo to fridge 1, ü 日<|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids[-1] == im_end
    assert tok.decode(ids) == text
    assert default_response_format(tok) == "think"


def test_prompt_layer_renders_with_the_chat_template(folder):
    family, path = folder
    _, tok = load_policy(path)
    obs = make_env("household").reset(seed=0, split="train")
    for fmt in ("think", "action"):
        text = render_prompt(obs, [], response_format=fmt)
        ids, fit = prompt_ids(tok, obs, [], response_format=fmt)
        assert fit == "full"
        # ChatML by hand: Qwen2.5 adds its default system message, Qwen3 none; Qwen3's
        # template closes an empty think block when thinking is off (the action format)
        system = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" if family == "qwen2.5" else ""
        empty_think = "<think>\n\n</think>\n\n" if family == "qwen3" and fmt == "action" else ""
        expected = f"{system}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        assert tok.decode(ids) == expected + empty_think


def test_qwen25_template_keeps_a_given_system_message():
    tok = shaped_tokenizer("qwen2.5", ["hi there, be brief"] * 4, vocab_size=300)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(chat, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_real_shapes_build_the_real_classes():
    assert set(SHAPES) == {"qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b"}
    assert type(shaped_config("qwen2.5-7b")).__name__ == "Qwen2Config"
    assert type(shaped_config("qwen3-8b")).__name__ == "Qwen3Config"
    with pytest.raises(
        ValueError, match=r"unknown shape 'llama-7b'; expected one of qwen2\.5-1\.5b"
    ):
        shaped_config("llama-7b")


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_one_collect_and_update_on_the_folder(folder, tmp_path, precision):
    family, path = folder
    fmt = "action" if family == "qwen3" else "think"  # the presets' formats
    out = tmp_path / "run"
    args = ["train", "--preset", "household-smoke", "--model", str(path), "--out", str(out),
            "--train.updates", "1", "--env.max_turns", "1", "--eval.tasks", "0",
            "--rollout.max_prompt_tokens", "4096",
            "--rollout.response_format", fmt, "--train.precision", precision]  # fmt: skip
    assert main(args) == 0
    [record] = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    assert record["rollout/prompts_cut"] == 0  # the whole chat-wrapped prompt was seen
    assert record["update/rows"] == 8 and record["update/tokens"] > 0
    assert math.isfinite(record["loss/task"]) and record["update/optimizer_steps"] == 1
    model, _ = load_policy(out / "model")
    assert type(model).__name__ == CLASS_OF[family]
    assert all(torch.isfinite(p).all() for p in model.parameters())
