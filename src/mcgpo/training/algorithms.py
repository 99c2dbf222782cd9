"""Algorithms by name: which estimator, and whether pairs or shaping are added.

Every registered advantage estimator is an algorithm of the same name. Two more are
recipes built on GraphGPO (arXiv 2605.26684):

* ``mcgpo``: GraphGPO advantages + the MCGPO pair loss on matched-context preferences
  (reference/algorithms.md 5.1: L = L_task + lambda_pair * L_pair).
* ``graphgpo_shaping``: GraphGPO on rewards shaped by rubric progress, the control that
  uses the same progress signal as MCGPO's contexts but as a reward instead of pairs. The
  increments ``shaping_coef * (P(s') - P(s))`` enter both of GraphGPO's terms: the episode
  return A^E reads the shaped ``reward`` column (:func:`mcgpo.shaping.shape_rewards`) and
  the step credit A^G the graph return R^G (GraphGPO's ``progress_coef``, set to
  ``algo.shaping_coef``), before the step normalisation.

:func:`assign_credit` is the one call the trainer makes per batch: advantages (and
preferences) from the StepTable alone. It is pure: no randomness, no tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcgpo.advantages import ESTIMATOR_OPTIONS, ESTIMATORS, estimate
from mcgpo.advantages.graphgpo import GraphgpoOptions
from mcgpo.options import Options, did_you_mean, option, parse_text
from mcgpo.preferences import PreferenceOptions, build_preferences
from mcgpo.shaping import SHAPING_COEF, shape_rewards
from mcgpo.steps import StepTable
from mcgpo.training.config import AlgoConfig, ConfigError

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Credit",
    "ShapingOptions",
    "algorithm_options",
    "assign_credit",
    "resolve_algo",
]


@dataclass(frozen=True)
class ShapingOptions(GraphgpoOptions):
    """GraphGPO's options as ``graphgpo_shaping`` uses them: the step bonus is the control's
    shaping coefficient (``--algo.shaping_coef``), so its default is that one's."""

    progress_coef: float = option(
        SHAPING_COEF, "= --algo.shaping_coef: the progress increments also enter R^G"
    )


@dataclass(frozen=True)
class Algorithm:
    estimator: str  # advantage estimator name in mcgpo.ESTIMATORS
    pairs: bool = False  # add lambda_pair * L_pair on MCGPO preferences
    shaping: bool = False  # rubric progress increments in the rewards and in GraphGPO's R^G
    options: type[Options] | None = None  # estimator options, when not the estimator's own


ALGORITHMS: dict[str, Algorithm] = {
    **{name: Algorithm(name) for name in ESTIMATORS},
    "mcgpo": Algorithm("graphgpo", pairs=True),
    "graphgpo_shaping": Algorithm("graphgpo", shaping=True, options=ShapingOptions),
}


@dataclass(frozen=True)
class Credit:
    """What the update needs from one batch, computed on the StepTable alone."""

    advantages: np.ndarray  # [R] float32, one per row
    plus: np.ndarray  # [P] int64 row of the preferred decision (empty without pairs)
    minus: np.ndarray  # [P] int64 row of the dispreferred decision
    weight: np.ndarray  # [P] float64 c of each pair
    level: np.ndarray  # [P] object(str) "exact" or "coarse"
    stats: dict[str, float]


def algorithm_options(name: str) -> tuple[type[Options], type[PreferenceOptions] | None]:
    """(estimator options class, preference options class or None) of an algorithm: their
    fields carry each default and its reason (the CLI's ``--help`` lists them)."""
    spec = ALGORITHMS[name]
    estimator = spec.options or ESTIMATOR_OPTIONS[spec.estimator]
    return estimator, PreferenceOptions if spec.pairs else None


