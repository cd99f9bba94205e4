"""``python -m spotstop.cli``: the ``spotstop`` command."""

import sys

from spotstop.cli import main

sys.exit(main())
