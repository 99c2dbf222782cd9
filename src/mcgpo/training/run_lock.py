"""One process writes a run folder at a time: ``mcgpo train`` and ``mcgpo sft`` hold an
exclusive lock on ``<out>/.lock`` (``fcntl.flock``) from their start to the end of the
process, so that a second one into the same ``--out`` (a ``--resume`` of a run still going,
a fresh run started twice) is one line naming the process that holds it, instead of two
processes writing the same checkpoints and records. The operating system drops the lock
when the process ends, however it ends (Ctrl-C, a crash, ``kill -9``): nothing to clean up.

The same process may take the lock of a folder again (``mcgpo.train`` called twice, a run
and its resume, also after moving the folder); ``mcgpo eval`` takes none (it writes ``eval.json`` once, atomically). Where
``fcntl`` is missing (Windows) nothing is locked.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcgpo.training.config import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "lock_run_folder"]

LOCK_NAME = ".lock"
# (device, inode) of a folder -> the open descriptor holding its lock (for the process's life);
# by inode, so that a folder this process locked and then moved is still its own
_HELD: dict[tuple[int, int], int] = {}


def lock_run_folder(folder: str | Path, command: str = "") -> None:
    """Hold ``folder``'s lock for the rest of this process; a one-line ConfigError naming
    the holder if another process holds it. ``folder`` exists (``writable_folder``)."""
    if fcntl is None:
        return
    stat = os.stat(folder)
    key = (stat.st_dev, stat.st_ino)
    if key in _HELD:
        return
    fd = os.open(Path(folder) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(
            f"run folder {str(folder)!r} is in use by {holder}; wait for it to end or use "
            "another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()}{f' ({command})' if command else ''}\n".encode())
    _HELD[key] = fd
