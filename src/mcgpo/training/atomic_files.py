"""Files written whole or not at all: a temporary file next to the target, flushed to disk,
then renamed over it with ``os.replace``, so that a crash leaves the old file or the new one,
never half of one. Every file of a run folder that is rewritten (``latest``, ``eval.json``,
``sft.json``, ``results.md``, ...) goes through here."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
