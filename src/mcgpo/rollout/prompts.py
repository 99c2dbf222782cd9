"""Prompt rendering and response formats for one agent turn.

The prompt follows the verl-agent layout (algorithms reference §1.4; verl-agent
``agent_system/environments/prompts/``), reworded, and shared by every environment:

1. who the agent is; 2. the task; 3. "you have taken k steps; the last h observations and
the actions taken after them were ..." (h = ``history``, default 2); 4. the current step
and observation; 5. the admissible actions; 6. the instruction for the response format.
The first turn (k = 0) uses the no-history template (items 3 and the step index dropped).

Two response formats:

``"think"``   ``<think>reasoning</think><action>one admissible action</action>``; the
              default for models that ship a chat template (instruct models). The prompt is
              then wrapped as one user message with the tokenizer's chat template.
``"action"``  the action alone on one line; the default for the tiny model, whose tokenizer
              has no chat template: the prompt is plain text starting with BOS, in a
              compact layout (below). With a chat template (Qwen3 run action-only, as the
              MCGPO recipe does) the prompt is wrapped like the think format's.

The response format also sets the chat template's thinking switch: the template is called
with ``enable_thinking`` true for ``"think"`` and false for ``"action"``. Qwen3's template
then adds an empty ``<think>\n\n</think>\n\n`` to the generation prompt for the action
format, so the model answers with the action instead of reasoning first; templates that do
not use the variable (Qwen2.5's, most others) ignore it. No separate option: thinking on
with the action format would make every first line ``<think>`` and every action invalid.

The action format's compact layout keeps the same facts (the last h observation/action
pairs, the current observation, the admissible actions, the task) without the verl-agent
sentences, one action per line, and the task restated last, just before the response: a
2-layer model trained for minutes on CPU did not learn to copy object names out of the
verl-agent prompt, and the compact one is about a quarter shorter (docs/rollout.md §2).

Departures from verl-agent: one intro line for all environments (the environment's name is
not known to the rollout layer); admissible actions are shown quoted (``'go to fridge 1'``)
so that actions containing commas stay readable; the WebShop rule "fall back to the
no-history template above 13,000 characters" becomes a token budget applied by
:func:`mcgpo.rollout.group_rollout.collect` (``max_prompt_tokens``) for every environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcgpo.envs.protocol import Observation

__all__ = [
    "RESPONSE_FORMATS",
    "default_response_format",
    "encode_prompt",
    "encode_prompts",
    "encode_response",
    "format_response",
    "prompt_ids",
    "prompts_ids",
    "render_prompt",
    "stop_strings",
]

RESPONSE_FORMATS = ("think", "action")

INTRO = "You are an expert agent acting in a text-based environment."

_INSTRUCTION = {
    "think": (
        "Now it is your turn to act. First reason step by step about the current situation "
        "inside <think> </think> tags. Then choose one admissible action and write it inside "
        "<action> </action> tags."
    ),
    "action": (
        "Now it is your turn to act. Reply with exactly one admissible action on a single "
        "line and nothing else."
    ),
}


def _check_format(response_format: str) -> None:
    if response_format not in RESPONSE_FORMATS:
        raise ValueError(
            f"unknown response_format {response_format!r}; expected one of {RESPONSE_FORMATS}"
        )


def render_prompt(
    observation: Observation,
    past: Sequence[tuple[str, str]] = (),
    *,
    history: int = 2,
    response_format: str = "action",
) -> str:
    """The prompt text for one decision.

    Args:
        observation: what the agent sees now (its text, task and admissible actions).
        past: every earlier (observation text, action text) pair of this trajectory, oldest
            first; ``len(past)`` is the number of steps already taken (k).
        history: how many of the most recent pairs to show (h); 0 always uses the
            no-history template.
        response_format: ``"think"`` (verl-agent layout) or ``"action"`` (compact layout).
    """
    _check_format(response_format)
    if history < 0:
        raise ValueError(f"history must be >= 0, got {history}")
    k = len(past)
    shown = list(past[-history:]) if history > 0 and k > 0 else []
    if response_format == "action":
        return _render_compact(observation, shown)
    actions = ", ".join(f"'{a}'" for a in observation.admissible_actions)
    lines = [INTRO, observation.task]
    if shown:
        first = k - len(shown) + 1  # 1-based step number of the oldest pair shown
        steps = f"You have taken {k} step{'s' if k != 1 else ''} so far."
        if len(shown) == 1:
            lines.append(f"{steps} The last observation and the action you took after it were:")
        else:
            lines.append(
                f"{steps} The last {len(shown)} observations and the actions you took after "
                "them were:"
            )
        for j, (obs_text, action) in enumerate(shown, start=first):
            lines.append(f"[Observation {j}: '{obs_text}', Action {j}: '{action}']")
        lines.append(
            f"You are now at step {k + 1} and your current observation is: {observation.text}"
        )
    else:
        lines.append(f"Your current observation is: {observation.text}")
    lines.append(f"Your admissible actions now are: [{actions}].")
    lines.append("")
    lines.append(_INSTRUCTION[response_format])
    return "\n".join(lines) + "\n"


def _render_compact(observation: Observation, shown: Sequence[tuple[str, str]]) -> str:
    """The action-format prompt: the same facts as the verl-agent layout, in few tokens.

    Every action (history, admissible list, response) starts a line, so it tokenizes the
    same everywhere and the response is a copy of one admissible line; the task is restated
    last, right before the response, where a small model reads it most easily.
    """
    lines: list[str] = []
    for obs_text, action in shown:
        lines += [f"Observation: {obs_text}", "Action:", action]
    lines.append(f"Observation: {observation.text}")
    lines.append("Admissible actions:")
    lines += list(observation.admissible_actions)
    lines += [observation.task, "Action:"]
    return "\n".join(lines) + "\n"


def default_response_format(tokenizer: Any) -> str:
    """``"think"`` for a tokenizer with a chat template (instruct models), else ``"action"``."""
    return "think" if getattr(tokenizer, "chat_template", None) else "action"


def encode_prompt(tokenizer: Any, text: str, *, thinking: bool | None = None) -> list[int]:
    """Token ids of a rendered prompt, ready for the model to continue with the response.

    With a chat template the text becomes one user message followed by the generation
    prompt (``thinking``, when given, is the template's ``enable_thinking``); without one the
    text is tokenized as is (the tiny tokenizer adds BOS).
    """
    return encode_prompts(tokenizer, [text], thinking=thinking)[0]


def encode_prompts(
    tokenizer: Any, texts: Sequence[str], *, thinking: bool | None = None
) -> list[list[int]]:
    """:func:`encode_prompt` of each text, in one tokenizer call: the same ids as one call
    per text (a fast tokenizer encodes a batch in Rust without holding Python's GIL, so a
    batch tokenized in another thread runs beside the decoder)."""
    if not texts:
        return []
    if getattr(tokenizer, "chat_template", None):
        switch = {} if thinking is None else {"enable_thinking": thinking}
        chats = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=False,
                **switch,
            )
            for text in texts
        ]
        return [list(ids) for ids in tokenizer(chats, add_special_tokens=False)["input_ids"]]
    return [list(ids) for ids in tokenizer(list(texts))["input_ids"]]


def prompt_ids(
    tokenizer: Any,
    observation: Observation,
    past: Sequence[tuple[str, str]] = (),
    *,
    history: int = 2,
    response_format: str = "action",
    max_prompt_tokens: int | None = None,
) -> tuple[list[int], str]:
    """The prompt ids of one decision as the rollout builds them, within a token budget.

    Returns ``(ids, fit)`` with ``fit`` one of ``"full"``, ``"no_history"`` (the prompt was
    over ``max_prompt_tokens`` and was re-rendered without history: verl-agent's WebShop
    rule, made general) or ``"cut"`` (still over: its oldest tokens were dropped).
    SFT uses this too, so that demonstrations see exactly the prompts of RL.
    """
    return prompts_ids(
        tokenizer,
        [(observation, past)],
        history=history,
        response_format=response_format,
        max_prompt_tokens=max_prompt_tokens,
    )[0]


def prompts_ids(
    tokenizer: Any,
    decisions: Sequence[tuple[Observation, Sequence[tuple[str, str]]]],
    *,
    history: int = 2,
    response_format: str = "action",
    max_prompt_tokens: int | None = None,
) -> list[tuple[list[int], str]]:
    """:func:`prompt_ids` of each ``(observation, past)``, the texts of each pass tokenized
    in one call (:func:`encode_prompts`): the same ids and fits as one call per decision."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1 or None, got {max_prompt_tokens}")
    thinking = response_format == "think"

    def encode(items: Sequence[int], h: int) -> list[list[int]]:
        texts = [
            render_prompt(decisions[i][0], decisions[i][1], history=h,
                          response_format=response_format)
            for i in items
        ]  # fmt: skip
        return encode_prompts(tokenizer, texts, thinking=thinking)

    out = [(ids, "full") for ids in encode(range(len(decisions)), history)]
    if max_prompt_tokens is None:
        return out
    over = [i for i, (ids, _) in enumerate(out) if len(ids) > max_prompt_tokens]
    again = [i for i in over if history > 0 and decisions[i][1]]
    for i, ids in zip(again, encode(again, 0), strict=True):
        out[i] = (ids, "no_history")
    for i in over:
        ids = out[i][0]
        if len(ids) > max_prompt_tokens:
            out[i] = (ids[-max_prompt_tokens:], "cut")
    return out


def format_response(action: str, response_format: str, thought: str = "") -> str:
    """The response text that states ``action`` in a format (used for SFT targets)."""
    _check_format(response_format)
    if response_format == "think":
        return f"<think>{thought}</think><action>{action}</action>"
    return action


def encode_response(tokenizer: Any, text: str) -> list[int]:
    """Response token ids for training targets: the text's tokens, then EOS."""
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token_id; set tokenizer.eos_token first")
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


def stop_strings(response_format: str) -> tuple[str, ...]:
    """Strings that end a sampled response (besides EOS) in a response format."""
    _check_format(response_format)
    return ("</action>",) if response_format == "think" else ("\n",)
