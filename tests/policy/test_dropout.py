"""The base model's dropout is off for training (policy/dropout.py; setup_run calls it)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mcgpo.policy.dropout import base_dropout_off


def _gpt2(p: float = 0.1):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=50, n_positions=16, n_embd=16, n_layer=2, n_head=2,
        resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def _qwen(attention_dropout: float):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, attention_dropout=attention_dropout,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


IDS = torch.arange(12).reshape(2, 6) % 50


def _train_logits(model) -> torch.Tensor:
    model.train()
    with torch.no_grad():
        return model(IDS).logits


def _eval_logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize(
    "build", [_gpt2, lambda: _qwen(0.25)], ids=["dropout-modules", "attn-float"]
)
def test_train_mode_forwards_equal_the_eval_forward_once_dropout_is_off(build):
    model = build()
    # the premise: with the model's dropout, a train-mode forward is a random draw
    assert not torch.equal(_train_logits(model), _eval_logits(model))
    found = base_dropout_off(model)
    assert found and all(rate > 0 for rate in found.values())
    assert torch.equal(_train_logits(model), _eval_logits(model))
    assert torch.equal(_train_logits(model), _train_logits(model))
    assert base_dropout_off(model) == {}  # nothing left to turn off
    # the config keeps its rates (a saved policy is the model it came as)
    assert getattr(model.config, "resid_pdrop", None) in (None, 0.1)


def test_found_names_each_rate_and_a_model_without_dropout_reports_nothing():
    found = base_dropout_off(_qwen(0.25))
    assert set(found.values()) == {0.25}
    assert sorted(found) == [f"model.layers.{i}.self_attn.attention_dropout" for i in (0, 1)]
    assert base_dropout_off(_qwen(0.0)) == {}


def test_lora_adapter_dropout_is_left_as_it_is():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _qwen(0.25), peft.LoraConfig(r=2, lora_alpha=4, lora_dropout=0.3, target_modules=["q_proj"])
    )
    found = base_dropout_off(model)
    assert found and not any("lora" in name for name in found)
    drops = [m for name, m in model.named_modules() if "lora_dropout" in name.split(".")[-2:]]
    drops = [m for m in drops if isinstance(m, torch.nn.Dropout)]
    assert drops and all(m.p == 0.3 for m in drops)


def test_a_training_run_of_a_policy_with_dropout_has_pi_old_equal_to_the_sampler(
    micro_model, tmp_path, capsys
):
    """The micro policy with attention dropout 0.5 in its config: the recomputed pi_old (train
    mode) must equal the sampler's (eval mode) to float rounding, and the run says that the
    dropout is off. With the dropout left on, the two differ by far more (checked first)."""
    from mcgpo.cli import main

    folder = tmp_path / "with-dropout"
    shutil.copytree(micro_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["attention_dropout"] = 0.5
    (folder / "config.json").write_text(json.dumps(config))

    from mcgpo.policy import load_policy

    model, _ = load_policy(folder)
    assert not torch.equal(_train_logits(model), _eval_logits(model))  # the premise

    out = tmp_path / "run"
    args = [
        "train", "--preset", "household-smoke", "--model", str(folder), "--out", str(out),
        "--train.updates", "1", "--eval.tasks", "0", "--train.old_logprobs", "recompute",
    ]  # fmt: skip
    assert main(args) == 0
    record = next(
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "pi_old/max_abs_diff" in line
    )
    assert record["pi_old/max_abs_diff"] < 1e-4
    err = capsys.readouterr().err
    assert "the policy's dropout is off for training (1 rate up to 0.5 set to 0" in err
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["attention_dropout"] == 0.5  # the saved policy keeps its config
