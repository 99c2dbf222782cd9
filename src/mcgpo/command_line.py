"""The commands' argument parser: a command-line mistake is one line.

argparse answers a mistake with its usage and the error, two lines or more; mcgpo's
commands (``bench``/``ablate``/``sweep``, ``export``, ``env serve``, ``alfworld-generate``)
answer with one line, ``<prog>: error: <message>``, exit code 2. In the bottom layer (no
torch), so that every package's command can use it and a mistake is answered at once.
(``mcgpo``'s own parser, :mod:`mcgpo.cli`, raises instead: it words the line itself.)
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr, exit 2 (``--help`` as
    argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")
