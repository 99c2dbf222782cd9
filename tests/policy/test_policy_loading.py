"""Saving and loading a policy offline: exact round trip, safetensors, clear errors."""

from __future__ import annotations

import json

import pytest
import torch

from mcgpo.policy import PolicyLoadError, load_policy, save_policy


def test_round_trip_is_exact_and_offline(small_policy, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = small_policy
    folder = save_policy(model, tok, tmp_path / "policy")
    names = {p.name for p in folder.iterdir()}
    assert "model.safetensors" in names and "config.json" in names
    assert not any(n.endswith(".bin") for n in names)
    loaded, loaded_tok = load_policy(folder)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    texts = ["go to fridge 1", "click[< Prev]\n", "<think>x</think><action>look</action>", "ü 日"]
    for text in texts:  # the same tokenizer, not the model type's default (Qwen2Tokenizer)
        assert loaded_tok(text)["input_ids"] == tok(text)["input_ids"]
    assert (loaded_tok.pad_token_id, loaded_tok.eos_token_id) == (
        tok.pad_token_id,
        tok.eos_token_id,
    )
    ids = torch.tensor([tok("go to fridge 1")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_missing_folder(tmp_path):
    with pytest.raises(PolicyLoadError, match=r"policy folder '.*nowhere' does not exist$"):
        load_policy(tmp_path / "nowhere")


def test_file_instead_of_folder(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_text("x")
    with pytest.raises(PolicyLoadError, match="is not a folder"):
        load_policy(path)


def test_folder_without_config(tmp_path):
    with pytest.raises(PolicyLoadError, match=r"has no config.json \(not a Hugging Face model"):
        load_policy(tmp_path)


def test_a_run_folder_given_as_the_policy_names_its_model_folder(tmp_path):
    (tmp_path / "model").mkdir()  # mcgpo sft --out RUN: the policy is RUN/model
    with pytest.raises(PolicyLoadError) as caught:
        load_policy(tmp_path)
    assert str(caught.value).endswith(
        f"; it holds a run: its policy is {str(tmp_path / 'model')!r}"
    )


def test_folder_without_weights_names_the_model(small_policy, tmp_path):
    model, tok = small_policy
    folder = save_policy(model, tok, tmp_path / "p")
    (folder / "model.safetensors").unlink()
    with pytest.raises(PolicyLoadError, match="cannot load the model") as info:
        load_policy(folder)
    assert "\n" not in str(info.value)


def test_missing_pad_token_falls_back_to_eos(small_policy, tmp_path):
    model, tok = small_policy
    folder = save_policy(model, tok, tmp_path / "p")
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("pad_token", None)
    cfg_path.write_text(json.dumps(cfg))
    _, loaded_tok = load_policy(folder)
    assert loaded_tok.pad_token == "<|eos|>"
    assert loaded_tok.pad_token_id == loaded_tok.eos_token_id == tok.eos_token_id


def test_write_policy_writes_what_save_pretrained_writes(small_policy, tmp_path):
    """write_policy (every rank's vLLM engine folder; save_pretrained writes on rank 0 only)
    gives the folder save_pretrained gives: the same config.json, with the weights' dtype
    recorded even when the config says another (here bfloat16 over float32 weights), the
    same tensors under the same names, and it loads as the original; the model's own config
    is left as it was."""
    from safetensors.torch import load_file

    from mcgpo.policy import write_policy

    model, tokenizer = small_policy  # shared by the session: its config is put back
    before = model.config.dtype
    model.config.dtype = torch.bfloat16
    try:
        mine = write_policy(model, tokenizer, tmp_path / "mine")
        assert model.config.dtype == torch.bfloat16  # untouched (save_pretrained rewrites it)
        theirs = save_policy(model, tokenizer, tmp_path / "hf")
    finally:
        model.config.dtype = before
    config = json.loads((mine / "config.json").read_text())
    assert config == json.loads((theirs / "config.json").read_text())
    assert config["dtype"] == "float32"
    a, b = load_file(mine / "model.safetensors"), load_file(theirs / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loaded, _ = load_policy(mine)
    assert all(
        torch.equal(p, q)
        for p, q in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    )
