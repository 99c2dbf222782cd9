"""mcgpo: group-based reinforcement learning for multi-turn LLM agents.

Public API (kept stable)::

    table = mcgpo.StepTable.from_records(rows)
    adv, stats = mcgpo.estimate("gigpo", table, **options)
    prefs = mcgpo.build_preferences(table, **options)
    env = mcgpo.make_env("household")
"""

from mcgpo.advantages import ESTIMATOR_OPTIONS, ESTIMATORS, estimate
from mcgpo.envs import ENVIRONMENTS, make_env
from mcgpo.preferences import build_preferences
from mcgpo.steps import StepTable, StepTableError

__version__ = "0.1.0"

__all__ = [
    "ENVIRONMENTS",
    "ESTIMATORS",
    "ESTIMATOR_OPTIONS",
    "StepTable",
    "StepTableError",
    "__version__",
    "build_preferences",
    "estimate",
    "make_env",
]
