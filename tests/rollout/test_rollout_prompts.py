"""Prompt rendering: exact golden texts, history window, formats, chat template, encoding."""

from __future__ import annotations

import pytest

from mcgpo.envs.protocol import Observation
from mcgpo.rollout import (
    default_response_format,
    encode_prompt,
    encode_response,
    format_response,
    prompt_ids,
    render_prompt,
    stop_strings,
)
from mcgpo.rollout.prompts import encode_prompts, prompts_ids

OBS = Observation(
    text="The counter shows 2.",
    task="Your task is to: count to 4.",
    admissible_actions=("step", "wait"),
)
PAST = [
    ("The counter shows 0.", "step"),
    ("The counter shows 1.", "wait"),
    ("The counter shows 1.", "step"),
]


def test_golden_prompt_with_history_two_of_three_steps():
    # the verl-agent layout (think format; the action format's instruction line shown here
    # is swapped for the think one below). k = 3 steps taken, h = 2: the pairs of steps 2 and 3 are shown, numbered 2 and 3, and
    # the current step is k + 1 = 4.
    expected = (
        "You are an expert agent acting in a text-based environment.\n"
        "Your task is to: count to 4.\n"
        "You have taken 3 steps so far. The last 2 observations and the actions you took "
        "after them were:\n"
        "[Observation 2: 'The counter shows 1.', Action 2: 'wait']\n"
        "[Observation 3: 'The counter shows 1.', Action 3: 'step']\n"
        "You are now at step 4 and your current observation is: The counter shows 2.\n"
        "Your admissible actions now are: ['step', 'wait'].\n"
        "\n"
        "Now it is your turn to act. Reply with exactly one admissible action on a single "
        "line and nothing else.\n"
    )
    assert render_prompt(OBS, PAST, history=2, response_format="think") == expected.replace(
        _ACTION_LINE, _THINK_LINE
    )


_ACTION_LINE = (
    "Now it is your turn to act. Reply with exactly one admissible action on a single "
    "line and nothing else.\n"
)
_THINK_LINE = (
    "Now it is your turn to act. First reason step by step about the current situation "
    "inside <think> </think> tags. Then choose one admissible action and write it inside "
    "<action> </action> tags.\n"
)


def test_golden_compact_action_prompt_with_history_two_of_three_steps():
    # the action format's compact layout: the last h = 2 pairs (steps 2 and 3), each action
    # on its own line after "Action:", the current observation, one admissible action per
    # line, then the task and "Action:" so that the response is the next line.
    expected = (
        "Observation: The counter shows 1.\n"
        "Action:\n"
        "wait\n"
        "Observation: The counter shows 1.\n"
        "Action:\n"
        "step\n"
        "Observation: The counter shows 2.\n"
        "Admissible actions:\n"
        "step\n"
        "wait\n"
        "Your task is to: count to 4.\n"
        "Action:\n"
    )
    assert render_prompt(OBS, PAST, history=2, response_format="action") == expected
    # no history (first step, or h = 0): the same layout from the current observation on
    bare = expected[expected.index("Observation: The counter shows 2.") :]
    assert render_prompt(OBS, [], history=2, response_format="action") == bare
    assert render_prompt(OBS, PAST, history=0, response_format="action") == bare


def test_golden_first_step_uses_the_no_history_template():
    expected = (
        "You are an expert agent acting in a text-based environment.\n"
        "Your task is to: count to 4.\n"
        "Your current observation is: The counter shows 2.\n"
        "Your admissible actions now are: ['step', 'wait'].\n"
        "\n"
        "Now it is your turn to act. First reason step by step about the current situation "
        "inside <think> </think> tags. Then choose one admissible action and write it inside "
        "<action> </action> tags.\n"
    )
    assert render_prompt(OBS, [], history=2, response_format="think") == expected
    # history = 0 always renders the no-history template, whatever the past
    assert render_prompt(OBS, PAST, history=0, response_format="think") == expected


def test_one_step_taken_is_singular_and_numbered_one():
    text = render_prompt(OBS, PAST[:1], history=2, response_format="think")
    assert (
        "You have taken 1 step so far. The last observation and the action you took after "
        "it were:\n[Observation 1: 'The counter shows 0.', Action 1: 'step']\n"
        "You are now at step 2 and your current observation is: The counter shows 2.\n"
    ) in text


