"""The typed options: the base (names, strings, range checks), every options class, the docs
tables that list them, and progress_gpo's base estimators chosen from a plain dict."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import pathlib
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcgpo
from mcgpo.advantages import ESTIMATOR_OPTIONS, ESTIMATORS
from mcgpo.advantages.gigpo import GigpoOptions
from mcgpo.advantages.graphgpo import GraphgpoOptions
from mcgpo.advantages.grpo import GrpoOptions
from mcgpo.advantages.progpo import ProgpoOptions
from mcgpo.advantages.progress_gpo import BASES, Base, ProgressGpoOptions
from mcgpo.bench.synthetic import synthetic_table
from mcgpo.options import Options, check_choice, check_int, check_number, option, parse_text
from mcgpo.preferences import PreferenceOptions

ALL_OPTIONS = {**ESTIMATOR_OPTIONS, "mcgpo": PreferenceOptions}
DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithms"


@dataclass(frozen=True)
class Toy(Options):
    OWNER = "toy"

    rate: float = option(0.5, "a rate")
    count: int = option(3, "a count")
    cap: int | None = option(None, "a cap or none")
    on: bool = option(False, "a flag")
    name: str = option("a", "a name")
    level: float | bool | None = option(None, "a threshold, true or none")

    def __post_init__(self) -> None:
        self.number("rate", low=0, high=1, low_open=True)
        self.integer("count", low=1)
        self.integer("cap", low=1, none_ok=True)
        self.flag("on")
        self.choice("name", ("a", "b"))


# ---------------------------------------------------------------------- the base
def test_unknown_name_is_one_line_naming_owner_option_and_the_known_ones():
    with pytest.raises(ValueError) as err:
        Toy.from_kwargs({"rat": 0.2})
    assert str(err.value) == (
        "unknown option 'rat' for estimator 'toy'; options: cap, count, level, name, on, rate"
    )


def test_text_is_read_by_the_declared_type():
    toy = Toy.from_text(
        {"rate": "0.2", "count": "4", "cap": "none", "on": "true", "name": "b", "level": "0.9"}
    )
    assert (toy.rate, toy.count, toy.cap, toy.on, toy.name, toy.level) == (
        0.2,
        4,
        None,
        True,
        "b",
        0.9,
    )
    assert Toy.from_text({"level": "True", "cap": "7"}).level is True
    assert Toy.from_text({"cap": "7"}).cap == 7
    assert isinstance(Toy.from_text({"rate": 1}).rate, float)  # an int for a float field


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"rate": "fast"}, "--x.rate: expected a number, got 'fast'"),
        ({"count": "1.5"}, "--x.count: expected an integer, got '1.5'"),
        ({"cap": "many"}, "--x.cap: expected an integer, got 'many'"),
        ({"on": "3"}, "--x.on: expected true or false, got '3'"),
    ],
)
def test_bad_string_is_one_line_naming_the_flag(given, message):
    with pytest.raises(ValueError) as err:
        Toy.from_text(given, "--x")
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"rate": 0}, "toy: option 'rate' must be in (0, 1], got 0"),
        ({"rate": math.nan}, "toy: option 'rate' must be in (0, 1], got nan"),
        ({"rate": True}, "toy: option 'rate' must be in (0, 1], got True"),
        ({"count": 0}, "toy: option 'count' must be an integer >= 1, got 0"),
        ({"count": 2.0}, "toy: option 'count' must be an integer >= 1, got 2.0"),
        ({"cap": 0}, "toy: option 'cap' must be an integer >= 1 or None, got 0"),
        ({"on": 1}, "toy: option 'on' must be true or false, got 1"),
        ({"name": "c"}, "toy: option 'name' must be one of 'a', 'b', got 'c'"),
    ],
)
def test_range_errors_are_one_line_naming_the_option(given, message):
    with pytest.raises(ValueError) as err:
        Toy(**given)
    assert str(err.value) == message


def test_check_helpers_wording():
    # the generated wording: "a finite number" + bounds; a closed range implies finiteness
    cases = [
        (lambda: check_number("x", math.inf), "x must be a finite number, got inf"),
        (lambda: check_number("x", -1, low=0), "x must be a finite number >= 0, got -1"),
        (
            lambda: check_number("x", 0, low=0, low_open=True),
            "x must be a finite number > 0, got 0",
        ),
        (lambda: check_number("x", 2, high=1), "x must be a finite number <= 1, got 2"),
        (lambda: check_number("x", 1, low=0, high=1, high_open=True), "x must be in [0, 1), got 1"),
        (lambda: check_number("x", "1", want="a weight"), "x must be a weight, got '1'"),
        (lambda: check_int("x", 9, low=0, high=8), "x must be an integer in [0, 8], got 9"),
        (lambda: check_choice("x", "c", ("a", "b")), "x must be one of 'a', 'b', got 'c'"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
    for call in (lambda: check_number("x", 10**400), lambda: check_choice("x", [1], {"a": 1})):
        with pytest.raises(ValueError, match=r"^x must be"):
            call()  # an int too large for a float; an unhashable value: errors, not crashes
    check_number("x", np.float32(0.5), low=0, high=1)  # numpy scalars are numbers
    check_int("x", np.int64(3), low=0)
    check_int("x", None, none_ok=True)


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10**12), 10**12))
def test_text_round_trip(x, n):
    assert parse_text("k", repr(x), float) == x
    assert parse_text("k", str(n), int) == n
    assert parse_text("k", str(n), float) == float(n)
    assert parse_text("k", "none", int | None) is None
    assert parse_text("k", "none", str) == "none"  # a string option keeps the word


# ---------------------------------------------------------------------- every options class
@pytest.mark.parametrize("name", sorted(ALL_OPTIONS))
def test_options_class_is_frozen_documented_and_round_trips(name):
    cls = ALL_OPTIONS[name]
    opts = cls()  # the defaults pass their own checks
    assert dataclasses.is_dataclass(cls) and issubclass(cls, Options)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.eps = 1.0  # type: ignore[misc]
    for f in dataclasses.fields(cls):
        assert f.metadata.get("help"), (name, f.name)
        assert "\n" not in f.metadata["help"]
    assert cls(**opts.as_dict()) == opts
    assert cls.from_text({k: str(v) for k, v in opts.as_dict().items() if v is not None}) == opts


def test_registry_and_options_registry_agree():
    assert list(ESTIMATOR_OPTIONS) == list(ESTIMATORS)
    for name, fn in ESTIMATORS.items():
        params = inspect.signature(fn).parameters
        # no option and no default is repeated in the signature: (table, options, **kwargs)
        assert list(params) == ["table", "options", "kwargs"], name
        assert ESTIMATOR_OPTIONS[name].__name__ in str(params["options"].annotation), name


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_options_object_and_keywords_give_the_same_advantages(name):
    table = synthetic_table(3, 4, 10, seed=2)
    cls = ESTIMATOR_OPTIONS[name]
    by_object, _ = ESTIMATORS[name](table, cls())
    by_keywords, _ = ESTIMATORS[name](table, **cls().as_dict())
    np.testing.assert_array_equal(by_object, by_keywords)


@pytest.mark.parametrize(
    ("cls", "given", "message"),
    [
        (GrpoOptions, {"invalid_penalty": math.inf}, "grpo: option 'invalid_penalty' must be"),
        (GrpoOptions, {"norm_by_std": "yes"}, "grpo: option 'norm_by_std' must be true or false"),
        (GigpoOptions, {"eps": 0.0}, "gigpo: eps must be a finite number > 0, got 0.0"),
        (
            GraphgpoOptions,
            {"success_reward": 0},
            "option 'success_reward' must be a finite number > 0",
        ),
        (
            ProgpoOptions,
            {"step_weight": math.nan},
            "option 'step_weight' must be a finite number >= 0",
        ),
        (
            ProgressGpoOptions,
            {"scale_by_fail_share": 1},
            "'scale_by_fail_share' must be true or false",
        ),
    ],
)
def test_new_checks_are_one_line(cls, given, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        cls(**given)
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- docs tables
def docs_table(page: str) -> dict[str, tuple[str, str]]:
    """Option -> (default cell, reason cell) of the page's options table."""
    lines = (DOCS / f"{page}.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Symbol | Option |"))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        rows[cells[1].strip("`")] = (cells[2], cells[3].replace("\\|", "|"))
    return rows


