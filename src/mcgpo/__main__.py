"""``python -m mcgpo``: the ``mcgpo`` command (what ``torchrun -m mcgpo`` starts)."""

import sys

from mcgpo.cli import main

sys.exit(main())
