"""The settings of one group rollout (:class:`CollectOptions`), checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from mcgpo.envs.pool import DEFAULT_STEP_TIMEOUT
from mcgpo.rollout.decode_attention import DECODE_ATTENTIONS
from mcgpo.rollout.prompts import stop_strings
from mcgpo.rollout.static_decode import SAMPLERS

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "CollectOptions"]

# Response budget per format: the recipe's 512 for reasoning responses (reference §1.4);
# an action line is a handful of tokens.
DEFAULT_MAX_NEW_TOKENS = {"think": 512, "action": 32}


@dataclass(frozen=True, kw_only=True)
class CollectOptions:
    """How :func:`collect` plays its tasks; checked when built (one-line ``ValueError``).

    The recipe's values (group size, split, temperature, history) have no defaults here:
    their defaults are the run configuration's, and the trainer and the evaluation build
    every field from it (:func:`mcgpo.training.build.collect_options`). The optional fields
    default to "derive it" (from the environment, the format, the tokenizer) or to no limit.
    """

    group_size: int  # N sibling rollouts per task
    split: str  # env.reset(seed=task, split=split) gives the task
    temperature: float  # sampling temperature (1.0 for training, 0.4 for evaluation)
    history: int  # observation/action pairs shown in the prompt (h)
    max_turns: int | None = None  # turn limit; None: each environment's max_turns
    max_new_tokens: int | None = None  # response budget; None: 512 for "think", 32 for "action"
    response_format: str | None = None  # "think" or "action"; None: by the tokenizer
    seed: int = 0  # seeds the sampling generators: same seed and weights, same rollout
    group_offset: int = 0  # global index of tasks[0]'s group (a rank's block); seeds only
    max_prompt_tokens: int | None = None  # prompt budget (module docstring); None: no limit
    workers: int = 0  # environment worker processes; 0: step in this process
    step_timeout: float = DEFAULT_STEP_TIMEOUT  # seconds per step in a worker (workers > 0)
    sampler: str = "dynamic"  # "dynamic" (sampler.sample) or "static" (static_decode)
    decode_attention: str = "gqa"  # the static sampler's single-token attention (or "sdpa")
    overlap_env: bool = False  # pieces of the rows: some step while others decode
    overlap_pieces: int = 2  # how many fixed pieces with overlap_env (>= 2)
    batch_invariant: bool = False  # one sampler call per row: no row's company matters

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        for name in ("max_turns", "max_new_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.response_format is not None:
            stop_strings(self.response_format)  # an unknown format is named
        p = self.overlap_pieces
        if isinstance(p, bool) or not isinstance(p, int) or p < 2:
            raise ValueError(f"overlap_pieces must be an integer >= 2, got {p!r}")
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        for name in ("workers", "group_offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not self.step_timeout > 0 or self.step_timeout == float("inf"):
            raise ValueError(f"step_timeout must be a finite number > 0, got {self.step_timeout}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)}, got {self.sampler!r}")
        if self.decode_attention not in DECODE_ATTENTIONS:
            raise ValueError(
                f"decode_attention must be one of {list(DECODE_ATTENTIONS)}, "
                f"got {self.decode_attention!r}"
            )
