"""MCGPO matched-context pairwise preferences (pure numpy; no tokens, no randomness).

``build_preferences(table, **options) -> Preferences`` turns the sibling rollouts of a
:class:`~mcgpo.steps.StepTable` into weighted pairs (preferred row, dispreferred row, c).
Modules: :mod:`~mcgpo.preferences.options` (options and their validation),
:mod:`~mcgpo.preferences.matching` (context keys, first visits, fold evidence, candidate
pairs), :mod:`~mcgpo.preferences.allocation` (earliest / cap / row-once rules),
:mod:`~mcgpo.preferences.successor` and :mod:`~mcgpo.preferences.blending` (the successor
support and level blending variants) and :mod:`~mcgpo.preferences.build` (resolution,
labels, weights, stats).
See docs/algorithms/mcgpo.md.
"""

from mcgpo.preferences.build import Preferences, build_preferences
from mcgpo.preferences.options import (
    BLEND_MODES,
    COARSE_ACTION_MODES,
    EVIDENCE_MODES,
    MATCHING_MODES,
    SUPPORT_MODES,
    WEIGHTING_MODES,
    PreferenceOptions,
)

__all__ = [
    "BLEND_MODES",
    "COARSE_ACTION_MODES",
    "EVIDENCE_MODES",
    "MATCHING_MODES",
    "SUPPORT_MODES",
    "WEIGHTING_MODES",
    "PreferenceOptions",
    "Preferences",
    "build_preferences",
]
