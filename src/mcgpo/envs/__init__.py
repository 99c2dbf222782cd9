"""Environments behind one protocol, chosen by name: the built-in ones and the users' own.

``ENVIRONMENTS`` maps a name to a factory (``factory(**options) -> Env``);
``make_env(name, **options)`` builds one. Built-in factories import their module lazily so
that optional extras (alfworld, textworld-express) are needed only when used.

Users' own environments come from the entry point group ``mcgpo.envs`` of any installed
package (``[project.entry-points."mcgpo.envs"] my-env = "my_pkg:make"``; docs/envs/your-own.md).
They are found the first time a name that is not built in is looked up (or the names are
listed), and a plugin's module is imported only when its environment is built, so
``import mcgpo`` imports no plugin. The built-in names are reserved: a plugin registering
``household`` (or another built-in name) is ignored, with a warning naming its entry point.
A plugin that fails to load raises :class:`EnvPluginError`, one line naming the entry point
(``my-env = my_pkg:make``) and the error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcgpo.envs.protocol import SPLITS, Context, Env, Observation, StepResult, closest
from mcgpo.envs.registry import ENTRY_POINT_GROUP, EnvPluginError, EnvRegistry

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENVIRONMENTS",
    "SPLITS",
    "Context",
    "Env",
    "EnvPluginError",
    "EnvRegistry",
    "Observation",
    "StepResult",
    "env_named",
    "make_env",
]


def _household(**options: Any) -> Env:
    from mcgpo.envs.household import HouseholdEnv

    return HouseholdEnv(**options)


def _webshop(**options: Any) -> Env:
    from mcgpo.envs.webshop import WebShopEnv

    return WebShopEnv(**options)


def _alfworld(**options: Any) -> Env:
    from mcgpo.envs.alfworld import AlfworldEnv

    return AlfworldEnv(**options)


def _textworld_express(**options: Any) -> Env:
    from mcgpo.envs.textworld_express import TextWorldExpressEnv

    return TextWorldExpressEnv(**options)


def _remote(**options: Any) -> Env:
    try:
        from mcgpo.envs.serving.client import RemoteEnv
    except ImportError as err:  # httpx missing: one line naming the extra
        raise ImportError(
            f"the remote environment needs the serve extra ({err}): pip install 'mcgpo[serve]'"
        ) from None
    return RemoteEnv(**options)


BUILT_IN: dict[str, Callable[..., Env]] = {
    "household": _household,
    "webshop": _webshop,
    "alfworld": _alfworld,
    "textworld-express": _textworld_express,
    "remote": _remote,  # an environment served by `mcgpo env serve` (docs/envs/serving.md)
}


ENVIRONMENTS = EnvRegistry(BUILT_IN)


def env_named(name: str) -> Callable[..., Env]:
    """The factory of the environment ``name`` (nothing is built or imported yet); an unknown
    name raises ValueError with the closest known one."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        hint = closest(name, ENVIRONMENTS)
        raise ValueError(
            f"unknown environment {name!r}{hint}; known: {', '.join(ENVIRONMENTS)} "
            f"(or install a package with a {ENTRY_POINT_GROUP!r} entry point)"
        ) from None


def make_env(name: str, **options: Any) -> Env:
    """Build the environment ``name`` with its options; unknown names raise ValueError.

    A plugin that cannot be loaded raises :class:`EnvPluginError` (an ImportError) with one
    line naming its entry point and the error.
    """
    return env_named(name)(**options)
