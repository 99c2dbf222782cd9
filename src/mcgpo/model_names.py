"""What ``--model`` may name: ``tiny``, a local folder written by ``save_pretrained``, or a
LoRA run's adapter folder (PEFT's ``adapter_config.json``: :func:`is_adapter_folder`);
nothing is downloaded. A missing folder named like a Hugging Face hub id gets the command
that downloads it (:func:`hub_id_hint`). Free of torch, so that ``mcgpo train --model
Qwen/Qwen2.5-0.5B`` without the folder, or ``mcgpo export --merge`` of a folder without
adapters, answers in one line before anything heavy loads; :mod:`mcgpo.policy.loading` and
:mod:`mcgpo.policy.lora` name the same functions."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ADAPTER_CONFIG", "hub_id_hint", "is_adapter_folder"]

ADAPTER_CONFIG = "adapter_config.json"  # PEFT's, in every adapter folder


def hub_id_hint(path: str | Path) -> str:
    """For a missing folder named like a Hugging Face hub id (``owner/name``): the tail of
    its error, saying that only a local folder loads (nothing is downloaded); else ``""``."""
    text = str(path)
    parts = text.split("/")
    if len(parts) != 2 or not all(parts) or text.startswith((".", "~")):
        return ""
    return (
        f"; pass a local folder: download the hub model first, e.g. `hf download {text} "
        f"--local-dir models/{parts[1]}`, then --model models/{parts[1]} (no download here)"
    )


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` is a PEFT adapter folder (it has ``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()
