"""``python -m spotstop.cli``: the ``spotstop`` command."""

import sys

from spotstop.cli import main

if __name__ == "__main__":  # not again in a spawned child process (export of a large member)
    sys.exit(main())
