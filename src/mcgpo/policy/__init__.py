"""The policy: any Hugging Face causal LM loaded offline, the tiny CPU default, log-probs.

Models know nothing of environments: everything here takes token ids. The tiny model's
tokenizer is trained on environment text that the rollout layer renders
(:mod:`mcgpo.rollout.corpus`).
"""

from mcgpo.policy.loading import (
    PolicyLoadError,
    full_parameters,
    full_weights,
    holds_shards,
    load_policy,
    save_policy,
    write_policy,
    write_weights,
)
from mcgpo.policy.logprobs import (
    position_ids,
    token_entropy,
    token_log_probs,
    token_log_probs_and_entropy,
)
from mcgpo.policy.tiny import build_tiny_policy, tiny_model, train_tokenizer

__all__ = [
    "PolicyLoadError",
    "build_tiny_policy",
    "full_parameters",
    "full_weights",
    "holds_shards",
    "load_policy",
    "position_ids",
    "save_policy",
    "tiny_model",
    "token_entropy",
    "token_log_probs",
    "token_log_probs_and_entropy",
    "train_tokenizer",
    "write_policy",
    "write_weights",
]
