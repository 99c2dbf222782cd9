"""Helpers of the multi-process tests: launch ``python -m mcgpo`` and read saved weights."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import torch


def launch(
    args: list[str],
    timeout: float = 600,
    *,
    path: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
) -> None:
    """``python -m mcgpo ARGS`` in a subprocess on this checkout's ``src`` (and the folders
    of ``path`` after it, with ``env`` added to the environment); it must exit 0 within
    ``timeout`` seconds (a rank stuck in a collective fails the test, not CI)."""
    folders = [str(Path(__file__).parents[2] / "src"), *map(str, path)]
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(folders)}
    done = subprocess.run(
        [sys.executable, "-m", "mcgpo", *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def saved_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file of a saved model folder."""
    from safetensors.torch import load_file

    return load_file(glob.glob(str(folder / "*.safetensors"))[0])
