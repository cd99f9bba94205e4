"""The robot's install runs the robot's commands: a fresh venv with the base dependencies only.

The project is installed for real (not editable) into a new virtual environment without any
extra, from a copy of the files a clean clone holds: pyproject.toml, README.md and the folders
its package-dir mapping names (a copy, so that no ``build/`` left in the checkout can slip stale
modules into the wheel). This proves the wheel carries every package through the mapping and
that torch, transformers, scipy and matplotlib are not needed by ``policy init``, ``policy
list``, ``policy activate``, ``check``, ``verify-bundle``'s runtime half and ``serve``, run
against the committed tiny ONNX bundle (``tests/_support/tiny_bundle``). A command that needs
an extra says which, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests._support.images import make_image_bytes

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOT_IN_BASE = ("torch", "transformers", "scipy", "matplotlib")


def _source_copy(dst: Path) -> Path:
    """pyproject.toml, README.md and every mapped folder, as a clean clone has them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in pyproject["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, dst / folder, ignore=ignore)
    return dst


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv holding spotstop installed without extras (its bin/ folder)."""
    tmp = tmp_path_factory.mktemp("base")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    src = _source_copy(tmp / "src")
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "SPOTSTOP_HOME": str(home), "HF_HUB_OFFLINE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_robots_commands_run_on_the_base_install(
    base_venv: Path, committed_bundle: Path, tmp_path: Path
) -> None:
    import httpx

    env = _env(tmp_path / "home")

    def spotstop(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(base_venv / "spotstop"), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )

    # -- nothing of the extras is importable there ----------------------------------------------
    probe = "import importlib.util as u, json; print(json.dumps([m for m in %r if u.find_spec(m)]))"
    out = subprocess.run(
        [str(base_venv / "python"), "-c", probe % (NOT_IN_BASE,)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    )
    assert json.loads(out.stdout) == []

    bundle = tmp_path / "bundle"
    # the committed export, without its policy (policy init writes the first one)
    shutil.copytree(
        committed_bundle, bundle, ignore=shutil.ignore_patterns("policy.yaml", "policies")
    )
    pool = tmp_path / "pool"
    pool.mkdir()
    for i in range(8):
        (pool / f"frame{i}.jpg").write_bytes(make_image_bytes(100 + i, (96, 64), "JPEG"))
    img = tmp_path / "cam.jpg"
    img.write_bytes(make_image_bytes(7, (96, 64), "JPEG"))

    # -- policy init / list / activate ----------------------------------------------------------
    r = spotstop("policy", "init", str(bundle), "--pool", str(pool), "--request", "open the door")
    assert r.returncode == 0, r.stderr
    assert (bundle / "policy.yaml").is_file()
    r = spotstop(
        "policy", "init", str(bundle), "--pool", str(pool), "--request", "x", "--kind", "situation"
    )
    assert r.returncode == 0, r.stderr
    r = spotstop("policy", "list", str(bundle))
    assert r.returncode == 0 and "v0001" in r.stdout and "v0002" in r.stdout, r.stderr
    r = spotstop("policy", "activate", str(bundle), "v0002")
    assert r.returncode == 0 and "activated v0002" in r.stdout, r.stderr

    # -- check ----------------------------------------------------------------------------------
    r = spotstop("check", str(img), "--request", "open the door", "--bundle", str(bundle), "--json")
    assert r.returncode in (0, 1), r.stderr
    decision = json.loads(r.stdout)
    assert decision["label"] in ("SAFE", "UNSAFE") and not decision["fail_closed"]
    assert r.returncode == (0 if decision["label"] == "SAFE" else 1)

    # -- verify-bundle: the runtime half, and one line about the rest ---------------------------
    r = spotstop("verify-bundle", str(bundle), "--scenes", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout and "Traceback" not in r.stderr
    hints = [line for line in r.stdout.splitlines() if "spotstop[export]" in line]
    assert len(hints) == 1 and "torch-reference comparison" in hints[0]

    # -- serve ----------------------------------------------------------------------------------
    # a log that holds an old decision, which retention archives (decisions younger than 10
    # minutes are never archived), as Parquet, with the base install's pyarrow
    from spotstop.guard import DecisionLog, DecisionRecord

    old = DecisionRecord(
        time=time.time() - 86400.0, request="an old decision", member_scores={"a": 0.0},
        fused_score=0.0, threshold=0.0, policy="frozen", label="UNSAFE", fail_closed=False,
        latency_ms={"total": 1.0}, bundle_id="b", prompt_hash="p",
    )  # fmt: skip
    with DecisionLog(tmp_path / "serve.sqlite") as lg:
        lg.append(old)
    port = _free_port()
    err = tmp_path / "serve.stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [str(base_venv / "spotstop"), "serve", "--bundle", str(bundle), "--port", str(port),
             "--log", str(tmp_path / "serve.sqlite"), "--state-dir", str(tmp_path / "state"),
             "--journal", str(tmp_path / "journal" / "j"), "--log-max-bytes", "1",
             "--log-level", "warning"],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            t0 = time.monotonic()
            while True:
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, f"the server exited: {err.read_text()}"
                assert time.monotonic() - t0 < 120, "the server did not become ready"
                time.sleep(0.2)
            files = {"image": ("cam.jpg", img.read_bytes(), "image/jpeg")}
            resp = c.post("/v1/check", files=files, data={"request": "open the door"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["label"] in ("SAFE", "UNSAFE")
            # a 1-byte budget: retention archives the old decision, with the base install
            t0 = time.monotonic()
            while "spotstop_log_rows_archived_total 1.0" not in c.get("/metrics").text:
                assert time.monotonic() - t0 < 60, f"nothing was archived: {err.read_text()}"
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    with DecisionLog(tmp_path / "serve.sqlite") as lg:
        assert lg.count() == 2 and len(lg.archives()) == 1
        assert lg.get(old.decision_id) is not None  # read back from the archive
        live = lg._fetchall("SELECT decision_id FROM decisions", [])
        assert live == [(resp.json()["decision_id"],)]  # the new decision stays live

    # -- a command that needs an extra says which, in one line ----------------------------------
    for args, extra, libraries in (
        (("card", "--demo", "--out", str(tmp_path / "card")), "diag", ("scipy",)),
        (("tiny", "--out", str(tmp_path / "tiny")), "export", ("torch", "transformers")),
    ):
        r = spotstop(*args)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        *before, line = r.stderr.splitlines()  # `tiny` draws its progress bar first
        assert any(
            line == f"spotstop {args[0]}: needs the '{extra}' extra ({lib} is not installed): "
            f"pip install 'spotstop[{extra}]'"
            for lib in libraries
        ), line
        assert before == [] or args[0] != "card"

    # -- the wheel carries the demo log that `card --demo` reads (with the diag extra) ----------
    probe = (
        "import importlib.resources as r; d = r.files('spotstop.diagnostics') / 'data'; "
        "print((d / 'demo_log.sqlite').is_file(), (d / 'demo_log.json').is_file())"
    )
    out = subprocess.run(
        [str(base_venv / "python"), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    )
    assert out.stdout.split() == ["True", "True"], out.stdout
