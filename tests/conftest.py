"""Shared fixtures: the tiny test pair is built once per test session."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both tiny members under one folder (a TEST pair: its decisions mean nothing)."""
    pytest.importorskip("torch")
    from export.tiny import build_tiny_pair

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_pair(root, seed=0)
    return root


@pytest.fixture(scope="session", params=["tiny-qwen3_5", "tiny-lfm2_vl"])
def tiny_member_dir(request: pytest.FixtureRequest, tiny_pair: Path) -> Path:
    return tiny_pair / request.param


@pytest.fixture(scope="session")
def loaded_members(tiny_pair: Path) -> dict[str, object]:
    from guard import load_member

    return {name: load_member(tiny_pair / name) for name in ("tiny-qwen3_5", "tiny-lfm2_vl")}


def make_image_bytes(seed: int, size: tuple[int, int] = (80, 48), fmt: str = "PNG") -> bytes:
    """A random RGB image, encoded (width, height = size)."""
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt)
    return buf.getvalue()
