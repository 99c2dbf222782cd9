"""Presets: small TOML files that set a scale or a paper's recipe; writing a config as TOML.

The presets ship inside the package (``mcgpo/presets/<name>.toml``) so that
``mcgpo train --preset household-quick`` works from any folder after ``pip install``;
``configs/`` in the repository only points here (one source, no copies to drift). A preset
may also be given as the path of any TOML file, e.g. a run folder's ``config.toml``, which
reproduces that run. The first comment line of each preset is the command that runs it.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w

from mcgpo.training.config import ConfigError, RunConfig
from mcgpo.training.config_layout import flatten

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "available_presets",
    "comment_text",
    "load_preset",
    "parse_toml",
    "preset_command",
    "to_toml",
]


def available_presets() -> list[str]:
    """Names of the presets shipped with the package."""
    folder = resources.files("mcgpo") / "presets"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _preset_text(name: str) -> tuple[str, str]:
    if name.endswith(".toml") or "/" in name:
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"preset file {name!r} not found")
        return path.read_text(encoding="utf-8"), str(path)
    resource = resources.files("mcgpo") / "presets" / f"{name}.toml"
    if not resource.is_file():
        from mcgpo.options import did_you_mean

        names = available_presets()
        raise ConfigError(
            f"unknown preset {name!r}{did_you_mean(name, names)}; known: {', '.join(names)}"
        )
    return resource.read_text(encoding="utf-8"), f"preset {name}"


def parse_toml(text: str, where: str = "TOML") -> dict[str, Any]:
    """Parse TOML text (tomllib, or tomli on Python 3.10); errors become ConfigError."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: not valid TOML ({err})") from None


def load_preset(name: str) -> dict[str, Any]:
    """The nested dict of a preset (by name or path); TOML errors become ConfigError."""
    text, where = _preset_text(name)
    return parse_toml(text, where)


def preset_command(name: str) -> str:
    """The command on the preset's first comment line (without the leading '# ')."""
    text, _ = _preset_text(name)
    first = text.splitlines()[0] if text else ""
    return first.lstrip("#").strip()


def to_toml(cfg: RunConfig, command: str = "") -> str:
    """The resolved config as TOML (written by ``tomli-w``), loadable with ``--preset <file>``.

    ``command`` becomes the first comment line (the command that produced the run; control
    characters in it are written escaped, ``\\n``, so that the comment stays one valid
    line). TOML has no null: options left at a default of ``None`` are named in a second
    comment line.
    """
    tables: dict[str, Any] = {}
    unset = []
    for key, value in flatten(cfg).items():
        if value is None:
            unset.append(key)
            continue
        *path, name = key.split(".")
        table = tables
        for part in path:
            table = table.setdefault(part, {})
        table[name] = value
    lines = [f"# {comment_text(command)}" if command else "# resolved mcgpo config"]
    if unset:
        lines.append(f"# left at their default of none: {', '.join(unset)}")
    try:
        body = tomli_w.dumps(tables)
    except TypeError as err:  # a value TOML cannot hold (e.g. an object in an option)
        raise ConfigError(f"config cannot be written to TOML: {err}") from None
    return "\n".join(lines) + "\n" + body


def comment_text(text: str) -> str:
    """``text`` with the characters a TOML comment may not hold (line breaks, other control
    characters but tab) written as Python escapes."""
    return "".join(
        ch if ch == "\t" or (ord(ch) >= 0x20 and ord(ch) != 0x7F) else repr(ch)[1:-1] for ch in text
    )