def resolve_algo(algo: AlgoConfig, group_size: int) -> AlgoConfig:
    """Check ``algo.name`` and its options; return the config with every default filled in.

    ``group_size`` is the rollout's N; MCGPO's folds are built from it. Raises ConfigError
    for an unknown algorithm, an unknown option or a bad value (the options classes check
    every value when they are built, so nothing has to run to find a bad one).
    """
    if algo.name not in ALGORITHMS:
        known = ", ".join(sorted(ALGORITHMS))
        close = did_you_mean(algo.name, ALGORITHMS)
        raise ConfigError(f"unknown algorithm {algo.name!r}{close}; known: {known}")
    estimator_cls, pairs_cls = algorithm_options(algo.name)
    for name, table in algo.per_estimator.items():  # every table is checked, one is used
        if name not in ESTIMATOR_OPTIONS:
            known = ", ".join(sorted(ESTIMATOR_OPTIONS))
            raise ConfigError(f"unknown estimator table [algo.{name}]; estimators: {known}")
        _build(ESTIMATOR_OPTIONS[name], table, f"--algo.{name}", name)
    estimator = _build(estimator_cls, _estimator_options(algo), "--algo", algo.name)
    pairs: dict[str, Any] = {}
    if pairs_cls is not None:
        given = dict(algo.pairs)
        if "group_size" in given:
            value = given["group_size"]
            if isinstance(value, str):
                value = _text("--algo.pairs.group_size", value, int)
            if value != group_size:
                raise ConfigError(
                    f"--algo.pairs.group_size {value} differs from rollout.group_size {group_size}"
                )
        pairs = _build(pairs_cls, {**given, "group_size": group_size}, "--algo.pairs", "mcgpo")
    elif algo.pairs:
        raise ConfigError(f"--algo.pairs.* options apply only to mcgpo, not {algo.name!r}")
    return dataclasses.replace(algo, estimator=estimator, pairs=pairs)


def _estimator_options(algo: AlgoConfig) -> Mapping[str, Any]:
    """The estimator options as given: the ``[algo.<estimator>]`` table of the algorithm's
    estimator under the flat ``[algo]`` options (which win); a shaping algorithm's step
    bonus is its shaping_coef."""
    spec = ALGORITHMS[algo.name]
    given = {**algo.per_estimator.get(spec.estimator, {}), **algo.estimator}
    if not spec.shaping:
        return given
    if "progress_coef" in given:
        value = given["progress_coef"]
        if isinstance(value, str):
            value = _text("--algo.progress_coef", value, float)
        if value != algo.shaping_coef:
            raise ConfigError(
                f"--algo.progress_coef {value} differs from --algo.shaping_coef "
                f"{algo.shaping_coef}; {algo.name} sets it from shaping_coef"
            )
    return {**given, "progress_coef": algo.shaping_coef}


def _build(cls: type[Options], given: Mapping[str, Any], flag: str, owner: str) -> dict[str, Any]:
    """The options of ``cls`` from configuration values, every default filled in."""
    known = cls.names()
    unknown = sorted(set(given) - set(known))
    if unknown:
        names = ", ".join(sorted(known)) or "none"
        close = did_you_mean(unknown[0], known)
        raise ConfigError(
            f"unknown option {flag}.{unknown[0]} for {owner}{close}; options: {names}"
        )
    try:
        return cls.from_text(given, flag).as_dict()
    except ValueError as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def _text(key: str, text: str, kind: type) -> Any:
    try:
        return parse_text(key, text, kind)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def assign_credit(table: StepTable, algo: AlgoConfig) -> Credit:
    """Advantages for every row of ``table`` and, for MCGPO, its preference pairs.

    ``table`` should hold only learnable rows (``StepTable.learnable()``).
    """
    spec = ALGORITHMS[algo.name]
    stats: dict[str, float] = {}
    source = shape_rewards(table, algo.shaping_coef) if spec.shaping else table
    adv, est_stats = estimate(spec.estimator, source, **_estimator_options(algo))
    stats.update(_numbers("adv", est_stats))
    empty = np.zeros(0, dtype=np.int64)
    plus, minus, weight, level = empty, empty, np.zeros(0), np.zeros(0, dtype=object)
    if spec.pairs:
        prefs = build_preferences(table, **algo.pairs)
        plus = np.asarray(prefs.plus, dtype=np.int64)
        minus = np.asarray(prefs.minus, dtype=np.int64)
        weight = np.asarray(prefs.weight, dtype=np.float64)
        level = np.asarray(prefs.level, dtype=object)
        stats.update(_numbers("pairs", prefs.stats))
    return Credit(adv, plus, minus, weight, level, stats)


def _numbers(prefix: str, stats: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries of a stats dict, flattened one level, with a metric prefix."""
    out: dict[str, float] = {}
    for key, value in stats.items():
        if isinstance(value, Mapping):
            out.update(_numbers(f"{prefix}/{key}", value))
        elif isinstance(value, (int, float, np.integer, np.floating)):
            out[f"{prefix}/{key}"] = float(value)
    return out
