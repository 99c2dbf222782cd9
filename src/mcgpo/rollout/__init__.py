"""Where text, tokens and environments meet: prompts, parsing, sampling, group rollouts.

See docs/rollout.md for the prompt format, the loss masks and the log-prob conventions.
"""

from mcgpo.rollout.corpus import environment_corpus
from mcgpo.rollout.group_rollout import DEFAULT_MAX_NEW_TOKENS, CollectOptions, Rollout, collect
from mcgpo.rollout.parsing import contains_cjk, parse_action
from mcgpo.rollout.prompts import (
    RESPONSE_FORMATS,
    default_response_format,
    encode_prompt,
    encode_response,
    format_response,
    prompt_ids,
    render_prompt,
    stop_strings,
)
from mcgpo.rollout.sampler import Samples, sample
from mcgpo.rollout.tokens import TokenBatch, TokenBatchError

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "RESPONSE_FORMATS",
    "CollectOptions",
    "Rollout",
    "Samples",
    "TokenBatch",
    "TokenBatchError",
    "collect",
    "contains_cjk",
    "default_response_format",
    "encode_prompt",
    "encode_response",
    "environment_corpus",
    "format_response",
    "parse_action",
    "prompt_ids",
    "render_prompt",
    "sample",
    "stop_strings",
]
