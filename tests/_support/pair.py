"""The tiny TEST pair's cases: its member folders, the architectures whose export is slow,
one case per registered export config, and the fp32 bundle of an architecture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spotstop.export.configs import EXPORT_CONFIGS

#: The tiny TEST pair's member folders, one per registered architecture (as export/tiny.py
#: names them); torch-free, so collection needs no export extra.
TINY_MEMBERS = tuple(f"tiny-{model_type}" for model_type in EXPORT_CONFIGS)

#: Registered architectures whose export is slow, and why: their member-export test
#: cases are ``slow`` and read the pair's one fp32 export (``tiny_pair_fp32_bundle``).
SLOW_EXPORT = {"qwen3_5": "its decoder needs the dynamo exporter: about a minute on 2 cores"}


def by_arch(*, bundle: bool = False) -> list[Any]:
    """One test case per registered export config (tests/export/test_onnx.py checks that every
    export test has them); with ``bundle`` (the case exports the whole member), a case of
    :data:`SLOW_EXPORT` is marked ``slow``."""
    from spotstop.export.configs import EXPORT_CONFIGS

    return [
        pytest.param(a, id=a, marks=[pytest.mark.slow] if bundle and a in SLOW_EXPORT else [])
        for a in sorted(EXPORT_CONFIGS)
    ]


def fp32_bundle(request: pytest.FixtureRequest, arch: str) -> Path:
    """An fp32 bundle holding ``arch``'s tiny member (see :data:`SLOW_EXPORT`)."""
    if arch in SLOW_EXPORT:
        return request.getfixturevalue("tiny_pair_fp32_bundle")
    return request.getfixturevalue("member_fp32_bundles")(arch)
