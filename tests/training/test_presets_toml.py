"""The config writer (``to_toml``, on tomli-w): what a run folder's config.toml holds reads
back to the same RunConfig, and its first line is the command."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import from_dict
from mcgpo.training.presets import parse_toml, preset_command, to_toml

# One value in every section, option dicts included, with the values a hand-written TOML
# writer gets wrong: quotes, backslashes, non-ASCII text, a tab, bools, a small float
# (repr "1e-06"), a large one, lists.
EVERY_SECTION = {
    "model": 'C:\\models\\"tiny" é 模型',
    "out": "runs/it's\there",
    "preset": "household-quick",
    "seed": 7,
    "deterministic": True,
    "save_rollouts": True,
    "tensorboard": False,
    "env": {
        "name": "household",
        "max_turns": 15,
        "n_receptacles": 12,
        "task_types": ["pick", "clean"],
        "label": 'say "hi"\\n',
    },
    "rollout": {"groups": 4, "group_size": 8, "temperature": 0.7, "response_format": "action"},
    "algo": {
        "name": "mcgpo",
        "lambda_pair": 0.3,
        "eps": 1e-6,
        "cross_steps": True,
        "pairs": {"kappa": 2, "epsilon": 0.25, "evidence": "same_fold"},
    },
    "train": {"lr": 1e-6, "kl_coef": 0.0, "kl_kind": "k3", "updates": 3},
    "eval": {"every": 2, "tasks": 16, "temperature": 0.4},
    "sft": {"demos": 10, "lr": 5e-3, "noise": 1.5e300},
}


def round_trip(cfg: RunConfig, command: str = "") -> RunConfig:
    return from_dict(parse_toml(to_toml(cfg, command)))


def test_a_config_with_every_section_reads_back_the_same():
    cfg = from_dict(EVERY_SECTION)
    assert cfg.env.options["label"] == 'say "hi"\\n' and cfg.algo.pairs["kappa"] == 2
    assert round_trip(cfg) == cfg
    text = to_toml(cfg, "mcgpo train --preset household-quick")
    assert text.splitlines()[0] == "# mcgpo train --preset household-quick"
    assert "eps = 1e-06" in text and "[algo.pairs]" in text and "deterministic = true" in text


def test_the_first_line_is_the_command_and_stays_one_line(tmp_path):
    command = 'mcgpo train --out "a\nb" --env.label x\ty\x01'
    text = to_toml(RunConfig(), command)
    first = text.splitlines()[0]
    assert first == '# mcgpo train --out "a\\nb" --env.label x\ty\\x01'
    assert round_trip(RunConfig(), command) == RunConfig()  # still valid TOML
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    assert preset_command(str(path)) == first[2:]  # what `mcgpo presets` would print
    assert to_toml(RunConfig()).splitlines()[0] == "# resolved mcgpo config"


def test_options_left_at_none_are_named_in_a_comment_and_dropped():
    cfg = RunConfig()
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, pairs={"fold_split": None}))
    text = to_toml(cfg, "mcgpo train")
    assert text.splitlines()[1] == "# left at their default of none: algo.pairs.fold_split"
    assert round_trip(cfg).algo.pairs == {}


def test_a_value_toml_cannot_hold_is_one_config_error():
    cfg = RunConfig()
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, options={"x": object()}))
    with pytest.raises(ConfigError, match="config cannot be written to TOML"):
        to_toml(cfg)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
    number=st.floats(allow_nan=False, allow_infinity=False),
    flag=st.booleans(),
    items=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
)
def test_any_string_float_bool_and_list_reads_back(text, number, flag, items):
    cfg = from_dict(
        {
            "model": text or "tiny",
            "env": {"label": text, "scale": number, "flag": flag, "items": items},
            "algo": {"name": "mcgpo", "eps": number, "pairs": {"tag": text}},
        }
    )
    assert round_trip(cfg, command=f"mcgpo train --model {text}") == cfg
