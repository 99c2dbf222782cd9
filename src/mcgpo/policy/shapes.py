"""The architectures of the recipe's models, and folders shaped like theirs, built offline.

``SHAPES`` holds the sizes of Qwen2.5-1.5B/3B/7B-Instruct and Qwen3-4B/8B as their
``config.json`` files state them (Hugging Face ``Qwen/<name>``; nothing is downloaded here).
The memory plan (:mod:`mcgpo.policy.memory`) and the GPU check use them as they are; tests
shrink them (``overrides``) and keep the architecture class (``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``).

:func:`save_shaped_folder` writes a ``--model`` folder shaped like a real one: random
weights of the architecture, a ``Qwen2Tokenizer`` whose byte-level BPE is trained here on a
few texts with Qwen's pre-tokenizer and special tokens (``<|endoftext|>``, ``<|im_start|>``,
``<|im_end|>``; Qwen3 adds ``<think>``/``</think>``), its chat template, EOS ``<|im_end|>``
and pad ``<|endoftext|>`` as the instruct models set them, and a generation config whose
EOS ids are both (as the real folders'). The chat templates are ours, written to render the
same text as Qwen's for a conversation without tools: ChatML blocks
``<|im_start|>{role}\\n{content}<|im_end|>\\n``, Qwen2.5's default system message, and for
Qwen3 no default system message and an empty ``<think>\\n\\n</think>\\n\\n`` after the
generation prompt when called with ``enable_thinking=False``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["CHAT_TEMPLATES", "SHAPES", "save_shaped_folder", "shaped_config", "shaped_tokenizer"]

# config.json of each model (sizes and the fields that change the architecture).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(family="qwen2.5", hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(family="qwen2.5", hidden_size=2048, intermediate_size=11008,
                       num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-7b": dict(family="qwen2.5", hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, tie_word_embeddings=False),
    "qwen3-4b": dict(family="qwen3", hidden_size=2560, intermediate_size=9728,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(family="qwen3", hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}  # fmt: skip

_QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CHAT_TEMPLATES = {
    "qwen2.5": (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\n" + _QWEN25_SYSTEM + "<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if not (message['role'] == 'system' and loop.first) %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    "qwen3": (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
    ),
}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
_THINK = ("<think>", "</think>")


def shaped_config(name: str, **overrides: Any) -> Any:
    """The transformers config of ``SHAPES[name]`` (``overrides`` replace sizes)."""
    from transformers import Qwen2Config, Qwen3Config

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; expected one of {', '.join(SHAPES)}")
    fields = {**SHAPES[name], **overrides}
    family = fields.pop("family")
    fields.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 1e6})
    fields.setdefault("max_position_embeddings", 32768)
    fields.setdefault("rms_norm_eps", 1e-6)
    return (Qwen2Config if family == "qwen2.5" else Qwen3Config)(**fields)


def shaped_tokenizer(family: str, texts: Iterable[str], *, vocab_size: int = 1024) -> Any:
    """A ``Qwen2Tokenizer`` with Qwen's pre-tokenizer and special tokens, BPE trained on
    ``texts``, the family's chat template, EOS ``<|im_end|>`` and pad ``<|endoftext|>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer

    if family not in CHAT_TEMPLATES:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(CHAT_TEMPLATES)}")
    pipeline = Qwen2Tokenizer()._tokenizer  # Qwen's normalizer, pre-tokenizer and decoder
    bpe = Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer = pipeline.normalizer, pipeline.pre_tokenizer
    specials = [ENDOFTEXT, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = Qwen2Tokenizer(
        vocab=bpe.get_vocab(), merges=_merges(bpe), eos_token=IM_END, pad_token=ENDOFTEXT,
        unk_token=None,
    )  # fmt: skip
    tokenizer.add_tokens([AddedToken(t, special=True) for t in specials])
    if family == "qwen3":
        tokenizer.add_tokens([AddedToken(t, special=False) for t in _THINK])
    tokenizer.chat_template = CHAT_TEMPLATES[family]
    return tokenizer


def _merges(bpe: Any) -> list[tuple[str, str]]:
    """The merge list of a trained ``tokenizers`` BPE (read from its JSON form)."""
    import json

    merges = json.loads(bpe.to_str())["model"]["merges"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def save_shaped_folder(
    path: str | Path, name: str, texts: Iterable[str], *, seed: int = 0, **overrides: Any
) -> Path:
    """Write a ``--model`` folder shaped like ``name`` (random weights; see the module)."""
    from transformers import AutoModelForCausalLM

    from mcgpo.policy.loading import save_policy

    family = SHAPES[name]["family"] if name in SHAPES else ""
    config = shaped_config(name, **overrides)
    tokenizer = shaped_tokenizer(family, texts)
    eos, pad = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    if config.vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {config.vocab_size} < tokenizer size {len(tokenizer)}")
    config.eos_token_id, config.pad_token_id, config.bos_token_id = eos, pad, pad
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = [eos, pad]  # as Qwen's instruct folders
    model.generation_config.pad_token_id = pad
    return save_policy(model, tokenizer, path)