@pytest.mark.parametrize("page", sorted(ALL_OPTIONS))
def test_docs_table_lists_every_option_with_its_default_and_reason(page):
    cls = ALL_OPTIONS[page]
    table = docs_table(page)
    assert list(table) == list(cls.names()), page
    for f in dataclasses.fields(cls):
        default_cell, reason = table[f.name]
        default = ast.literal_eval(default_cell.strip("`"))
        assert default == f.default and type(default) is type(f.default), (page, f.name)
        assert reason == f.metadata["help"], (page, f.name)


def test_help_lists_every_default_and_reason():
    from mcgpo.cli import _algo_epilog

    text = _algo_epilog()
    for cls in ALL_OPTIONS.values():
        for f in dataclasses.fields(cls):
            assert f"{f.name}={f.default}: {f.metadata['help']}" in text, f.name


# ---------------------------------------------------------------------- progress_gpo's bases
def test_bases_are_the_registry_s_functions_and_options():
    assert list(BASES) == ["grpo", "gigpo", "graphgpo"]
    for name, base in BASES.items():
        assert base.estimator is ESTIMATORS[name]
        assert base.options is ESTIMATOR_OPTIONS[name]
    built = ProgressGpoOptions(base="graphgpo", base_options={"omega": 0.2})
    fn, options = built.base_estimator
    assert fn is ESTIMATORS["graphgpo"] and options == GraphgpoOptions(omega=0.2)


def test_base_is_chosen_from_the_dict(monkeypatch):
    # a base registered in BASES is used as it is: its options class checks base_options
    calls = []

    def constant(table, options):
        calls.append(options)
        return np.full(len(table), options.invalid_penalty), {"called": 1.0}

    monkeypatch.setitem(BASES, "constant", Base(constant, GrpoOptions))
    table = synthetic_table(3, 4, 30, seed=0)
    adv, stats = mcgpo.estimate(
        "progress_gpo", table, base="constant", base_options={"invalid_penalty": 0.5}
    )
    assert calls == [GrpoOptions(invalid_penalty=0.5)] and stats["base_called"] == 1.0
    won = [g for g in set(table.group.tolist()) if table.success[table.group == g].max() == 1]
    mixed = np.isin(table.group, won)  # groups with a success keep the base's advantage
    assert mixed.any() and not mixed.all()
    np.testing.assert_array_equal(adv[mixed], 0.5)
    with pytest.raises(ValueError, match="unknown base option 'omega' for base 'constant'"):
        ProgressGpoOptions(base="constant", base_options={"omega": 0.1})
