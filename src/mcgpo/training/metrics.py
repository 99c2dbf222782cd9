"""Metric sinks: JSON lines, the experiment trackers (TensorBoard by default), and a progress
bar with the live success rate.

Library code returns stats dicts; only the trainer hands them to these sinks. Metric names
are ``section/name`` (``rollout/success_rate``, ``loss/policy``, ``eval/success``, ...) and are
documented in docs/reference/metrics.md. ``metrics.jsonl`` holds one record per update (and one per
evaluation) with the update count under ``update``.

On resume, records newer than the checkpoint are dropped from ``metrics.jsonl`` and
TensorBoard purges its events past the checkpoint, so the logs read as one run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mcgpo.training.atomic_files import atomic_write_text

__all__ = ["MetricSinks", "PeakMemory", "ProgressBar", "Table", "read_metrics", "run_stages"]


class PeakMemory:
    """The memory high-water mark of one phase (``rollout``, ``update``) of an update.

    On CUDA: ``memory/<phase>_peak_gb``, the most bytes of tensors allocated on the device
    during the phase (``torch.cuda.max_memory_allocated``, reset when the phase starts), in
    GB (10^9 bytes). On the CPU a phase's peak cannot be told apart from the process's:
    ``memory/process_peak_rss_gb`` is the peak resident set size of the whole process since it
    started (``getrusage``; Python, environments and tokenizer included).
    """

    def __init__(self, device: Any, phase: str) -> None:
        import torch

        self.device = torch.device(device)
        self.phase = phase

    @classmethod
    def start(cls, device: Any, phase: str) -> PeakMemory:
        """Begin measuring a phase on ``device``."""
        peak = cls(device, phase)
        if peak.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(peak.device)
        return peak

    def stop(self) -> dict[str, float]:
        """The phase's metric (see the class docstring)."""
        if self.device.type == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated(self.device)
            return {f"memory/{self.phase}_peak_gb": peak / 1e9}
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        scale = 1 if sys.platform == "darwin" else 1024
        return {"memory/process_peak_rss_gb": rss * scale / 1e9}


