"""mcgpo: group-based reinforcement learning for multi-turn LLM agents.

Public API (kept stable)::

    table = mcgpo.StepTable.from_records(rows)
    adv, stats = mcgpo.estimate("gigpo", table, **options)
    prefs = mcgpo.build_preferences(table, **options)
    env = mcgpo.make_env("household")

    cfg = mcgpo.load_config("household-smoke", **{"train.updates": 2, "out": "runs/a"})
    summary = mcgpo.train(cfg)                 # what `mcgpo train` runs; a table of evals

``load_config``, ``train``, ``RunConfig`` and ``ConfigError`` are imported on first use
(``import mcgpo`` stays light: no torch).
"""

from typing import TYPE_CHECKING, Any

from mcgpo.advantages import ESTIMATOR_OPTIONS, ESTIMATORS, estimate
from mcgpo.envs import ENVIRONMENTS, make_env
from mcgpo.preferences import build_preferences
from mcgpo.steps import StepTable, StepTableError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mcgpo.training.config import ConfigError, RunConfig
    from mcgpo.training.overrides import load_config
    from mcgpo.training.trainer import train

__all__ = [
    "ENVIRONMENTS",
    "ESTIMATORS",
    "ESTIMATOR_OPTIONS",
    "ConfigError",
    "RunConfig",
    "StepTable",
    "StepTableError",
    "__version__",
    "build_preferences",
    "estimate",
    "load_config",
    "make_env",
    "train",
]


def __getattr__(name: str) -> Any:
    """The training API, imported on first use (it brings torch and transformers)."""
    if name in ("RunConfig", "ConfigError"):
        from mcgpo.training import config

        return getattr(config, name)
    if name == "load_config":
        from mcgpo.training.overrides import load_config

        return load_config
    if name == "train":
        from mcgpo.training.trainer import train

        return train
    raise AttributeError(f"module 'mcgpo' has no attribute {name!r}")
