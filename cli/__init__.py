"""``spotstop``: the command line — the house's composition root.

This folder is the "CLI | the composition root" row of DESIGN.md's table of rooms: it is not
a room and owns no command logic. It holds one table of subcommands (:data:`COMMANDS`: name →
the room module that owns it, the function that adds its parser, the extras it needs) and
loads a room's parser module only when its command is chosen, so ``spotstop --help`` imports
no room and no model library. A command whose extra is missing exits 2 with one line naming
the extra to install (:data:`MODULE_EXTRAS`), never a traceback. The demo, which crosses
every room, lives here too (:func:`run_demo`, and :func:`make_demo_bundle` for the bundle alone,
which benchmarks reuse); the root may import every room, lazily.

Exit status: 0 success (for ``check``: SAFE), 1 UNSAFE or a failure of the work itself,
2 usage or input errors and missing extras.
"""

from spotstop.cli._demo import make_demo_bundle, run_demo
from spotstop.cli._root import COMMANDS, MODULE_EXTRAS, Command, build_parser, install_hint, main

__all__ = [
    "COMMANDS",
    "MODULE_EXTRAS",
    "Command",
    "build_parser",
    "install_hint",
    "main",
    "make_demo_bundle",
    "run_demo",
]
