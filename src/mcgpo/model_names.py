"""What ``--model`` may name: ``tiny``, or a local folder written by ``save_pretrained``;
nothing is downloaded. A missing folder named like a Hugging Face hub id gets the command
that downloads it (:func:`hub_id_hint`). Free of torch, so that ``mcgpo train --model
Qwen/Qwen2.5-0.5B`` without the folder answers in one line before anything heavy loads;
:mod:`mcgpo.policy.loading` names the same hint in its own error."""

from __future__ import annotations

from pathlib import Path

__all__ = ["hub_id_hint"]


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
