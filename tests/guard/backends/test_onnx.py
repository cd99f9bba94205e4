"""The onnxruntime backend's sessions: intra-op threads chosen per graph by its size.

A small graph (the tiny test pair's) runs on one intra-op thread, whatever the cap; a large one
(the real members') on the caller's cap or onnxruntime's default. The choice changes where the
arithmetic runs, never what it computes: the scores are the default sessions' to float
tolerance.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from spotstop.guard import Member, MemberLoadError, Scene, load_bundle, load_bundle_member
from spotstop.guard.backends import _onnx
from spotstop.guard.backends._onnx import SMALL_GRAPH_BYTES, graph_bytes, intra_op_threads

from tests._support.images import make_image_bytes

REQUESTS = ("open the door", "hand me the knife", "put the cup on the table")


def _member(bundle: Path, threads: int | None = None) -> Member:
    b = load_bundle(bundle)
    return load_bundle_member(b, b.members[0], threads=threads)


def _applied(member: Member) -> dict[str, int]:
    """The intra-op threads onnxruntime's sessions hold (0: its default, all cores)."""
    be = member.backend
    graphs = {"vision": be.vision, "decoder": be._decoder(be.buckets[-1])}
    return {k: g.get_session_options().intra_op_num_threads for k, g in graphs.items()}


def test_the_rule_gives_one_thread_under_the_size_and_the_cap_above() -> None:
    assert intra_op_threads(0, None) == 1
    assert intra_op_threads(SMALL_GRAPH_BYTES - 1, 4) == 1
    assert intra_op_threads(SMALL_GRAPH_BYTES, None) is None  # onnxruntime's default
    assert intra_op_threads(SMALL_GRAPH_BYTES, 2) == 2
    assert intra_op_threads(10 * 2**30, 3) == 3


def test_a_graphs_bytes_count_its_weights_file(tmp_path: Path) -> None:
    (tmp_path / "decoder.onnx").write_bytes(b"g" * 10)
    (tmp_path / "decoder_L64.onnx").write_bytes(b"g" * 3)
    (tmp_path / "vision.onnx").write_bytes(b"v" * 7)
    assert graph_bytes(tmp_path / "vision.onnx", "vision") == 7  # no weights file
    (tmp_path / "decoder.onnx.data").write_bytes(b"w" * 100)
    assert graph_bytes(tmp_path / "decoder.onnx", "decoder") == 110
    assert graph_bytes(tmp_path / "decoder_L64.onnx", "decoder") == 103  # the shared file


def test_the_tiny_graphs_run_on_one_thread_whatever_the_cap(committed_bundle: Path) -> None:
    for cap in (None, 2):
        m = _member(committed_bundle, threads=cap)
        assert _applied(m) == {"vision": 1, "decoder": 1}
        assert m.backend.session_threads == {"vision": 1, "decoder": 1}


def test_a_large_graph_keeps_the_cap_or_the_default(
    committed_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_onnx, "SMALL_GRAPH_BYTES", 0)  # every graph counts as large
    assert _applied(_member(committed_bundle)) == {"vision": 0, "decoder": 0}
    assert _applied(_member(committed_bundle, threads=2)) == {"vision": 2, "decoder": 2}


def test_one_thread_gives_the_default_sessions_scores(
    committed_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = load_bundle(committed_bundle)
    scenes = [Scene(make_image_bytes(i, fmt="JPEG"), r) for i, r in enumerate(REQUESTS)]
    for bm in b.members:
        small = load_bundle_member(b, bm)
        assert small.backend.session_threads == {"vision": 1, "decoder": 1}
        got = [s.score for s in small.score(scenes)]
        with monkeypatch.context() as mp:
            mp.setattr(_onnx, "SMALL_GRAPH_BYTES", 0)
            default = load_bundle_member(b, bm)
            assert default.backend.session_threads == {"vision": None, "decoder": None}
            want = [s.score for s in default.score(scenes)]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_graph_gone_before_its_session_is_a_load_error(
    committed_bundle: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(committed_bundle, bundle)
    b = load_bundle(bundle, verify=False)
    m = load_bundle_member(b, b.members[0])
    m.backend.release()
    m.backend._vision_path.unlink()  # after the load: an on-demand session's next open
    with pytest.raises(MemberLoadError, match="cannot read"):
        m.backend._session(m.backend._vision_path, "vision")
