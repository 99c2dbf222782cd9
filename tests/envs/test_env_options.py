"""An option an environment does not take is one line naming it, the closest option the
environment has and all of them, read off the constructor's signature
(:func:`mcgpo.envs.protocol.unknown_option`), for every built-in local environment."""

from __future__ import annotations

import inspect

import pytest

from mcgpo.envs import make_env
from mcgpo.envs.alfworld.env import AlfworldEnv
from mcgpo.envs.household import HouseholdEnv
from mcgpo.envs.protocol import unknown_option
from mcgpo.envs.webshop import WebShopEnv


def corridor(length: int, *, colour: str = "red", **rest: object) -> None:
    """A factory with a positional option, a keyword-only one and free-form ones."""


def test_the_message_names_the_closest_option_and_every_option():
    # 'lenght' against 'length': difflib's ratio 2*5/12 = 0.83 >= 0.6; 'colour' is further
    assert unknown_option("corridor", {"lenght": 1}, corridor) == (
        "unknown corridor option 'lenght' (did you mean 'length'?); known: length, colour"
    )
    # nothing close: no hint; of several unknown options the first in sorted order is named
    assert unknown_option("corridor", {"zz": 1, "size": 2}, corridor) == (
        "unknown corridor option 'size'; known: length, colour"
    )


BUILT_IN = [("household", HouseholdEnv), ("webshop", WebShopEnv), ("alfworld", AlfworldEnv)]


@pytest.mark.parametrize(("name", "env_class"), BUILT_IN)
def test_each_built_in_env_names_its_own_options_with_a_did_you_mean(name, env_class):
    with pytest.raises(ValueError) as err:
        make_env(name, max_turn=5)
    message = str(err.value)
    assert message.startswith(f"unknown {name} option 'max_turn' (did you mean 'max_turns'?)")
    assert "\n" not in message
    listed = message.split("; known: ")[1].split(", ")
    taken = [p for p in inspect.signature(env_class).parameters if p != "unknown"]
    assert listed == taken and "max_turns" in listed
