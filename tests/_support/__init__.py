"""Helpers shared by the tests (fakes, log writers, tolerances, the tiny pair's cases).

Test modules import helpers from here, never from another test module; fixtures stay in
``tests/conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

#: ``tests/``
TESTS_DIR = Path(__file__).resolve().parents[1]
#: the repository's root (pyproject.toml, the rooms, bench/, jetson/)
REPO_ROOT = TESTS_DIR.parent
