"""The built-in CPU policy: a small Qwen2-architecture model and a tokenizer trained offline.

Nothing is downloaded. The tokenizer is a byte-level BPE trained with ``tokenizers`` on the
texts it is given; the training setup gives it the text the environment generates
(:func:`mcgpo.rollout.corpus.environment_corpus`: the policy layer knows nothing of
environments, so the caller builds that corpus). Byte-level
means every string, actions included, round-trips exactly, and words the corpus never saw
fall back to byte pieces. In effect it is a word-level tokenizer with a byte fallback: the
pre-tokenizer splits words, numbers and punctuation apart, and the household corpus of 256
episodes has fewer distinct words than the 1,024-entry budget (the vocabulary stops at about
840), so every word it holds is one token. 256 episodes cover every object and receptacle
name of the household catalog; 64 left five object names (``cellphone``, ``newspaper``, ...)
in pieces, and the model then spelled them wrongly ("cellphonononone"). Special tokens: ``<|pad|>``, ``<|bos|>`` (prepended to every
encoded text), ``<|eos|>`` (ends a response). There is no chat template: the tiny model
reads the plain prompt and answers in the action-only format.

Model defaults (hidden 128, 2 layers, 4 heads, 2 key/value heads, MLP 4x, tied
embeddings; 0.49 M parameters + 128 per vocabulary entry, about 0.6 M in all). Why: two
layers are the fewest that can form the copy-from-context (induction) heads an agent needs
to repeat an admissible action or an object id from its prompt; width 128 gives those heads
32-dimensional keys, where width 64 leaves 16; four layers would cost about 4x the compute
per token (training-stack reference §4: d=128/4 layers trains at 12 k tokens/s, d=64/2
layers at 53 k on two cores), and every turn feeds 250-500 prompt tokens. Grouped-query attention (2 KV heads) keeps the
architecture that of the Qwen2.5 instruct models of the recipe. Measured (shared CPUs,
expert SFT, 32 turns a step, lr 3e-3): the response loss falls from ln V = 6.7 to about
1.2 nats/token in 100 steps at width 128 and at width 64 alike; after 400 steps (8 min) the
width-64 model is at 0.5 but wins none of 24 unseen household tasks at temperature 0.4.
Learning the task takes longer SFT than minutes on two shared cores; the width is kept at
128 for the capacity that copying object ids needs, not for early speed.

Both pieces are deterministic: the same texts give the same vocabulary, the same seed gives
the same weights (initialised under a forked torch RNG, so the caller's RNG is untouched).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "build_tiny_policy",
    "tiny_model",
    "train_tokenizer",
]

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|bos|>", "<|eos|>"


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 1024) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``.

    ``vocab_size`` is an upper bound (training stops early when no pair repeats). Encoding
    with special tokens prepends ``<|bos|>``; decoding is exact (no space clean-up).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260 (256 bytes + 3 specials), got {vocab_size}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    bos_id = bpe.token_to_id(BOS_TOKEN)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def tiny_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = 4096,
) -> Any:
    """A freshly initialised Qwen2 causal LM sized for ``tokenizer`` (float32, CPU)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny_policy(
    texts: Iterable[str],
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)``: a tokenizer trained on ``texts``, a model from ``seed``.

    ``texts`` is the tokenizer's corpus, usually the environment's own text
    (:func:`mcgpo.rollout.corpus.environment_corpus`, which the training setup calls with the
    run's environment factory). Save with :func:`mcgpo.policy.save_policy`, reload with
    ``load_policy``.
    """
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    model = tiny_model(
        tokenizer,
        seed=seed,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
    )
    return model, tokenizer
