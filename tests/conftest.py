"""Shared fixtures: the tiny test pair is built once per test session."""

from __future__ import annotations

import importlib.util
import io
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from spotstop.export.configs import EXPORT_CONFIGS

#: The tiny TEST pair's member folders, one per registered architecture (as export/tiny.py
#: names them); torch-free, so collection needs no export extra.
TINY_MEMBERS = tuple(f"tiny-{model_type}" for model_type in EXPORT_CONFIGS)


@pytest.fixture(scope="session", autouse=True)
def _journal_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Guards of this test session keep their default journals (``$XDG_STATE_HOME``) in a
    temp folder, never in the home of whoever runs the tests (subprocesses inherit it)."""
    old = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    yield
    if old is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = old


def load_bench(name: str, module: str | None = None) -> Any:
    """``bench/NAME.py`` as a module (the bench scripts are not a package), registered in
    ``sys.modules`` as ``module`` (default ``name``)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module or name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both tiny members under one folder (a TEST pair: its decisions mean nothing)."""
    pytest.importorskip("torch")
    from spotstop.export.tiny import build_tiny_pair

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_pair(root, seed=0)
    return root


@pytest.fixture(scope="session", params=TINY_MEMBERS)
def tiny_member_dir(request: pytest.FixtureRequest, tiny_pair: Path) -> Path:
    return tiny_pair / request.param


@pytest.fixture(scope="session")
def loaded_members(tiny_pair: Path) -> dict[str, object]:
    from spotstop.guard import load_member

    return {name: load_member(tiny_pair / name) for name in TINY_MEMBERS}


@pytest.fixture(scope="session")
def tiny_pair_fp32_bundle(tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both tiny members exported at fp32 (length buckets 128, 256), ONCE per session.

    The Qwen3.5 decoder exports with the dynamo exporter (about a minute on 2 cores), so the slow
    tests that need a Qwen export derive their other precisions from this bundle
    (``spotstop.export.onnx_bundle.derive_bundle``) instead of exporting again. Read-only: copy it
    before changing anything in it.
    """
    from spotstop.cli import main

    out = tmp_path_factory.mktemp("pair32") / "b32"
    args = ["export", "--out", str(out), "--precision", "fp32", "--buckets", "128,256"]
    for m in TINY_MEMBERS:
        args += ["--member", str(tiny_pair / m)]
    assert main([*args, "--trt", "off"]) == 0
    return out


#: Registered architectures whose export is slow, and why: their member-export test
#: cases are ``slow`` and read the pair's one fp32 export (``tiny_pair_fp32_bundle``).
SLOW_EXPORT = {"qwen3_5": "its decoder needs the dynamo exporter: about a minute on 2 cores"}


def by_arch(*, bundle: bool = False) -> list[Any]:
    """One test case per registered export config (tests/test_export.py checks that every
    export test has them); with ``bundle`` (the case exports the whole member), a case of
    :data:`SLOW_EXPORT` is marked ``slow``."""
    from spotstop.export.configs import EXPORT_CONFIGS

    return [
        pytest.param(a, id=a, marks=[pytest.mark.slow] if bundle and a in SLOW_EXPORT else [])
        for a in sorted(EXPORT_CONFIGS)
    ]


@pytest.fixture(scope="session")
def member_fp32_bundles(
    tiny_pair: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """architecture → an fp32 bundle (with TensorRT script and Triton layout) of its tiny
    member alone, exported on first use, once per session."""
    from spotstop.cli import main

    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            out = tmp_path_factory.mktemp("member32") / arch
            args = ["export", "--out", str(out), "--precision", "fp32", "--buckets", "128,256"]
            assert main([*args, "--member", str(tiny_pair / f"tiny-{arch}"), "--triton"]) == 0
            made[arch] = out
        return made[arch]

    return get


def fp32_bundle(request: pytest.FixtureRequest, arch: str) -> Path:
    """An fp32 bundle holding ``arch``'s tiny member (see :data:`SLOW_EXPORT`)."""
    if arch in SLOW_EXPORT:
        return request.getfixturevalue("tiny_pair_fp32_bundle")
    return request.getfixturevalue("member_fp32_bundles")(arch)


def make_image_bytes(seed: int, size: tuple[int, int] = (80, 48), fmt: str = "PNG") -> bytes:
    """A random RGB image, encoded (width, height = size)."""
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt)
    return buf.getvalue()
