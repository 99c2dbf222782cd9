"""What every run-config dataclass is built from: :class:`ConfigError` (a wrong key or value,
one line naming the key), :func:`option` (a field with its ``--help`` line) and the value
checks the ``check`` methods share (:mod:`mcgpo.training.config`,
:mod:`mcgpo.training.train_config`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["ConfigError", "at_least", "choice", "option", "positive"]


class ConfigError(ValueError):
    """A configuration value or key is wrong; the message is one line naming the key."""


def option(default: Any, help: str) -> Any:
    """A config field: its default and its ``--help`` line."""
    return field(default=default, metadata={"help": help})


def at_least(key: str, value: float, low: float) -> None:
    if not value >= low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")


def positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(options)}; got {value!r}")
