"""Part d of the device check (benchmarks/gpu/gpu_check.py): ``mcgpo train`` on household,
as a GPU user runs it (the switches at their defaults) and with the compiled layers off, in
the part's own process."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from gpu_check_context import PRECISION, Part, has_field, num

DISK_CAP = 2e9  # bytes part d may write (the device machine's 64 GiB disk holds the image too)
# part d's bytes on disk per parameter: the model saved for it in bf16 (2), one checkpoint
# (fp32 weights 4 + AdamW moments 8) and the final fp32 model (4)
DISK_BYTES_PER_PARAM = 18
# the two runs: (name in the rows, {config section.field: value}) for the speed switches;
# "defaults" is what a GPU user gets (train.compile auto: compiled on CUDA; the rollout's
# sampler and decode attention left at their defaults: the dynamic sampler, which
# rollout.decode_attention does not touch, as it applies to the static sampler of part a),
# "switches off" the eager layers
RUNS = (("defaults", {"train.compile": "auto"}), ("switches off", {"train.compile": "false"}))
RUN_MEASURES = ("exit code", "seconds", "loss/task", "peak memory GB")


def disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def train_layers(part: Part, cap: float = DISK_CAP) -> int:
    """Most layers of the part's shape (household vocabulary) whose run fits ``cap`` on disk."""
    from mcgpo.policy.memory import parameter_count

    full = part.config(vocab_size=len(part.tokenizer)).num_hidden_layers
    for layers in range(full, 0, -1):
        params = parameter_count(
            part.config(vocab_size=len(part.tokenizer), num_hidden_layers=layers)
        )
        if DISK_BYTES_PER_PARAM * params <= 0.9 * cap:
            return layers
    raise ValueError(f"not even one layer fits {cap / 1e9:.1f} GB on disk")


def switch_flags(switches: dict[str, str]) -> tuple[list[str], list[str]]:
    """(``--section.field value`` flags for the switches this checkout's config has, the
    names of those it lacks)."""
    from mcgpo.training.config import RunConfig

    sections = {f.name: f.default_factory for f in dataclasses.fields(RunConfig)}
    flags, absent = [], []
    for name, value in switches.items():
        section, _, field = name.partition(".")
        kind = sections.get(section)
        if dataclasses.is_dataclass(kind) and has_field(kind, field):
            flags += [f"--{name}", value]
        else:
            absent.append(name)
    return flags, absent


def run_measures(name: str) -> tuple[str, ...]:
    return tuple(f"mcgpo train {m}, {name}" for m in RUN_MEASURES)


def part_train(part: Part) -> None:
    """``mcgpo train``: one household update from a model saved to the work folder, once as
    a GPU user runs it and once with the compiled layers off."""
    from mcgpo.policy import save_policy

    layers = train_layers(part)
    config = part.config(vocab_size=len(part.tokenizer), num_hidden_layers=layers)
    model = part.model(torch.bfloat16, config)
    params = part.env["parameters"]
    full = part.config().num_hidden_layers
    folder = part.work / "train"
    shutil.rmtree(folder, ignore_errors=True)
    saved = save_policy(model, part.tokenizer, folder / "model")
    del model
    part.emit(
        ("mcgpo train model", f"{layers} of {full} layers",
         f"{params / 1e6:.1f} M parameters, household vocabulary {len(part.tokenizer)}"
         + ("" if layers == full else ": fewer layers so that its files fit "
            f"{DISK_CAP / 1e9:.0f} GB")),
    )  # fmt: skip
    used = 0
    for name, switches in RUNS:
        flags, absent = switch_flags(switches)
        used = max(used, one_run(part, saved, folder / name.replace(" ", "_"), name, flags, absent))
    shutil.rmtree(folder, ignore_errors=True)
    part.emit(
        ("mcgpo train disk GB", num(used / 1e9),
         f"input model, checkpoint, final model (cap {DISK_CAP / 1e9:.0f} GB); deleted after"),
    )  # fmt: skip


def one_run(part: Part, saved: Any, folder: Path, name: str, flags: list[str],
            absent: list[str]) -> int:  # fmt: skip
    """One ``mcgpo train`` run; its rows; the bytes its folder and the saved model hold."""
    from mcgpo.cli import main
    from mcgpo.training.metrics import read_metrics

    out = folder / "run"
    args = [
        "train", "--preset", "household-smoke", "--model", str(saved), "--out", str(out),
        "--device", part.device.type, "--train.updates", "1", "--eval.tasks", "0",
        "--progress", "false", "--train.precision", PRECISION, *flags,
    ]  # fmt: skip
    part.reset_peak()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the CLI's own lines: not the table
        rc = main(args)
    seconds = time.perf_counter() - start
    updates = [r for r in read_metrics(out / "metrics.jsonl") if "loss/task" in r]
    used = disk_bytes(out) + disk_bytes(Path(saved))
    shutil.rmtree(out, ignore_errors=True)
    loss = updates[-1]["loss/task"] if updates else float("nan")
    how = " ".join(flags) or "no switch flags"
    if name == "defaults":
        how += " (rollout.sampler and rollout.decode_attention at their defaults)"
    if absent:
        how += f" ({', '.join(absent)}: not in this checkout's config)"
    measures = run_measures(name)
    part.emit(
        (measures[0], str(rc), f"household-smoke, 1 update, eval off, --train.precision "
         f"{PRECISION} {how}"),
        (measures[1], f"{seconds:.1f}", "load, rollouts, update (compilation included), "
         "checkpoint"),
        (measures[2], f"{loss:.4f}", f"{len(updates)} update(s) logged"),
        (measures[3], num(part.peak_gb()), part.memory_kind),
    )  # fmt: skip
    return used
