"""The verl plugin's mcgpo.rollout keys, without verl (runs in the main suite): every key of
mcgpo's RolloutConfig is read by the plugin, governed by verl (refused naming verl's key)
or mcgpo's own rollout loop's (refused saying why), so none is ignored without a word; a
key added to RolloutConfig fails here until it is sorted into one of the three (the plugin's
own keys passing is test_verl_configs.py's, with verl's composed configs)."""

from __future__ import annotations

import dataclasses

import pytest

from mcgpo.integrations.verl.config import (
    ROLLOUT_KEYS_IN_VERL,
    ROLLOUT_KEYS_MCGPO_ONLY,
    ROLLOUT_KEYS_USED,
    plugin_config,
)
from mcgpo.training.config import ConfigError, RolloutConfig


def test_every_rollout_key_is_read_or_refused_exactly_once():
    fields = {f.name for f in dataclasses.fields(RolloutConfig)}
    groups = [set(ROLLOUT_KEYS_USED), set(ROLLOUT_KEYS_IN_VERL), set(ROLLOUT_KEYS_MCGPO_ONLY)]
    assert set().union(*groups) == fields
    assert sum(len(g) for g in groups) == len(fields)  # no key in two of them


@pytest.mark.parametrize(
    ("key", "value"),
    [("overlap_env", True), ("overlap_pieces", 3), ("batch_invariant", True)],
)
def test_keys_of_mcgpos_own_rollout_loop_are_refused_saying_why(key, value):
    config = {"mcgpo": {"rollout": {key: value}}}
    with pytest.raises(ConfigError, match=rf"^mcgpo.rollout.{key}: mcgpo train's own rollouts"):
        plugin_config(config)
