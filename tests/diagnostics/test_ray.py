"""The group bootstrap's blocks of draws on Ray equal the local run to the bit.

A local Ray cluster with two CPUs is started once for the module. ``group_bootstrap(ray=True)``
gives the local draws and estimates on simulated tables with ties; ``spotstop card --ray``
writes the local card.json (provenance's timestamp aside) for the demo; without ``--ray``
nothing imports Ray; without the extra ``--ray`` says what to install.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from spotstop.cli import main  # noqa: E402
from spotstop.diagnostics import CaseTable, group_bootstrap, simulate_log  # noqa: E402
from spotstop.diagnostics._errors import UndefinedMetricWarning  # noqa: E402

from tests._support import REPO_ROOT  # noqa: E402

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    """A local Ray cluster with two CPUs, shut down after the module."""
    if ray.is_initialized():  # pragma: no cover - another module left one running
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


def _tied(n: int, rng: int, decimals: int) -> CaseTable:
    t = simulate_log(n, rng=rng)
    return CaseTable(
        case_id=t.case_id,
        label=t.label,
        contrast_id=t.contrast_id,
        situation_id=t.situation_id,
        score=np.round(t.score, decimals),
    )


def _same_estimate(a: Any, b: Any) -> bool:
    def bits(x: float) -> tuple[bool, float]:
        return (math.isnan(x), 0.0 if math.isnan(x) else x)

    return (
        bits(a.value) == bits(b.value)
        and bits(a.ci.low) == bits(b.ci.low)
        and bits(a.ci.high) == bits(b.ci.high)
        and a.n == b.n
    )


@pytest.mark.parametrize(("n", "decimals", "n_boot"), [(150, 1, 610), (400, 2, 250)])
def test_ray_bootstrap_equals_local_bit_for_bit(ray_cluster, n, decimals, n_boot):
    t = _tied(n, 7, decimals)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        local = group_bootstrap(t, n_boot=n_boot, rng=11)
        remote = group_bootstrap(t, n_boot=n_boot, rng=11, ray=True, chunk_size=64)
    assert remote.n_boot == local.n_boot == n_boot
    assert set(remote.draws) == set(local.draws)
    for k, d in local.draws.items():
        assert d.shape == (n_boot,)
        np.testing.assert_array_equal(remote.draws[k], d, err_msg=k)
    for k, e in local.estimates.items():
        assert _same_estimate(remote.estimates[k], e), k
    assert remote.n_nan_draws == local.n_nan_draws


def test_card_with_ray_equals_the_local_card(ray_cluster, tmp_path: Path) -> None:
    args = ["card", "--simulated", "--n-boot", "600", "--seed", "3", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "local")]) == 0
    assert main([*args, "--out", str(tmp_path / "ray"), "--ray"]) == 0

    def doc(name: str) -> dict[str, Any]:
        d = json.loads((tmp_path / name / "card.json").read_text(encoding="utf-8"))
        d["provenance"].pop("created_utc")
        return dict(d)

    local, remote = doc("local"), doc("ray")
    assert local["settings"]["n_boot"] == 600
    assert remote == local


def test_a_local_card_imports_no_ray(tmp_path: Path) -> None:
    """Without --ray the card never imports Ray (a fresh process: this module has)."""
    code = textwrap.dedent(
        f"""
        import sys
        from spotstop.cli import main
        assert main(["card", "--simulated", "--n-boot", "50", "--quiet", "--out", {str(tmp_path)!r}]) == 0
        print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "card.json").is_file()


def test_card_ray_without_the_extra_says_what_to_install(monkeypatch, capsys, tmp_path) -> None:
    for mod in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "spotstop.guard._batch_ray", raising=False)
    monkeypatch.delitem(sys.modules, "spotstop.diagnostics._bootstrap_ray", raising=False)
    rc = main(["card", "--simulated", "--n-boot", "20", "--quiet", "--out", str(tmp_path), "--ray"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "spotstop card: needs the 'ray' extra (ray is not installed): pip install 'spotstop[ray]'"
    ]
