"""Where a run folder's checkpoints lie (the layout is in :mod:`mcgpo.training.checkpoint`):
``checkpoints/latest`` names the newest complete one, ``checkpoints/update-NNNNNN`` are the
ones kept. Finding them reads no checkpoint, so the commands that only look at a run folder
(``mcgpo eval --run``'s policy, ``train --resume``'s checks) stay free of torch."""

from __future__ import annotations

from pathlib import Path

__all__ = ["kept_checkpoints", "latest_checkpoint"]


def latest_checkpoint(run_folder: Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    pointer = Path(run_folder) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "trainer.pt").is_file() else None


def kept_checkpoints(run_folder: Path) -> list[Path]:
    """The checkpoints a run folder keeps, newest first, from the one ``latest`` names."""
    latest = latest_checkpoint(run_folder)
    if latest is None:
        return []
    kept = sorted(p for p in latest.parent.iterdir() if p.name.startswith("update-"))
    return [p for p in reversed(kept) if p.name <= latest.name and p.is_dir()]
