"""Checkpoints: model, optimiser, RNG states and counters, written atomically.

Layout inside a run folder::

    checkpoints/update-000004/model/       save_pretrained (weights + tokenizer); with LoRA
                                           the PEFT adapter folder (mcgpo.policy.lora)
    checkpoints/update-000004/trainer.pt   optimiser state, RNG states, counters
                                           (FSDP2: the full state gathered to rank 0)
    checkpoints/latest                     the name of the newest complete checkpoint

A checkpoint is built in a temporary folder next to its final place and renamed into place
with ``os.replace``; ``latest`` is rewritten the same way (temp file, then ``os.replace``).
A crash at any moment therefore leaves either the old or the new checkpoint, never half of
one. Only the newest ``keep`` checkpoints are kept. Finding them
(:func:`~mcgpo.training.checkpoint_folders.latest_checkpoint`, ``kept_checkpoints``) and the
atomic write (:mod:`mcgpo.training.atomic_files`) need no torch and live apart; this module
names them too.

RNG states (python ``random``, numpy's global generator, torch CPU and CUDA) are restored
on resume so that a stopped-and-resumed run equals the uninterrupted one.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mcgpo.training.atomic_files import atomic_write_text
from mcgpo.training.checkpoint_folders import kept_checkpoints, latest_checkpoint

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "atomic_write_text",
    "kept_checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "restore_rng",
    "rng_state",
    "save_checkpoint",
]


class CheckpointError(ValueError):
    """No usable checkpoint where one was expected."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path  # checkpoints/update-NNNNNN
    update: int  # updates completed
    task_cursor: int  # index of the next training task
    optimizer: dict[str, Any]  # optimiser state_dict
    rng: dict[str, Any]  # see rng_state()

    @property
    def model_path(self) -> Path:
        return self.path / "model"


def rng_state() -> dict[str, Any]:
    """The global RNG states as plain types and tensors (loadable with weights_only)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_folder: Path,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    update: int,
    task_cursor: int,
    keep: int = 2,
    optimizer_state: dict[str, Any] | None = None,
    model_state: dict[str, Any] | None = None,
    extra_files: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``update`` atomically; returns its folder.

    ``optimizer_state``: what to save instead of ``optimizer.state_dict()`` (FSDP2: the
    full state gathered from the ranks' shards, keyed by parameter name); ``model_state``:
    the weights to save instead of the model's own (FSDP2 without a replica: gathered);
    ``extra_files``: writes more files into the checkpoint's folder before it is renamed
    into place (the pending batches of ``train.async_lag``, :mod:`mcgpo.training.pending`)."""
    root = Path(run_folder) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"update-{update:06d}"
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    from mcgpo.policy.lora import has_lora, save_adapter

    if has_lora(model):  # LoRA: the adapters only (the base is the run's --model)
        save_adapter(model, tokenizer, tmp / "model", model_state)  # gathered if sharded
    else:
        model.save_pretrained(tmp / "model", state_dict=model_state)
        tokenizer.save_pretrained(tmp / "model")
    payload = {
        "update": update,
        "task_cursor": task_cursor,
        "optimizer": optimizer.state_dict() if optimizer_state is None else optimizer_state,
        "rng": rng_state(),
    }
    torch.save(payload, tmp / "trainer.pt")
    if extra_files is not None:
        extra_files(tmp)
    if final.exists():  # the same update saved again (e.g. the final save after a resume)
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / "latest", name + "\n")
    kept = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("update-"))
    for old in kept[: max(len(kept) - keep, 0)]:
        if old != final:
            shutil.rmtree(old)
    return final


def load_checkpoint(path: Path) -> Checkpoint:
    """Read ``trainer.pt`` of a checkpoint folder (the model is loaded by the caller); a
    file that cannot be read is a one-line CheckpointError naming it."""
    path = Path(path)
    file = path / "trainer.pt"
    if not file.is_file():
        raise CheckpointError(f"no checkpoint in {str(path)!r} (trainer.pt missing)")
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
        return Checkpoint(
            path=path,
            update=int(payload["update"]),
            task_cursor=int(payload["task_cursor"]),
            optimizer=payload["optimizer"],
            rng=payload["rng"],
        )
    except Exception as err:  # torch's errors on a damaged file are many and long
        raise CheckpointError(
            f"{str(file)!r} is damaged and cannot be read ({type(err).__name__})"
        ) from None