def test_history_window_shows_only_the_last_h_pairs():
    text = render_prompt(OBS, PAST, history=1, response_format="think")
    assert "Observation 3" in text and "Observation 2" not in text
    text = render_prompt(OBS, PAST, history=5, response_format="think")  # fewer pairs than h
    assert all(f"Observation {j}:" in text for j in (1, 2, 3))
    assert "The last 3 observations" in text
    # compact layout: h = 1 shows one earlier observation, h = 5 all three (plus the current)
    assert render_prompt(OBS, PAST, history=1).count("Observation:") == 2
    assert render_prompt(OBS, PAST, history=5).count("Observation:") == 4


def test_bad_format_and_history_are_rejected():
    with pytest.raises(ValueError, match="unknown response_format 'json'"):
        render_prompt(OBS, [], response_format="json")
    with pytest.raises(ValueError, match="history must be >= 0"):
        render_prompt(OBS, [], history=-1)
    with pytest.raises(ValueError, match="unknown response_format"):
        format_response("look", "xml")


def test_response_formats_and_stop_strings():
    assert format_response("go to fridge 1", "action") == "go to fridge 1"
    assert (
        format_response("go to fridge 1", "think", thought="the apple is cold")
        == "<think>the apple is cold</think><action>go to fridge 1</action>"
    )
    assert stop_strings("think") == ("</action>",)
    assert stop_strings("action") == ("\n",)


def test_plain_tokenizer_encoding_and_default_format(counter_policy):
    _, tok = counter_policy
    assert default_response_format(tok) == "action"
    text = render_prompt(OBS, PAST)
    ids = encode_prompt(tok, text)
    assert ids[0] == tok.bos_token_id  # plain prompt starts with BOS
    assert tok.decode(ids, skip_special_tokens=True) == text  # exact, no space clean-up
    target = encode_response(tok, "step")
    assert target[-1] == tok.eos_token_id
    assert tok.decode(target[:-1]) == "step"


def test_chat_template_wraps_the_prompt_as_one_user_message(counter_policy):
    _, tok = counter_policy
    chat = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token)
    chat.chat_template = (
        "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<<assistant>>{% endif %}"
    )
    assert default_response_format(chat) == "think"
    ids = encode_prompt(chat, "hello")
    assert chat.decode(ids) == "<<user>>hello<<assistant>>"


def test_prompt_ids_budget_falls_back_to_no_history_then_cuts(counter_policy):
    _, tok = counter_policy
    full = encode_prompt(tok, render_prompt(OBS, PAST, history=2))
    bare = encode_prompt(tok, render_prompt(OBS, PAST, history=0))
    assert len(bare) < len(full)
    assert prompt_ids(tok, OBS, PAST) == (full, "full")
    assert prompt_ids(tok, OBS, PAST, max_prompt_tokens=len(full)) == (full, "full")
    assert prompt_ids(tok, OBS, PAST, max_prompt_tokens=len(full) - 1) == (bare, "no_history")
    assert prompt_ids(tok, OBS, PAST, max_prompt_tokens=10) == (bare[-10:], "cut")
    first = encode_prompt(tok, render_prompt(OBS, []))  # no history to drop: cut at once
    assert prompt_ids(tok, OBS, [], max_prompt_tokens=10) == (first[-10:], "cut")
    with pytest.raises(ValueError, match="max_prompt_tokens must be >= 1 or None, got 0"):
        prompt_ids(tok, OBS, PAST, max_prompt_tokens=0)


def test_a_batch_of_decisions_gives_each_ones_ids_and_fit(counter_policy):
    """prompts_ids tokenizes each pass in one call: per decision exactly what prompt_ids
    gives alone, budget fallbacks included, in order; so does encode_prompts, also with a
    chat template."""
    _, tok = counter_policy
    full = len(encode_prompt(tok, render_prompt(OBS, PAST, history=2)))
    decisions = [(OBS, PAST), (OBS, []), (OBS, PAST[:1]), (OBS, PAST)]
    for budget in (None, full, full - 1, 10):
        alone = [prompt_ids(tok, o, p, max_prompt_tokens=budget) for o, p in decisions]
        together = prompts_ids(tok, decisions, max_prompt_tokens=budget)
        assert together == alone, budget
    fits = {fit for _, fit in prompts_ids(tok, decisions, max_prompt_tokens=full - 1)}
    assert fits == {"full", "no_history"}  # the mixed case: some fall back, some do not
    assert prompts_ids(tok, [], max_prompt_tokens=5) == []
    chat = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token)
    chat.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    texts = ["hello", "a longer prompt", ""]
    assert encode_prompts(chat, texts) == [encode_prompt(chat, t) for t in texts]
