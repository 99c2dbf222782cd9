"""Experiment trackers: TensorBoard, Weights & Biases, MLflow and trackio, one sink each.

``--report_to`` names them, comma-separated, as Hugging Face's Trainer does (``tensorboard``,
the default; ``wandb``, ``mlflow``, ``trackio``: the ``tracking`` extra; ``none``). Each tracker
is fed the same scalars as ``metrics.jsonl`` under the same names (``rollout/success_rate``,
``loss/policy``, ``eval/success``, ...; text values and non-finite numbers are left out), at
the update count as step, and is given the run's ``config.toml`` as its config.

A resumed run continues the same tracked run: the ids are kept in the run folder's
``tracking.json`` (W&B run id, MLflow run id and tracking URI, trackio project and run name).
TensorBoard purges its events past the checkpoint; W&B, MLflow and trackio keep what they were
sent, so the updates between the last checkpoint and a crash appear twice there.

Where each writes (the backends' own environment variables, as the Trainer reads them):

* ``tensorboard``: ``<run>/tensorboard/``.
* ``wandb``: project ``WANDB_PROJECT`` (default ``mcgpo``), files under ``WANDB_DIR`` (default
  the run folder); ``WANDB_MODE=offline`` keeps the run on disk (``wandb sync`` uploads it).
  The update count is logged as ``update``, the x axis of every chart (``define_metric``).
* ``mlflow``: the tracking URI ``MLFLOW_TRACKING_URI`` (default: MLflow's own,
  ``sqlite:///mlflow.db`` in the working folder), experiment ``MLFLOW_EXPERIMENT_NAME``
  (default ``mcgpo``); the config as params named ``section.key``. MLflow's filesystem store
  (``./mlruns``) is refused: it keeps each metric in a file named after it, and
  ``eval/success`` cannot be both a file and the folder of ``eval/success/<task type>``.
* ``trackio``: project ``TRACKIO_PROJECT`` (default ``mcgpo``), stored under ``TRACKIO_DIR``
  (default trackio's own, in the Hugging Face cache).

The run is named after the run folder. Library code never imports a tracker: the trainer's
metric sinks (:class:`~mcgpo.training.metrics.MetricSinks`) open them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.config import TRACKERS, ConfigError

__all__ = ["TRACKERS", "Tracker", "check_trackers_installed", "open_trackers"]

# The file in the run folder that holds each tracker's run id (read on --resume).
IDS_FILE = "tracking.json"

# The package each tracker imports.
_PACKAGES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}


class Tracker(Protocol):
    """One experiment tracker: scalars at an update, then closed once."""

    def log(self, update: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def check_trackers_installed(names: Sequence[str]) -> None:
    """Before any model work: a ConfigError naming the extra for the first tracker whose
    package is missing, or MLflow's filesystem store (:func:`_refuse_file_store`)."""
    for name in names:
        if importlib.util.find_spec(_PACKAGES[name]) is None:
            raise ConfigError(
                f"--report_to {name} needs the {_PACKAGES[name]} package: "
                f"pip install 'mcgpo[tracking]'"
            )
    if "mlflow" in names:
        import mlflow

        _refuse_file_store(mlflow.get_tracking_uri())


def open_trackers(
    names: Sequence[str],
    folder: Path,
    *,
    config: Mapping[str, Any],
    resume_at: int | None = None,
) -> list[Tracker]:
    """The trackers ``names`` for the run in ``folder`` (``config``: the nested run config).

    ``resume_at``: the update of the checkpoint a resumed run starts from (None: a fresh run,
    which starts new tracked runs); a resumed run continues the ids in ``tracking.json``.
    """
    folder = Path(folder)
    ids_path = folder / IDS_FILE
    ids: dict[str, Any] = {}
    if resume_at is not None and ids_path.is_file():
        ids = json.loads(ids_path.read_text(encoding="utf-8"))
    opened: list[Tracker] = []
    for name in names:
        tracker = _OPENERS[name](folder, config, resume_at, ids.get(name))
        opened.append(tracker)
        if name != "tensorboard":
            ids[name] = tracker.ids  # type: ignore[attr-defined]
    if any(name != "tensorboard" for name in names):
        atomic_write_text(ids_path, json.dumps(ids, indent=2) + "\n")
    return opened


