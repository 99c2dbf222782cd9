"""Typed options: the one mechanism behind every estimator's and the preference builder's options.

An options class is a frozen dataclass derived from :class:`Options`. Each field is declared
with :func:`option`, which puts the default and a one-line reason in one place; the CLI's
``--help``, the docs tables (checked by a test) and the estimator all read them from there.
``__post_init__`` checks the values with the shared helpers below, so a bad value is a
one-line ``ValueError`` naming the owner and the option as soon as the options are built:

    GigpoOptions.from_kwargs({"gamma": 0.5})         # Python keywords, unknown names rejected
    GigpoOptions.from_text({"gamma": "0.5"}, "--algo")  # command-line strings, by field type

This module is the bottom layer: it imports nothing from mcgpo.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, ClassVar, NoReturn, TypeVar

import numpy as np

__all__ = [
    "Options",
    "check_choice",
    "check_int",
    "check_number",
    "did_you_mean",
    "is_int",
    "is_number",
    "option",
    "option_help",
    "parse_scalar",
    "parse_text",
]

T = TypeVar("T", bound="Options")


def option(default: Any, reason: str) -> Any:
    """A dataclass field with ``default`` and its one-line reason in ``metadata["help"]``."""
    return dataclasses.field(default=default, metadata={"help": reason})


def option_help(cls: type[Options]) -> dict[str, tuple[Any, str]]:
    """Option name -> (default, reason) of an options class, in declaration order."""
    return {f.name: (f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------------- the checks
def is_number(value: object) -> bool:
    """A real, finite number (Python or numpy), not a bool."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(
        value, (bool, np.bool_)
    ):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def is_int(value: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_number(
    label: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    want: str | None = None,
) -> None:
    """Raise ``ValueError("<label> must be <want>, got <value>")`` unless ``value`` is a
    finite number inside the bounds (closed unless ``*_open``). ``want`` overrides the
    generated wording ("a finite number >= 0", "in (0, 1]")."""
    ok = is_number(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low  # type: ignore[operator]
    if ok and high is not None:
        ok = value < high if high_open else value <= high  # type: ignore[operator]
    if not ok:
        _fail(label, value, want or _number_words(low, high, low_open, high_open))


def check_int(
    label: str,
    value: object,
    *,
    low: int | None = None,
    high: int | None = None,
    none_ok: bool = False,
    want: str | None = None,
) -> None:
    """Raise unless ``value`` is an integer in ``[low, high]`` (or None when ``none_ok``)."""
    if none_ok and value is None:
        return
    ok = is_int(value) and (low is None or value >= low) and (high is None or value <= high)  # type: ignore[operator]
    if not ok:
        words = "an integer" + _bounds(low, high, False, False) + (" or None" if none_ok else "")
        _fail(label, value, want or words)


def check_choice(
    label: str, value: object, choices: Collection[object], *, want: str | None = None
) -> None:
    """Raise unless ``value`` is one of ``choices`` ("one of 'a', 'b'" unless ``want``)."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value against a set or dict of choices
        known = False
    if not known:
        _fail(label, value, want or "one of " + ", ".join(map(repr, choices)))


def _fail(label: str, value: object, want: str) -> NoReturn:
    raise ValueError(f"{label} must be {want}, got {value!r}")


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def _number_words(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:  # a closed range implies finiteness
        return _bounds(low, high, low_open, high_open).strip()
    return "a finite number" + _bounds(low, high, low_open, high_open)


def did_you_mean(word: str, known: Collection[str]) -> str:
    """``" (did you mean 'x'?)"`` naming the closest of ``known`` to ``word`` (difflib's
    ratio >= 0.6), or ``""`` when none is close: the tail of an "unknown ..." error."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------- text by field type
def parse_scalar(text: str) -> Any:
    """A command-line value of no declared type, read as TOML would read it: true/false, an
    integer, a float, else the text (environment options, ``mcgpo env serve --env.KEY``)."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_text(key: str, text: str, kind: Any) -> Any:
    """A command-line string read as the declared type ``kind`` ("0.2", "true", "none").

    Unions are tried in the order None, bool, int, float, str; a type that is none of these
    (a mapping) keeps the text, for the options' own check to name. One-line ValueError
    ``"<key>: expected ..., got '<text>'"`` when the text fits none of the scalar types.
    """
    allowed = set(typing.get_args(kind)) if _is_union(kind) else {kind}
    low = text.strip().lower()
    if type(None) in allowed and low == "none":
        return None
    if bool in allowed and low in ("true", "false"):
        return low == "true"
    for number in (int, float):
        if number in allowed:
            try:
                return number(text)
            except ValueError:
                pass
    if str in allowed or not allowed & {bool, int, float}:
        return text
    if float in allowed:
        raise ValueError(f"{key}: expected a number, got {text!r}")
    if int in allowed:
        raise ValueError(f"{key}: expected an integer, got {text!r}")
    raise ValueError(f"{key}: expected true or false, got {text!r}")


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


# ---------------------------------------------------------------------- the base
@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every options class. Subclasses set ``OWNER`` and may reword their errors.

    ``LABEL`` names an option in a range error (``"{owner}: option {name!r}"`` gives
    "graphgpo: option 'omega' must be in (0, 1), got 1.5"); ``UNKNOWN`` words the error for
    a name the class does not have. Both keep the wording the tests have always matched.
    """

    OWNER: ClassVar[str] = "options"
    LABEL: ClassVar[str] = "{owner}: option {name!r}"
    UNKNOWN: ClassVar[str] = "unknown option {name!r} for estimator {owner!r}; options: {known}"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls: type[T], options: Mapping[str, Any]) -> T:
        """Build from keyword options; an unknown name is a one-line ValueError listing the
        known ones."""
        known = cls.names()
        for name in options:
            if name not in known:
                raise ValueError(
                    cls.UNKNOWN.format(name=name, owner=cls.OWNER, known=", ".join(sorted(known)))
                )
        return cls(**options)

    @classmethod
    def from_text(cls: type[T], options: Mapping[str, Any], flag: str = "") -> T:
        """Build from configuration values: strings are read by each field's declared type
        (:func:`parse_text`, errors name ``<flag>.<option>``); other values pass unchanged,
        except an integer given for a float-only field, which becomes a float."""
        hints = typing.get_type_hints(cls)
        known = cls.names()
        values: dict[str, Any] = {}
        for name, value in options.items():
            kind = hints.get(name) if name in known else None
            key = f"{flag}.{name}" if flag else name
            if kind is not None and isinstance(value, str):
                value = parse_text(key, value, kind)
            elif kind is float and is_int(value):
                value = float(value)
            values[name] = value
        return cls.from_kwargs(values)

    def label(self, name: str) -> str:
        """How this owner's errors name the option ``name``."""
        return self.LABEL.format(owner=self.OWNER, name=name)

    def fail(self, name: str, want: str) -> NoReturn:
        """Raise the one-line error "<label> must be <want>, got <value>" for ``name``."""
        _fail(self.label(name), getattr(self, name), want)

    def number(self, name: str, **bounds: Any) -> None:
        """:func:`check_number` on the field ``name``."""
        check_number(self.label(name), getattr(self, name), **bounds)

    def integer(self, name: str, **bounds: Any) -> None:
        """:func:`check_int` on the field ``name``."""
        check_int(self.label(name), getattr(self, name), **bounds)

    def choice(self, name: str, choices: Collection[object], want: str | None = None) -> None:
        """:func:`check_choice` on the field ``name``."""
        check_choice(self.label(name), getattr(self, name), choices, want=want)

    def flag(self, name: str) -> None:
        """The field ``name`` must be true or false."""
        value = getattr(self, name)
        if not isinstance(value, (bool, np.bool_)):
            _fail(self.label(name), value, "true or false")

    def as_dict(self) -> dict[str, Any]:
        """Option name -> value (the resolved options a run writes to its config)."""
        return {name: getattr(self, name) for name in self.names()}
