"""Advantage estimators: pure functions ``(table, options) -> (advantages, stats)``.

Every estimator takes a :class:`~mcgpo.steps.StepTable` and either its options object or
keyword options, and returns one float per row plus a dict of statistics. They use no
randomness and their result never depends on row order. :data:`ESTIMATORS` is a plain dict
from name to function, :data:`ESTIMATOR_OPTIONS` from name to its frozen options class
(defaults, one-line reasons and range checks: :mod:`mcgpo.options`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mcgpo.advantages.gigpo import GigpoOptions, gigpo
from mcgpo.advantages.graphgpo import GraphgpoOptions, graphgpo
from mcgpo.advantages.grpo import GrpoOptions, RlooOptions, grpo, rloo
from mcgpo.advantages.hgpo import HgpoOptions, hgpo
from mcgpo.advantages.progpo import ProgpoOptions, progpo
from mcgpo.advantages.progress_gpo import ProgressGpoOptions, progress_gpo
from mcgpo.options import Options
from mcgpo.steps import StepTable

__all__ = ["ESTIMATORS", "ESTIMATOR_OPTIONS", "Estimator", "estimate"]

Estimator = Callable[..., tuple[np.ndarray, dict[str, float]]]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo,
    "rloo": rloo,
    "gigpo": gigpo,
    "graphgpo": graphgpo,
    "hgpo": hgpo,
    "progpo": progpo,
    "progress_gpo": progress_gpo,
}

ESTIMATOR_OPTIONS: dict[str, type[Options]] = {
    "grpo": GrpoOptions,
    "rloo": RlooOptions,
    "gigpo": GigpoOptions,
    "graphgpo": GraphgpoOptions,
    "hgpo": HgpoOptions,
    "progpo": ProgpoOptions,
    "progress_gpo": ProgressGpoOptions,
}


def estimate(name: str, table: StepTable, **options: Any) -> tuple[np.ndarray, dict[str, float]]:
    """Run the estimator ``name`` on ``table``; returns (float32 advantages [R], stats).

    Unknown estimator names and unknown or bad options raise a one-line ``ValueError``.
    """
    if name not in ESTIMATORS:
        raise ValueError(f"unknown estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}")
    if not isinstance(table, StepTable):
        raise TypeError(f"estimate() expects a StepTable, got {type(table).__name__}")
    adv, stats = ESTIMATORS[name](table, ESTIMATOR_OPTIONS[name].from_kwargs(options))
    adv = np.asarray(adv, dtype=np.float32)
    if adv.shape != (len(table),):
        raise RuntimeError(f"estimator {name!r} returned shape {adv.shape}, want ({len(table)},)")
    return adv, stats
