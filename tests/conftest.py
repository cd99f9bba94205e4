"""Shared fixtures: the tiny test pair is built once per test session."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# In a pytest-xdist worker (CI runs two, one a core), torch computes on one thread, here and in
# the subprocesses the tests start: two workers of two threads each on two cores spent half
# their time waiting for each other. Set before anything imports torch; a test that needs
# other thread counts sets them itself.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests._support.make_bundle import BUNDLE_DIR
from tests._support.pair import TINY_MEMBERS


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


def _shared_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]
) -> Path:
    """A folder ``build`` fills once for the whole test run, for fixtures whose result the tests
    only read. In pytest-xdist's workers the first worker to ask builds it, under a file lock,
    in the folder the run's workers share; the others wait and read it (a build that failed
    part-way is started again by the next one to ask). Without workers, a folder of this
    session's own."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def committed_bundle() -> Path:
    """The committed tiny ONNX bundle (``tests/_support/tiny_bundle``: the tiny TEST pair at fp32
    with a demo policy; ``python -m tests._support.make_bundle`` writes it). The guard serves it
    with onnxruntime alone: no torch. Read-only: copy it before changing anything in it. A
    missing bundle fails the test, never skips it."""
    if not (BUNDLE_DIR / "manifest.yaml").is_file():
        pytest.fail(
            f"the committed test bundle {BUNDLE_DIR} is missing; write it with "
            "`python -m tests._support.make_bundle` (needs the export extra) and commit it"
        )
    return BUNDLE_DIR


@pytest.fixture(scope="session")
def runtime_bundle(committed_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the committed bundle made once per session, shared by the tests that only
    read it (a guard writes its situation state and logs elsewhere)."""
    dst = tmp_path_factory.mktemp("runtime") / "bundle"
    shutil.copytree(committed_bundle, dst)
    return dst


@pytest.fixture
def bundle_copy(committed_bundle: Path, tmp_path: Path) -> Path:
    """A copy of the committed bundle of this test's own, to change at will."""
    dst = tmp_path / "bundle"
    shutil.copytree(committed_bundle, dst)
    return dst


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
    """Both tiny members exported at fp32 (length buckets 128, 256), ONCE per test run (one
    export for all of pytest-xdist's workers: :func:`_shared_once`).

    The Qwen3.5 decoder exports with the dynamo exporter (about a minute on 2 cores), so the slow
    tests that need a Qwen export derive their other precisions from this bundle
    (``spotstop.export.onnx_bundle.derive_bundle``) instead of exporting again. Read-only: copy it
    before changing anything in it.
    """
    from spotstop.cli import main

    def build(folder: Path) -> None:
        args = ["export", "--out", str(folder / "b32"), "--precision", "fp32"]
        for m in TINY_MEMBERS:  # (the tiny pair is seeded: every worker's is the same bytes)
            args += ["--member", str(tiny_pair / m)]
        assert main([*args, "--buckets", "128,256", "--trt", "off"]) == 0

    return _shared_once(tmp_path_factory, "pair32", build) / "b32"


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
