"""The registry of environment factories: name -> ``factory(**options) -> Env``.

:class:`EnvRegistry` holds the built-in factories (and any set in-process), then the
factories that installed packages register under the entry point group ``mcgpo.envs``
(docs/envs/your-own.md). Entry points are read on first need and a plugin's module is
imported only when its environment is built; built-in names are reserved.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, MutableMapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from mcgpo.envs.protocol import Env

__all__ = ["ENTRY_POINT_GROUP", "EnvPluginError", "EnvRegistry", "PluginFactory"]

ENTRY_POINT_GROUP = "mcgpo.envs"
ENV_MEMBERS = ("reset", "step", "expert_action", "max_turns")  # what a factory must return


class EnvPluginError(ImportError):
    """A ``mcgpo.envs`` entry point cannot be loaded, or is not an environment factory."""


def _spelled(ep: EntryPoint) -> str:
    return f"{ep.name} = {ep.value}"


class PluginFactory:
    """The factory of one ``mcgpo.envs`` entry point, imported on its first call."""

    def __init__(self, entry_point: EntryPoint) -> None:
        self.entry_point = entry_point
        self._factory: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        return f"PluginFactory({_spelled(self.entry_point)!r})"

    def load(self) -> Callable[..., Any]:
        """The entry point's callable; EnvPluginError (one line) when it cannot be had."""
        if self._factory is None:
            where = f"entry point '{_spelled(self.entry_point)}' ({ENTRY_POINT_GROUP})"
            try:
                factory = self.entry_point.load()
            except Exception as err:  # any import-time error of a user's module
                first = (str(err).splitlines() or [""])[0]
                raise EnvPluginError(
                    f"{where} failed to load: {type(err).__name__}: {first}"
                ) from None
            if not callable(factory):
                raise EnvPluginError(f"{where} is not callable: {type(factory).__name__}")
            self._factory = factory
        return self._factory

    def __call__(self, **options: Any) -> Env:
        env = self.load()(**options)
        missing = [member for member in ENV_MEMBERS if not hasattr(env, member)]
        if missing:
            raise TypeError(
                f"entry point '{_spelled(self.entry_point)}' returned an instance of {type(env).__name__}, "
                f"not an Env: it lacks {', '.join(missing)}"
            )
        return env


class EnvRegistry(MutableMapping[str, Callable[..., Env]]):
    """Name -> environment factory: the built-in ones (and any set here), then the plugins.

    Plugins (entry point group ``mcgpo.envs``) are read when a name not set here is looked
    up or the names are listed, again whenever ``sys.path`` has changed; a name set here
    (built in, or ``ENVIRONMENTS[name] = factory``) wins over a plugin of the same name.
    """

    def __init__(self, factories: dict[str, Callable[..., Env]]) -> None:
        self._factories = dict(factories)
        self._reserved = frozenset(factories)
        self._plugins: dict[str, PluginFactory] = {}
        self._read_for: tuple[str, ...] | None = None

    def plugins(self) -> dict[str, PluginFactory]:
        """The installed ``mcgpo.envs`` entry points by name (none imported yet)."""
        if self._read_for != tuple(sys.path):
            self._read_for = tuple(sys.path)
            found: dict[str, PluginFactory] = {}
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                if ep.name in self._reserved:
                    warnings.warn(
                        f"ignoring entry point '{_spelled(ep)}' ({ENTRY_POINT_GROUP}): "
                        f"{ep.name!r} is a built-in environment",
                        stacklevel=2,
                    )
                elif ep.name not in found:  # the first on sys.path wins, as for imports
                    old = self._plugins.get(ep.name)
                    same = old is not None and old.entry_point == ep
                    found[ep.name] = old if same else PluginFactory(ep)
            self._plugins = found
        return self._plugins

    def __getitem__(self, name: str) -> Callable[..., Env]:
        if name in self._factories:
            return self._factories[name]
        return self.plugins()[name]

    def __setitem__(self, name: str, factory: Callable[..., Env]) -> None:
        self._factories[name] = factory

    def __delitem__(self, name: str) -> None:
        del self._factories[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._factories
        yield from (name for name in self.plugins() if name not in self._factories)

    def __len__(self) -> int:
        return sum(1 for _ in self)