class SilentSinks:
    """The sinks of ranks other than 0 in a multi-process run: records go nowhere."""

    def write(self, update: int, metrics: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class MetricSinks:
    """Writes each record to ``metrics.jsonl`` and feeds its numbers to the experiment
    trackers (``report_to``: TensorBoard, W&B, MLflow, trackio; :mod:`mcgpo.training.tracking`).

    ``config``: the run's nested config, logged by the trackers that keep one.
    """

    def __init__(
        self,
        folder: Path,
        *,
        report_to: Sequence[str] = ("tensorboard",),
        resume_at: int | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        from mcgpo.training.tracking import open_trackers

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        # the trackers first: one that cannot open leaves the folder as it was
        self._trackers = open_trackers(
            report_to, self.folder, config=config or {}, resume_at=resume_at
        )
        self.path = self.folder / "metrics.jsonl"
        if resume_at is None:
            self.path.write_text("", encoding="utf-8")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("update", 0) <= resume_at]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._start = time.time()

    def write(self, update: int, metrics: Mapping[str, Any]) -> None:
        record = {"update": update, "time": round(time.time() - self._start, 3)}
        for key, value in metrics.items():
            record[key] = _plain(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars = {
            key: value
            for key, value in record.items()
            if key != "update" and isinstance(value, (int, float)) and math.isfinite(value)
        }
        for tracker in self._trackers:
            tracker.log(update, scalars)

    def close(self) -> None:
        self._file.close()
        for tracker in self._trackers:
            tracker.close()


class ProgressBar:
    """A tqdm bar over updates that shows the live training and evaluation success."""

    def __init__(
        self,
        total: int,
        initial: int = 0,
        *,
        enabled: bool = True,
        desc: str = "train",
        unit: str = "update",
        leave: bool = True,
    ):
        from tqdm import tqdm

        self._bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            disable=not enabled,
            leave=leave,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self._shown: dict[str, str] = {}

    def show(self, **values: float) -> None:
        """Set the numbers shown after the bar (kept until replaced)."""
        self._shown.update({k: f"{v:.3g}" for k, v in values.items()})
        self._bar.set_postfix(self._shown, refresh=True)

    def advance(self) -> None:
        self._bar.update(1)

    def reach(self, done: int, total: int | None = None) -> None:
        """Show ``done`` of ``total`` (a callback of ``collect(on_turn=...)``)."""
        if total is not None and self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        self._bar.close()


class Table:
    """A small text table of evaluation metrics: one row per metric, one column per stage.

    The CLI prints it at the end of ``sft``, ``train`` and ``eval`` (e.g. success before
    and after training).
    """

    SHOWN = ("success", "score", "turns", "valid_actions", "episodes")

    def __init__(self, title: str, header: list[str], rows: list[list[str]]):
        self.title, self.header, self.rows = title, header, rows

    @classmethod
    def from_metrics(cls, title: str, columns: Mapping[str, Mapping[str, float]]) -> Table:
        """``columns``: stage name -> ``eval/*`` metrics (the prefix is dropped)."""
        names: list[str] = []
        for stats in columns.values():
            for key in stats:
                name = key.split("/", 1)[1] if "/" in key else key
                if name not in names and (name in cls.SHOWN or name.startswith("success/")):
                    names.append(name)
        order = {n: i for i, n in enumerate(cls.SHOWN)}
        names.sort(key=lambda n: (order.get(n, len(order)), n))
        rows = []
        for name in names:
            row = [name]
            for stats in columns.values():
                value = next((v for k, v in stats.items() if k.endswith("/" + name)), None)
                row.append("-" if value is None else _fmt(name, value))
            rows.append(row)
        return cls(title, ["metric", *columns], rows)

    def render(self) -> str:
        table = [self.header, *self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.header))]
        lines = [self.title]
        for j, row in enumerate(table):
            cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
            lines.append("  ".join(cells).rstrip())
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _fmt(name: str, value: float) -> str:
    if name == "episodes":
        return f"{value:.0f}"
    if name == "turns":
        return f"{value:.1f}"
    return f"{value:.3f}"


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (an empty list if it does not exist); a line that
    is not a JSON record is a one-line ConfigError naming the file and the line, except an
    unfinished last line (no newline yet: the run is writing it, or was killed while it
    did), which is left out."""
    from mcgpo.training.config import ConfigError

    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not text.endswith("\n"):  # still being written
                break
            raise ConfigError(f"{path} line {number}: not a JSON record ({err.msg})") from None
        if not isinstance(record, dict):
            raise ConfigError(
                f"{path} line {number}: not a JSON record (a {type(record).__name__})"
            )
        records.append(record)
    return records


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as text
    return value


def run_stages(folder: Path) -> dict[str, dict[str, float]]:
    """Held-out evaluations recorded in a run folder, labelled for a before/after table.

    An ``mcgpo sft`` folder gives "untrained" and "after SFT"; an ``mcgpo train`` folder
    gives "<algo> update <n>" for its last evaluation (its update-0 evaluation is the same
    policy as the warm start it came from, so it is listed only when it is the only one).
    """
    folder = Path(folder)
    sft = folder / "sft.json"
    if sft.is_file():
        data = json.loads(sft.read_text(encoding="utf-8"))
        return {"untrained": data["before"], "after SFT": data["after"]}
    records = [r for r in read_metrics(folder / "metrics.jsonl") if "eval/episodes" in r]
    if not records:
        return {}
    algo = _config_value(folder / "config.toml", "name", section="algo") or "train"
    last = records[-1]
    label = f"{algo} update {last['update']}"
    return {label: {k: v for k, v in last.items() if k.startswith("eval/")}}


def _config_value(path: Path, key: str, section: str) -> Any:
    from mcgpo.training.presets import parse_toml

    if not path.is_file():
        return None
    return parse_toml(path.read_text(encoding="utf-8"), str(path)).get(section, {}).get(key)
