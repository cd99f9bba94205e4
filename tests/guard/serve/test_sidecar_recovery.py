"""The sidecar recovers by itself and refuses what it cannot run: a member that loads late is
warmed up and checked against like the others, a text detector that failed to build is built
again (and /readyz says why until it is), a policy whose detector cannot be built is refused
on reload, a policy file read while being written is refused on reload, two reloads end with
the file read last, a busy log answers labels with a 503, and
a SIGHUP while `spotstop serve` starts does not end it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import spotstop.guard._guard as guard_module
import yaml
from spotstop.guard import DecisionLog, Guard
from spotstop.guard.cues import _rapidocr
from spotstop.guard.policies import load_policy

from tests._support.guard import set_frozen
from tests._support.serve import free_port, jpeg, live_server, multipart, settings_for


def _wait(cond: Any, limit_s: float = 30.0) -> bool:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            return False
        time.sleep(0.05)
    return True


class _Counting:
    def __init__(self, real: Any) -> None:
        self._real, self.calls = real, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def score(self, *a: Any, **k: Any) -> Any:
        self.calls += 1
        return self._real.score(*a, **k)


@pytest.fixture
def late_member(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """tiny-lfm2_vl fails its first load (the GPU busy at start), then loads, counted."""
    real = guard_module.load_bundle_member
    seen: dict[str, Any] = {"loads": 0, "member": None}

    def flaky(bundle: Any, bm: Any, **kw: Any) -> Any:
        if bm.name != "tiny-lfm2_vl":
            return real(bundle, bm, **kw)
        seen["loads"] += 1
        if seen["loads"] == 1:
            raise OSError("GPU busy (first load only)")
        seen["member"] = _Counting(real(bundle, bm, **kw))
        return seen["member"]

    monkeypatch.setattr(guard_module, "load_bundle_member", flaky)
    return seen


def test_a_member_that_loads_late_is_warmed_up_and_checks_requests(
    bundle_copy: Path, tmp_path: Path, late_member: dict[str, Any]
) -> None:
    s = settings_for(bundle_copy, tmp_path, warmup=True, log_retry_s=0.1)
    g = Guard(bundle_copy, log=s.log, state_dir=s.state_dir, retry_load_s=0.1)
    with live_server(s, g) as srv, srv.client() as c:
        assert c.get("/readyz").status_code == 503
        assert _wait(lambda: c.get("/readyz").status_code == 200)
        # it turned ready only once the late member was warmed up too
        assert late_member["member"].calls >= 1
        # '<image>' is a control token of tiny-lfm2_vl only: refused, not a logged decision
        r = c.post("/v1/check", **multipart(jpeg(), request="put the <image> on the shelf"))
        assert r.status_code == 422 and r.json()["code"] == "request_refused"
    with DecisionLog(s.log) as log:
        assert log.count() == 0


def _text_policy(bundle: Path, **text: Any) -> None:
    doc = yaml.safe_load((bundle / "policy.yaml").read_text())
    doc["text_in_scene"] = {"detect": True, "reassuring": "fail_closed", **text}
    (bundle / "policy.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_text_detector_that_failed_to_build_is_built_again(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rapidocr")
    _text_policy(bundle_copy)
    real = _rapidocr.RapidOcrDetector.load
    calls = {"n": 0}

    def flaky(self: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise MemoryError("out of memory while loading the OCR models")
        return real(self)

    monkeypatch.setattr(_rapidocr.RapidOcrDetector, "load", flaky)
    s = settings_for(bundle_copy, tmp_path, warmup=False)
    g = Guard(bundle_copy, log=s.log, state_dir=s.state_dir, retry_load_s=0.1)
    assert "MemoryError" in (g.text_detector_error or "")
    with live_server(s, g) as srv, srv.client() as c:
        # until it is built: not ready, and saying why (checks fail closed meanwhile)
        r = c.get("/readyz")
        if g.text_detector_error is not None:
            assert r.status_code == 503 and any("MemoryError" in x for x in r.json()["reasons"])
        assert _wait(lambda: g.text_detector_error is None)
        assert c.get("/readyz").status_code == 200
        d = c.post("/v1/check", **multipart(jpeg(3))).json()
        assert not d["fail_closed"], d["fail_reason"]


def test_a_reload_whose_detector_cannot_be_built_is_refused(
    bundle_copy: Path, tmp_path: Path
) -> None:
    pytest.importorskip("rapidocr")
    s = settings_for(bundle_copy, tmp_path, warmup=False)
    with live_server(s) as srv, srv.client() as c:
        before = c.post("/v1/check", **multipart(jpeg())).json()["policy_version"]
        _text_policy(bundle_copy, lexicon="no-such-lexicon.yaml")
        r = c.post("/v1/policy/reload")
        assert r.status_code == 422, r.text
        assert "no-such-lexicon" in r.json()["message"] and "stays" in r.json()["message"]
        d = c.post("/v1/check", **multipart(jpeg(1))).json()
        assert d["policy_version"] == before and not d["fail_closed"]
        assert c.get("/readyz").status_code == 200


def test_a_reload_that_reads_a_policy_file_still_being_written_is_refused(
    bundle_copy: Path, tmp_path: Path
) -> None:
    s = settings_for(bundle_copy, tmp_path, warmup=False)
    with live_server(s) as srv, srv.client() as c:
        before = c.post("/v1/check", **multipart(jpeg())).json()["policy_version"]
        set_frozen(bundle_copy, 2.0)
        whole = (bundle_copy / "policy.yaml").read_bytes()
        # a writer that does not replace the file (`cp` over it) has written all but the end
        # of fitted_on: the prefix parses as YAML
        cut = whole.rindex(b"test: true") + len(b"test: tr")
        (bundle_copy / "policy.yaml").write_bytes(whole[:cut])
        r = c.post("/v1/policy/reload")
        assert r.status_code == 422, r.text
        assert "read while being written" in r.json()["message"]
        d = c.post("/v1/check", **multipart(jpeg(1))).json()
        assert d["policy_version"] == before
        # the write ends: the next reload takes the whole file
        (bundle_copy / "policy.yaml").write_bytes(whole)
        assert c.post("/v1/policy/reload").status_code == 200
        d = c.post("/v1/check", **multipart(jpeg(2))).json()
        assert d["threshold"] == 2.0 and d["policy_version"] != before


def test_two_reloads_at_once_end_with_the_file_read_last(
    bundle_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spotstop.guard import _pipeline

    real = _pipeline.Pipeline._detector_for

    def slow_for_the_older(self: Any, cfg: Any) -> Any:
        if getattr(cfg.policy, "threshold", None) == 1.0:  # its activation takes long
            time.sleep(0.6)
        return real(self, cfg)

    monkeypatch.setattr(_pipeline.Pipeline, "_detector_for", slow_for_the_older)
    s = settings_for(bundle_copy, tmp_path, warmup=False)
    with live_server(s) as srv:
        set_frozen(bundle_copy, 1.0)

        def reload() -> None:
            with srv.client() as c:
                assert c.post("/v1/policy/reload").status_code == 200

        first = threading.Thread(target=reload)
        first.start()
        time.sleep(0.2)  # the first reload has read t0 = 1 and is activating it
        set_frozen(bundle_copy, 2.0)
        second = threading.Thread(target=reload)
        second.start()
        first.join()
        second.join()
        with srv.client() as c:
            d = c.post("/v1/check", **multipart(jpeg())).json()
    assert d["policy_version"] == load_policy(bundle_copy / "policy.yaml").version_id
    assert d["threshold"] == 2.0


def test_labels_on_a_busy_log_answer_503_and_write_nothing(
    bundle_copy: Path, tmp_path: Path
) -> None:
    import sqlite3

    s = settings_for(bundle_copy, tmp_path, warmup=False)
    g = Guard(bundle_copy, log=DecisionLog(s.log, timeout_s=0.5), state_dir=s.state_dir)
    with live_server(s, g) as srv, srv.client() as c:
        did = c.post("/v1/check", **multipart(jpeg())).json()["decision_id"]
        other = sqlite3.connect(s.log, timeout=0.1)
        other.execute("BEGIN IMMEDIATE")  # another connection holds the log
        try:
            r = c.post("/v1/labels", json={"labels": [{"decision_id": did, "label": "safe"}]})
        finally:
            other.rollback()
            other.close()
        assert r.status_code == 503 and r.json()["code"] == "labels_not_written"
        assert "Retry-After" in r.headers
        r = c.post("/v1/labels", json={"labels": [{"decision_id": did, "label": "safe"}]})
        assert r.status_code == 200


def _ignores_sighup(pid: int) -> bool:
    """Whether the process ignores SIGHUP now (Linux: the SigIgn mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (int(signal.SIGHUP) - 1) & 1)
    return False


@pytest.mark.skipif(
    not hasattr(signal, "SIGHUP") or not Path("/proc/self/status").is_file(),
    reason="needs SIGHUP and /proc",
)
def test_a_sighup_while_serve_starts_does_not_end_it(bundle_copy: Path, tmp_path: Path) -> None:
    """From `spotstop`'s first line on (only the interpreter's own start comes before), a
    SIGHUP is ignored until the server's reload handler is in place."""
    import httpx

    port = free_port()
    cmd = [
        sys.executable, "-m", "spotstop.cli", "serve", "--bundle", str(bundle_copy),
        "--port", str(port), "--log", str(tmp_path / "log.sqlite"),
        "--state-dir", str(tmp_path / "state"), "--log-level", "warning", "--no-warmup",
    ]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait(lambda: p.poll() is not None or _ignores_sighup(p.pid), 60.0)
        p.send_signal(signal.SIGHUP)  # while it imports and loads the bundle, or after

        def ready() -> bool:
            if p.poll() is not None:
                return True
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        assert _wait(ready, 120.0)
        assert p.poll() is None, f"spotstop serve ended with {p.returncode}"
    finally:
        p.terminate()
        p.wait(timeout=60)