class _TensorBoard:
    def __init__(self, folder: Path, resume_at: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resume_at is None else resume_at + 1
        self._writer = SummaryWriter(log_dir=str(folder / "tensorboard"), purge_step=purge)

    def log(self, update: int, scalars: Mapping[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, update)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, folder: Path, config: Mapping[str, Any], saved: Any) -> None:
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "mcgpo"),
            name=folder.resolve().name,
            id=saved["id"] if saved else None,
            resume="allow" if saved else None,
            dir=os.environ.get("WANDB_DIR", str(folder)),
            config=dict(config),
        )
        self._run.define_metric("update")
        self._run.define_metric("*", step_metric="update")
        self.ids = {"id": self._run.id}

    def log(self, update: int, scalars: Mapping[str, float]) -> None:
        self._run.log({**scalars, "update": update})

    def close(self) -> None:
        self._run.finish()


class _Mlflow:
    def __init__(self, folder: Path, config: Mapping[str, Any], saved: Any) -> None:
        import mlflow
        from mlflow import MlflowClient
        from mlflow.entities import Param

        # MLFLOW_TRACKING_URI or MLflow's default; a resumed run, the one it started with
        uri = saved["tracking_uri"] if saved else mlflow.get_tracking_uri()
        _refuse_file_store(uri)
        try:
            self._client = MlflowClient(tracking_uri=uri)
            if saved:
                self.run_id = saved["run_id"]
                self._client.update_run(self.run_id, status="RUNNING")
                logged = set(self._client.get_run(self.run_id).data.params)
            else:
                experiment = _mlflow_experiment(self._client)
                run = self._client.create_run(experiment, run_name=folder.resolve().name)
                self.run_id, logged = run.info.run_id, set()
        except Exception as err:  # mlflow raises many kinds: one line each
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"--report_to mlflow: cannot open {uri}: {first}") from None
        # params are set once per run (MLflow refuses a changed value): a resumed run adds
        # only the keys it did not have
        params = [Param(k, str(v)[:6000]) for k, v in _flat(config).items() if k not in logged]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params
            self._client.log_batch(self.run_id, params=params[start : start + 100])
        self.ids = {"run_id": self.run_id, "tracking_uri": uri}

    def log(self, update: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, update) for k, v in scalars.items()]
        for start in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _refuse_file_store(uri: str) -> None:
    """MLflow's filesystem store keeps a metric in a file named after it, so it cannot hold
    ``eval/success`` beside ``eval/success/<task type>``: refused before the run starts."""
    from urllib.parse import urlparse

    if urlparse(uri).scheme in ("", "file"):
        raise ConfigError(
            f"--report_to mlflow: the filesystem store {uri} cannot hold metrics named "
            f"eval/success and eval/success/<task type>; set MLFLOW_TRACKING_URI to a "
            f"database (sqlite:///mlflow.db) or a tracking server"
        )


def _mlflow_experiment(client: Any) -> str:
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "mcgpo")
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


class _Trackio:
    def __init__(self, folder: Path, config: Mapping[str, Any], saved: Any) -> None:
        import trackio

        project = saved["project"] if saved else os.environ.get("TRACKIO_PROJECT", "mcgpo")
        self._run = trackio.init(
            project=project,
            name=saved["name"] if saved else _fresh_trackio_name(folder),
            config=dict(config),
            resume="must" if saved else "never",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )
        self.ids = {"project": project, "name": self._run.name}

    def log(self, update: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=update)

    def close(self) -> None:
        self._run.finish()


def _fresh_trackio_name(folder: Path) -> str:
    """The run folder's name and the time: trackio resumes by name, so two runs from
    folders of one name must not share it."""
    return f"{folder.resolve().name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


_OPENERS = {
    "tensorboard": lambda folder, config, resume_at, saved: _TensorBoard(folder, resume_at),
    "wandb": lambda folder, config, resume_at, saved: _Wandb(folder, config, saved),
    "mlflow": lambda folder, config, resume_at, saved: _Mlflow(folder, config, saved),
    "trackio": lambda folder, config, resume_at, saved: _Trackio(folder, config, saved),
}
