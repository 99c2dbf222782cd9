"""``python -m mcgpo``: the ``mcgpo`` command (what ``torchrun -m mcgpo`` starts).

The call sits under the ``__main__`` guard: environment worker processes are started with
``spawn``, which imports the parent's main module again (as ``__mp_main__``) and must not
run the command a second time.
"""

import sys

from mcgpo.cli import main

if __name__ == "__main__":
    sys.exit(main())
