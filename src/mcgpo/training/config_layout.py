"""The nested-dict (TOML) layout of a run config: reading it and writing it flat.

:func:`from_dict` applies a nested dict, as a preset or ``config.toml`` holds it (top-level
scalars, one table per section; component options flat in ``[algo]`` and ``[env]``,
``[algo.pairs]`` and ``[algo.<estimator>]`` tables), onto a :class:`RunConfig`; values are
checked or parsed by :func:`coerce` / :func:`parse_scalar` (command-line strings read as
TOML would). :func:`flatten` gives the dotted key of every setting, :func:`scalar_fields`
and :func:`field_type` the one-value fields that become flags. The dataclasses themselves,
their defaults and checks are :mod:`mcgpo.training.config`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from mcgpo.options import did_you_mean, parse_scalar
from mcgpo.training.config import ConfigError, RunConfig

__all__ = [
    "OPTION_FIELDS",
    "RECORD_TABLES",
    "SECTIONS",
    "coerce",
    "field_type",
    "flatten",
    "from_dict",
    "parse_scalar",
    "scalar_fields",
]


SECTIONS = ("env", "rollout", "algo", "train", "eval", "sft")

# Tables a run's config.toml holds beside the settings, skipped when it is read as a config:
# ``[code]``, the code that ran (mcgpo.training.run_folder.code_version).
RECORD_TABLES = ("code",)


# Sections whose unknown keys are options of a component (estimator, environment), kept in
# this dict field; they appear flat in TOML and on the command line ([algo] omega = 0.2).
OPTION_FIELDS = {"algo": "estimator", "env": "options"}


def scalar_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a config dataclass that hold one value (not sections or option dicts)."""
    return [
        f
        for f in fields(cls)
        if f.name not in SECTIONS
        and f.name not in ("estimator", "pairs", "per_estimator", "options")
        and f.init
    ]


def field_type(f: dataclasses.Field) -> type:
    """The Python type of a scalar config field (annotations are strings here)."""
    return {"str": str, "int": int, "float": float, "bool": bool}[str(f.type)]


def from_dict(data: Mapping[str, Any], base: RunConfig | None = None, where: str = "") -> RunConfig:
    """Apply a nested dict (TOML layout) onto ``base``; unknown keys raise ConfigError.

    Layout: top-level scalars, then one table per section; inside ``[algo]`` any key that is
    not an AlgoConfig field is an estimator option, ``[algo.pairs]`` holds preference
    options and ``[algo.<estimator>]`` the options of one estimator, used when the algorithm
    runs it (all checked later against the chosen algorithm, in ``resolve_algo``).
    """
    base = base or RunConfig()
    prefix = f"{where}: " if where else ""
    top: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    known_top = {f.name: f for f in scalar_fields(RunConfig)}
    for key, value in data.items():
        if key in RECORD_TABLES:
            continue
        if key in SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{prefix}{key} must be a table")
            sections[key] = value
        elif key in known_top:
            top[key] = coerce(key, value, field_type(known_top[key]), prefix)
        else:
            raise ConfigError(f"{prefix}unknown key {key!r}{did_you_mean(key, known_top)}")
    for name, table in sections.items():
        section = getattr(base, name)
        known = {f.name: f for f in scalar_fields(type(section))}
        updates: dict[str, Any] = {}
        extra_field = OPTION_FIELDS.get(name)
        extra: dict[str, Any] = dict(getattr(section, extra_field)) if extra_field else {}
        pairs: dict[str, Any] = dict(section.pairs) if name == "algo" else {}
        tables = {k: dict(v) for k, v in section.per_estimator.items()} if name == "algo" else {}
        for key, value in table.items():
            if key in known:
                updates[key] = coerce(f"{name}.{key}", value, field_type(known[key]), prefix)
            elif name == "algo" and key == "pairs":
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{prefix}algo.pairs must be a table")
                pairs.update(value)
            elif name == "algo" and isinstance(value, Mapping):  # [algo.<estimator>]
                tables.setdefault(key, {}).update(value)
            elif extra_field and not isinstance(value, Mapping):
                extra[key] = value
            else:
                close = did_you_mean(f"{name}.{key}", [f"{name}.{k}" for k in known])
                raise ConfigError(f"{prefix}unknown key '{name}.{key}'{close}")
        if extra_field:
            updates[extra_field] = extra
        if name == "algo":
            updates["pairs"] = pairs
            updates["per_estimator"] = tables
        top[name] = dataclasses.replace(section, **updates)
    return dataclasses.replace(base, **top)


def coerce(key: str, value: Any, kind: type, prefix: str = "") -> Any:
    """Check or convert one value to ``kind`` (strings from the command line are parsed)."""
    if isinstance(value, str) and kind is not str:
        value = parse_scalar(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{prefix}{key}: expected true or false, got {value!r}")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{prefix}{key}: expected an integer, got {value!r}")
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{prefix}{key}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{prefix}{key}: expected a number, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"{prefix}{key}: expected a string, got {value!r}")
    return value


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every setting (sections and option dicts included)."""
    out: dict[str, Any] = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            out.update(flatten(value, key + "."))
        elif f.name in OPTION_FIELDS.values():
            out.update({f"{prefix}{k}": v for k, v in value.items()})
        elif f.name == "per_estimator":  # algo.<estimator>.<option>
            out.update(
                {f"{prefix}{e}.{k}": v for e, opts in value.items() for k, v in opts.items()}
            )
        elif isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out
