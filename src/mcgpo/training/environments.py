"""A run's environments from its config: the options as typed values and a picklable factory
that has built one environment as a check. Free of torch, so that ``mcgpo bench``, ``ablate``
and ``sweep`` check every run's environment before anything heavy loads;
:mod:`mcgpo.training.build` names both too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import parse_scalar

__all__ = ["env_factory", "typed_env_options"]


def env_factory(cfg: RunConfig) -> Callable[[], Any]:
    """A no-argument factory of fresh environments of ``cfg.env.name``; picklable
    (:class:`~mcgpo.envs.workers.EnvSpec`), so that worker processes can build them too."""
    from mcgpo.envs.workers import EnvSpec

    name = cfg.env.name
    make = EnvSpec(name, typed_env_options(cfg))
    try:
        probe = (
            make()
        )  # a bad name or option, or a missing extra, is reported before any model work
    except (ValueError, TypeError, ImportError) as err:
        raise ConfigError(f"env {name!r}: {str(err).splitlines()[0]}") from None
    close = getattr(probe, "close", None)
    if callable(close):  # a JVM (TextWorld-Express), a server session: not kept for a probe
        close()
    return make


def typed_env_options(cfg: RunConfig) -> dict[str, Any]:
    """Environment options with command-line strings read as TOML would (12 -> int)."""
    return {k: parse_scalar(v) if isinstance(v, str) else v for k, v in cfg.env.options.items()}
