"""Deadlines end to end: no stale SAFE, no unlogged 200, bounded memory.

Each test first provokes the failure it guards against, against the real sidecar (uvicorn
in a thread or a subprocess) or a hostile stand-in server on a raw socket:

* the client's ``timeout_s`` bounds the whole call, even against a server that trickles a
  SAFE answer in pieces (each read short, the call long);
* a log held busy past the deadline gives a 503 ``decision_not_logged`` within the deadline,
  never a 200 without a row, and the row is written once the log frees up;
* upload time is not queue time; a stalled upload has its own timeout, code and metric;
* a client that disconnects mid-upload is counted as such, never as a 5xx;
* images are decoded on the model thread after admission, so four concurrent huge frames do
  not take four frames' memory;
* images below the minimum side are refused (library, CLI, sidecar);
* one validator for situation ids; ``spotstop check --json`` prints the fail-closed decision
  when the guard cannot start;
* zero acknowledged decisions missing after SIGKILL under load.
"""

from __future__ import annotations

import hashlib
import io
import json
import select
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx
from PIL import Image
from spotstop.guard import Decision, DecisionLog, Guard, Scene
from spotstop.guard.client import GuardClient
from spotstop.guard.serve import ServeSettings, load_guard

from tests._support.serve import (
    jpeg,
    live_server,
    multipart,
    serve_process,
    settings_for,
    stand_in,
)
from tests._support.tolerance import SCHEDULING_SLACK_S


@pytest.fixture(scope="module")
def bundle(runtime_bundle: Path) -> Path:
    return runtime_bundle


def metric(text: str, name: str) -> float:
    """The value of one sample line ``name value`` of a Prometheus text page (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


# ------------------------------------------------------------- 1. the client's whole-call bound


def _safe_body() -> bytes:
    d = Decision(
        request="open the door",
        image_sha256=hashlib.sha256(jpeg()).hexdigest(),  # the scene the test sends
        label="SAFE",
        fused_score=-1.0,
        policy_score=-1.0,
        threshold=0.0,
        policy="frozen",
        member_scores={"a": -1.0, "b": -1.0},
        fail_closed=False,
        latency_ms={},
        bundle_id="b",
        prompt_hash="p",
    )
    return json.dumps(d.to_dict()).encode()


@contextmanager
def trickling_server(pieces: int, gap_s: float) -> Iterator[str]:
    """An HTTP server that answers every request 200 with a SAFE decision, its body sent in
    ``pieces`` parts ``gap_s`` apart (each read is short; the whole answer is slow)."""
    body = _safe_body()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, rest = data.split(b"\r\n\r\n", 1)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while len(rest) < length:
                rest += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            )
            step = -(-len(body) // pieces)
            for i in range(0, len(body), step):
                if stop.is_set():
                    return
                time.sleep(gap_s)
                try:
                    conn.sendall(body[i : i + step])
                except OSError:
                    return

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        srv.close()


def test_client_timeout_bounds_the_whole_call_against_a_trickling_server():
    # control: the same server without delay gives the SAFE it sends (the test can pass SAFE)
    with trickling_server(pieces=8, gap_s=0.0) as url, GuardClient(url, timeout_s=2.0) as gc:
        assert gc.check(Scene(jpeg(), "open the door")).label == "SAFE"
    # 8 pieces 0.5 s apart: every read is well within 0.8 s, the answer takes 4 s
    pieces, gap_s = 8, 0.5
    with trickling_server(pieces, gap_s) as url, GuardClient(url, timeout_s=0.8) as gc:
        t = time.monotonic()
        d = gc.check(Scene(jpeg(), "open the door"))
        took = time.monotonic() - t
        assert d.label == "UNSAFE" and d.fail_closed and d.decision_id == ""
        assert "timeout" in (d.fail_reason or "") and "0.8 s" in (d.fail_reason or "")
        # bounded by timeout_s, not by the per-read timeout: given up before the server could
        # have sent the whole answer (however late a loaded machine ends the wait)
        assert took < min(0.8 + SCHEDULING_SLACK_S, pieces * gap_s), took
        [b] = gc.check_batch([Scene(jpeg(), "open the door")])
        assert b.label == "UNSAFE" and b.fail_closed


# ------------------------------------------------------------------- 2. every 200 is logged


@contextmanager
def log_held_busy(path: Path) -> Iterator[None]:
    """Hold the log's write lock from another connection (another process would do the same)."""
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_log_busy_past_the_deadline_is_a_503_within_it_and_the_row_is_kept(
    bundle: Path, tmp_path: Path
):
    settings = settings_for(bundle, tmp_path, deadline_s=1.0, warmup=False)
    g = stand_in(load_guard(settings))
    with live_server(settings, g) as srv, srv.client(timeout=30.0) as c:
        assert c.post("/v1/check", **multipart(jpeg(1))).status_code == 200  # log works
        with log_held_busy(settings.log):  # type: ignore[arg-type]
            t = time.monotonic()
            r = c.post("/v1/check", **multipart(jpeg(2), request="open the door"))
            took = time.monotonic() - t
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "decision_not_logged" and int(r.headers["retry-after"]) >= 1
        # the wait for the log ended with the deadline, not with the log's 30 s busy timeout
        assert took < 1.0 + SCHEDULING_SLACK_S, took
        assert metric(c.get("/metrics").text, "spotstop_decisions_not_logged_total") == 1.0
        # the unacknowledged row is not lost: it is written (fail-closed) once the log frees
        t0 = time.monotonic()
        while srv.guard.pending and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert c.post("/v1/check", **multipart(jpeg(3))).status_code == 200
    with DecisionLog(settings.log) as lg:  # type: ignore[arg-type]
        rows = list(lg.records())
    assert len(rows) == 3
    [late] = [r for r in rows if r.request == "open the door"]
    assert late.label == "UNSAFE" and late.fail_closed
    assert (late.fail_reason or "").startswith("decision log")


def test_library_guard_bounds_the_log_wait_and_can_require_a_row(bundle: Path, tmp_path: Path):
    from spotstop.guard._guard import DecisionNotLogged

    log = tmp_path / "log.sqlite"
    with stand_in(Guard(bundle, log=log, state_dir=tmp_path / "state")) as g:
        g.check(Scene(jpeg(0), "x"))
        with log_held_busy(log):
            t = time.monotonic()
            d = g.check(Scene(jpeg(1), "x"), deadline_s=0.5)
            # ended with the deadline, not with the log's 30 s busy timeout
            assert time.monotonic() - t < 0.5 + SCHEDULING_SLACK_S
            assert d.label == "UNSAFE" and d.fail_closed and g.pending == 1
            with pytest.raises(DecisionNotLogged) as e:
                g.check(Scene(jpeg(2), "x"), deadline_s=0.5, require_logged=True)
            assert e.value.decisions[0].label == "UNSAFE" and g.pending == 2
        assert g.flush_pending() == 2 and g.pending == 0
    with DecisionLog(log) as lg:
        assert lg.count() == 3


# ------------------------------------------------------------- 3. upload time is not queue time


def _slow_post(
    url: str, body: bytes, headers: dict[str, str], chunks: int, gap_s: float
) -> tuple[bytes, float]:
    """POST ``body`` in ``chunks`` parts ``gap_s`` apart over a raw socket, stopping once an
    answer arrives; (the raw answer, seconds from the first byte sent to the answer)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        head = f"POST /v1/check HTTP/1.1\r\nhost: {host}\r\ncontent-length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        t = time.monotonic()
        s.sendall(head.encode())
        step = -(-len(body) // chunks)
        for i in range(0, len(body), step):
            try:
                s.sendall(body[i : i + step])
            except OSError:  # the server closed the connection
                break
            if select.select([s], [], [], gap_s)[0]:  # an answer came: stop sending
                break
        select.select([s], [], [], 30)
        took = time.monotonic() - t
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
    return out, took


def _encoded_multipart(image: bytes, request: str) -> tuple[bytes, dict[str, str]]:
    req = httpx.Request("POST", "http://x/v1/check", **multipart(image, request))
    body = req.read()
    return body, {"content-type": req.headers["content-type"]}


def test_upload_time_is_not_queue_time_and_a_stalled_upload_has_its_own_code(
    bundle: Path, tmp_path: Path
):
    settings = settings_for(bundle, tmp_path, deadline_s=1.0, upload_timeout_s=3.0, warmup=False)
    g = stand_in(load_guard(settings))
    body, headers = _encoded_multipart(jpeg(5), "open the door")
    with live_server(settings, g) as srv:
        # a 2 s upload under a 1 s deadline: judged (200), its queue wait counted from the
        # body's arrival (counted from the upload's start it would be 2 s, past the deadline)
        raw, _ = _slow_post(srv.url, body, headers, chunks=8, gap_s=0.25)
        assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
        with srv.client() as c:
            m = c.get("/metrics").text
        assert metric(m, "spotstop_stage_seconds_sum" + '{stage="queue_wait"}') < 1.0
        # a stalled upload: 408 upload_timeout after 3 s, the connection closed, long before
        # its last part would have been sent (4 parts 2 s apart: 6 s)
        raw, took = _slow_post(srv.url, body, headers, chunks=4, gap_s=2.0)
        assert raw.startswith(b"HTTP/1.1 408"), raw[:300]
        assert b'"upload_timeout"' in raw and b"connection: close" in raw.lower()
        assert 3.0 <= took < min(3.0 + SCHEDULING_SLACK_S, 3 * 2.0), took
        with srv.client() as c:
            m = c.get("/metrics").text
        assert srv.guard.log.count() == 1
    assert metric(m, 'spotstop_uploads_aborted_total{reason="upload_timeout"}') == 1.0
    assert metric(m, 'spotstop_stage_seconds_count{stage="queue_wait"}') == 1.0  # untouched
    assert 'spotstop_queue_rejected_total{reason="deadline_exceeded_in_queue"}' not in m
    assert "spotstop_queue_depth 0.0" in m  # the stalled request gave its place back


# ------------------------------------------------------------- 4. a disconnect is not a 500


def test_client_disconnect_mid_upload_is_counted_not_a_500(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, warmup=False)
    g = stand_in(load_guard(settings))
    body, headers = _encoded_multipart(jpeg(6), "open the door")
    with live_server(settings, g) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            head = f"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            s.sendall(head.encode() + body[: len(body) // 2])
            time.sleep(0.3)
        with srv.client() as c:
            t0 = time.monotonic()
            while True:
                m = c.get("/metrics").text
                if 'reason="client_disconnect"' in m or time.monotonic() - t0 > 10:
                    break
                time.sleep(0.05)
    assert metric(m, 'spotstop_uploads_aborted_total{reason="client_disconnect"}') == 1.0
    assert 'status="500"' not in m and 'status="5' not in m
    assert "spotstop_queue_depth 0.0" in m


# ------------------------------------------------------ 5. memory is bounded by the queue


def _rss_peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def _huge_png(seed: int, side: int = 6000) -> bytes:
    image = Image.new("RGB", (side, side), (seed * 40 % 256, 30, 60))
    image.paste((200, 220, 240), (0, 0, side // 2, side))  # two halves: it shows something
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_four_concurrent_huge_frames_take_one_frames_memory(bundle: Path, tmp_path: Path):
    """The README's bound: images are decoded one request at a time on the model thread, so
    the frames waiting in the queue hold only their encoded bytes. Four concurrent
    6000x6000 PNGs (about 100 KB each, 108 MB each as RGB) may add about one decoded frame
    and its working copies, not four."""
    frames = [_huge_png(i) for i in range(4)]
    frame_mib = 6000 * 6000 * 3 / 2**20
    with serve_process(bundle, tmp_path, "--deadline", "0") as (url, proc):
        with httpx.Client(base_url=url, timeout=120) as c:  # warm: one small check first
            assert c.post("/v1/check", **multipart(jpeg())).status_code == 200
        before = _rss_peak_kib(proc.pid)

        def one(img: bytes) -> int:
            with httpx.Client(base_url=url, timeout=300) as c:
                return c.post("/v1/check", **multipart(img)).status_code

        with ThreadPoolExecutor(4) as ex:
            codes = list(ex.map(one, frames))
        grew_mib = (_rss_peak_kib(proc.pid) - before) / 1024
    assert codes == [200] * 4
    # one frame decoded at a time: its RGB buffer, Pillow's working copy and the members'
    # preprocessing (the README states ≤ 3 frames' worth per image of a batch)
    assert grew_mib < 3 * frame_mib, f"peak RSS grew by {grew_mib:.0f} MiB"


# --------------------------------------------------------------- 6. images too small to see


def test_a_1x1_image_is_refused_in_the_library_the_cli_and_the_sidecar(
    bundle: Path, tmp_path: Path
):
    from spotstop.cli import main

    tiny = jpeg(0, size=(1, 1))
    # (random noise 40x32 has no content at the scale of min_image_contrast: the side alone)
    lib = Guard(bundle, log=tmp_path / "lib.sqlite", state_dir=tmp_path / "s", min_image_contrast=0)
    with stand_in(lib) as g:
        d = g.check(Scene(tiny, "open the door"))
        assert d.label == "UNSAFE" and d.fail_closed and "32 px" in (d.fail_reason or "")
        ok = g.check(Scene(jpeg(0, size=(40, 32)), "open the door"))
        assert "too_small" not in (ok.fail_reason or "") and "32 px" not in (ok.fail_reason or "")
    img = tmp_path / "one.jpg"
    img.write_bytes(tiny)
    args = ["check", str(img), "--request", "x", "--bundle", str(bundle), "--json"]
    args += ["--log", str(tmp_path / "cli.sqlite")]
    assert main(args) == 1
    settings = settings_for(bundle, tmp_path, warmup=False)
    with live_server(settings, stand_in(load_guard(settings))) as srv, srv.client() as c:
        r = c.post("/v1/check", **multipart(tiny))
        assert r.status_code == 422 and r.json()["code"] == "image_too_small"
        assert r.json()["field"] == "image" and "32 px" in r.json()["message"]
        r = c.post("/v1/check", **multipart(jpeg(0, size=(48, 32))))
        assert r.status_code == 200
        assert srv.guard.log.count() == 1  # the refused image made no decision
    with pytest.raises(Exception, match="min_image_side"):
        ServeSettings(bundle=bundle, min_image_side=0)
    with pytest.raises(Exception, match="upload_timeout_s must be a positive number of seconds"):
        ServeSettings(bundle=bundle, upload_timeout_s=0)


def test_cli_check_prints_the_fail_closed_decision_when_the_log_cannot_be_opened(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    from spotstop.cli import main

    img = tmp_path / "cam.jpg"
    img.write_bytes(jpeg(1))
    not_a_log = tmp_path / "log.sqlite"
    not_a_log.write_bytes(b"this is not a SQLite database" * 100)
    args = ["check", str(img), "--request", "open the door", "--bundle", str(bundle)]
    assert main([*args, "--json", "--log", str(not_a_log)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "UNSAFE" and out["fail_closed"] is True and out["decision_id"] == ""
    assert out["fail_reason"].startswith("guard could not start") and out["policy"] == "cli"
    assert "not a SQLite database" in out["fail_reason"] or "database" in out["fail_reason"]


def test_a_bad_deadline_flag_is_a_usage_error_and_0_is_none(
    bundle: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
):
    """``check --deadline -1`` was a logged-nowhere fail-closed UNSAFE (exit 1, "guard could
    not start"); ``serve --deadline -5`` was no deadline at all, and ``serve --deadline 0``
    ("0 = none") the default 10 s. Both commands read the flag by the guard's one rule."""
    from spotstop.cli import main
    from spotstop.guard import serve as serve_pkg

    img = tmp_path / "cam.jpg"
    img.write_bytes(jpeg(1))
    args = ["check", str(img), "--request", "open the door", "--bundle", str(bundle)]
    args += ["--log", str(tmp_path / "cli.sqlite")]
    for bad in ("-1", "nan", "inf", "3601"):
        assert main([*args, "--deadline", bad]) == 2
        assert "--deadline must be a number of seconds in (0, 3600]" in capsys.readouterr().err
    assert not (tmp_path / "cli.sqlite").exists()  # refused before anything was opened
    assert main([*args, "--deadline", "0", "--json"]) in (0, 1)
    assert not json.loads(capsys.readouterr().out)["fail_closed"]
    seen: dict[str, Any] = {}
    monkeypatch.setattr(serve_pkg, "serve", lambda settings, **kw: seen.update(s=settings) or 0)
    serve = ["serve", "--bundle", str(bundle), "--log", str(tmp_path / "s.sqlite"), "--no-warmup"]
    assert main([*serve, "--deadline", "-5"]) == 2
    assert "--deadline must be" in capsys.readouterr().err and not seen
    for flag, want in (("0", None), ("2.5", 2.5)):
        assert main([*serve, "--deadline", flag]) == 0
        assert seen.pop("s").deadline_s == want


def test_situation_ids_have_one_validator(bundle: Path, tmp_path: Path):
    settings = settings_for(bundle, tmp_path, warmup=False, max_situation_chars=8)
    with live_server(settings, stand_in(load_guard(settings))) as srv, srv.client() as c:
        for sid, path, code in (
            ("a\x01b", "a%01b", "invalid_value"),
            ("x" * 9, "x" * 9, "text_too_long"),
        ):
            checked = c.post("/v1/check", **multipart(jpeg(), situation_id=sid))
            looked = c.get(f"/v1/situations/{path}")
            assert checked.status_code == looked.status_code == 422, (sid, looked.text)
            assert checked.json()["code"] == looked.json()["code"] == code
        assert c.get("/v1/situations/hall-2").status_code == 200


# ------------------------------------------------------------- 7. SIGKILL under load


@pytest.mark.slow
def test_no_acknowledged_decision_is_lost_to_sigkill_under_load(bundle: Path, tmp_path: Path):
    acknowledged: list[str] = []
    lock = threading.Lock()
    for round_ in range(2):
        with serve_process(bundle, tmp_path, "--queue-size", "64") as (url, proc):
            stop = threading.Event()

            def client(i: int, url: str = url, stop: threading.Event = stop) -> None:
                with httpx.Client(base_url=url, timeout=30) as c:
                    while not stop.is_set():
                        try:
                            r = c.post("/v1/check", **multipart(jpeg(i % 8)))
                        except httpx.HTTPError:
                            return  # the server is gone
                        if r.status_code == 200:
                            with lock:
                                acknowledged.append(r.json()["decision_id"])

            threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            t0 = time.monotonic()
            while len(acknowledged) < 10 * (round_ + 1) and time.monotonic() - t0 < 120:
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            stop.set()
            for t in threads:
                t.join(30)
    assert len(acknowledged) >= 20
    with DecisionLog(tmp_path / "log.sqlite") as lg:
        logged = {r.decision_id for r in lg.records()}  # (a generator)
    missing = [d for d in acknowledged if d not in logged]
    assert missing == [], f"{len(missing)} acknowledged decisions missing from the log"


def test_the_schema_pattern_states_the_situation_id_validator():
    """The OpenAPI pattern and :func:`check_situation_id` accept the same ids."""
    import random
    import re

    from spotstop.guard.serve._errors import InputError
    from spotstop.guard.serve._parse import SITUATION_ID_PATTERN, check_situation_id

    rng = random.Random(14)
    alphabet = "ab -_\t\n\x00\x01\x1f\x7f\x85\x98\x9f\xa0\u2003é漢\u200b"
    cases = ["hall-2", " ", "\x98", "a\x01b", "\u2003", "a b", "é"]
    cases += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(3000)]
    for sid in cases:
        try:
            check_situation_id(sid, "situation_id", 100)
            ok = True
        except InputError:
            ok = False
        assert ok == bool(re.fullmatch(SITUATION_ID_PATTERN, sid)), repr(sid)


# ------------------------------------------------- the caller's budget is the sidecar's deadline


def test_the_sidecar_never_logs_a_safe_its_caller_has_already_taken_as_unsafe(
    bundle: Path, tmp_path: Path
):
    """The client gives up at its ``timeout_s`` (1 s) and answers UNSAFE; the sidecar's own
    deadline (10 s) would let the call finish (3 s) and log SAFE. With the budget header the
    sidecar's deadline is the caller's: the row is a fail-closed UNSAFE, as the caller answered."""
    import shutil

    from spotstop.guard._types import BUDGET_HEADER

    from tests._support.guard import set_frozen

    mine = tmp_path / "bundle"
    shutil.copytree(bundle, mine, ignore=shutil.ignore_patterns("situations.json", "*.sqlite*"))
    set_frozen(mine, 1e9)  # every scored scene is SAFE
    settings = settings_for(mine, tmp_path, deadline_s=10.0, warmup=False)
    g = stand_in(load_guard(settings), delay_s=1.5)  # each member 1.5 s: 3 s a call
    with live_server(settings, g) as srv:
        with GuardClient(srv.url, timeout_s=1.0) as gc:
            d = gc.check(Scene(jpeg(1), "open the door"))
        assert d.label == "UNSAFE" and "timeout" in (d.fail_reason or ""), d
        t0 = time.monotonic()
        while srv.guard.log.count() < 1 and time.monotonic() - t0 < 15:
            time.sleep(0.05)
        [row] = list(srv.guard.log.records())
        assert row.label == "UNSAFE" and row.fail_closed, row
        assert "deadline" in (row.fail_reason or ""), row.fail_reason
        # the same sidecar, asked with a budget long enough, answers (and logs) SAFE
        with GuardClient(srv.url, timeout_s=8.0) as gc:
            ok = gc.check(Scene(jpeg(2), "open the door"))
        assert ok.label == "SAFE" and srv.guard.log.get(ok.decision_id) is not None
        # a budget that is not a positive number of seconds is refused, naming the header
        with srv.client() as c:
            for bad in ("abc", "0", "-1", "nan", "inf", "1e300", "3601"):  # past MAX_DEADLINE_S
                r = c.post("/v1/check", **multipart(jpeg(3)), headers={BUDGET_HEADER: bad})
                assert r.status_code == 422, (bad, r.text)
                assert r.json()["field"] == BUDGET_HEADER, r.text


def test_the_budget_headers_are_in_the_openapi_schema():
    from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER
    from spotstop.guard.serve import create_app

    app = create_app(ServeSettings(bundle=Path("unused")))
    schema = app.openapi()
    for path in ("/v1/check", "/v1/check/batch"):
        names = [p["name"] for p in schema["paths"][path]["post"].get("parameters", [])]
        assert {BUDGET_HEADER, DUE_HEADER} <= set(names), (path, names)


def test_the_callers_due_time_counts_what_came_before_the_request(bundle: Path, tmp_path: Path):
    """The budget header counts from the request's arrival: a request held 1 s on its way (a
    connect retried, a full accept queue) by a caller that waits 0.9 s was judged and logged
    SAFE after its caller had answered UNSAFE. The due time (Unix) counts that second."""
    import shutil

    from spotstop.guard._types import BUDGET_HEADER, DUE_HEADER

    from tests._support.guard import set_frozen

    mine = tmp_path / "bundle"
    shutil.copytree(bundle, mine, ignore=shutil.ignore_patterns("situations.json", "*.sqlite*"))
    set_frozen(mine, 1e9)  # every scored scene is SAFE
    settings = settings_for(mine, tmp_path, deadline_s=10.0, warmup=False)
    with live_server(settings) as srv, srv.client() as c:
        # what the caller sent 1 s ago with 0.9 s to wait: the budget alone looks fresh
        late = {BUDGET_HEADER: "0.900", DUE_HEADER: f"{time.time() - 0.1:.3f}"}
        r = c.post("/v1/check", **multipart(jpeg(1)), headers=late)
        assert r.status_code == 503 and "caller's budget" in r.json()["message"], r.text
        assert srv.guard.log.count() == 0  # nothing judged, nothing logged
        ok = {BUDGET_HEADER: "5", DUE_HEADER: f"{time.time() + 5:.3f}"}
        r = c.post("/v1/check", **multipart(jpeg(2)), headers=ok)
        assert r.status_code == 200 and r.json()["label"] == "SAFE", r.text
        for bad in ("abc", "0", "-1", "nan", "inf"):
            r = c.post("/v1/check", **multipart(jpeg(3)), headers={DUE_HEADER: bad})
            assert r.status_code == 422 and r.json()["field"] == DUE_HEADER, (bad, r.text)
    # the client sends both, from one clock reading: due = now + what is left of its budget
    seen: list[httpx.Headers] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(500, text="no")

    t = time.time()
    with GuardClient("http://sidecar", timeout_s=2.0, transport=httpx.MockTransport(capture)) as gc:
        gc.check(Scene(jpeg(4), "open the door"))
    budget, due = float(seen[0][BUDGET_HEADER]), float(seen[0][DUE_HEADER])
    assert 0 < budget <= 2.0 and t < due <= time.time() + 2.0
    assert abs((due - budget) - t) < 1.0  # one reading (generous for a slow machine)


def test_the_callers_budget_bounds_the_wait_in_the_queue(bundle: Path, tmp_path: Path):
    """A (no budget) holds the model thread for ~3 s; B, queued behind it with a 0.5 s
    budget, is answered 503 (nothing judged, nothing logged) when its budget runs out, not
    when the worker reaches it."""
    import shutil

    from spotstop.guard._types import BUDGET_HEADER

    from tests._support.guard import set_frozen

    mine = tmp_path / "bundle"
    shutil.copytree(bundle, mine, ignore=shutil.ignore_patterns("situations.json", "*.sqlite*"))
    set_frozen(mine, 1e9)
    settings = settings_for(mine, tmp_path, deadline_s=10.0, warmup=False)
    g = stand_in(load_guard(settings), delay_s=1.5)  # each member 1.5 s: 3 s a call

    def post(srv, i: int, headers: dict[str, str], delay: float) -> tuple[float, httpx.Response]:
        time.sleep(delay)
        t0 = time.monotonic()
        with srv.client() as c:
            r = c.post("/v1/check", **multipart(jpeg(i)), headers=headers)
        return time.monotonic() - t0, r

    with live_server(settings, g) as srv, ThreadPoolExecutor(2) as ex:
        fa = ex.submit(post, srv, 1, {}, 0.0)
        fb = ex.submit(post, srv, 2, {BUDGET_HEADER: "0.5"}, 0.3)
        (ta, a), (tb, b) = fa.result(), fb.result()
        assert a.status_code == 200 and a.json()["label"] == "SAFE"
        assert b.status_code == 503 and b.json()["code"] == "deadline_exceeded_in_queue", b.text
        assert "still queued" in b.json()["message"]
        assert tb < ta  # answered at its budget, before A's call (3 s) ended
        assert srv.guard.log.count() == 1  # B was never judged


def test_a_due_time_beyond_the_longest_deadline_is_bounded_by_it(bundle: Path, tmp_path: Path):
    """With no server deadline (--deadline 0), a due time more than an hour ahead was handed to
    the guard as its deadline, which refuses anything over MAX_DEADLINE_S: a 500 for a valid
    header. The guard's longest deadline bounds the call instead; its answer is a decision."""
    from spotstop.guard._types import DUE_HEADER

    settings = settings_for(bundle, tmp_path, deadline_s=None, warmup=False)
    with live_server(settings) as srv, srv.client() as c:
        for ahead in (7200.0, 1e9):
            h = {DUE_HEADER: f"{time.time() + ahead:.3f}"}
            r = c.post("/v1/check", **multipart(jpeg(1)), headers=h)
            assert r.status_code == 200 and r.json()["label"] in ("SAFE", "UNSAFE"), r.text
        assert srv.guard.log.count() == 2


def test_a_body_refused_by_its_length_is_counted_as_a_chunked_one_is(bundle: Path, tmp_path: Path):
    """A 413 sent from the Content-Length header (before any byte is read) went uncounted in
    spotstop_input_refused_total; the same body sent chunked was counted."""
    import re

    settings = settings_for(bundle, tmp_path, warmup=False, max_body_bytes=1024)
    with live_server(settings) as srv, srv.client() as c:

        def refused() -> float:
            text = c.get("/metrics").text
            m = re.search(r'^spotstop_input_refused_total\{code="body_too_large"\} (\S+)$', text,
                          re.MULTILINE)  # fmt: skip
            return 0.0 if m is None else float(m.group(1))

        before = refused()
        r = c.post("/v1/check", **multipart(jpeg(1)))  # its Content-Length is over the limit
        assert r.status_code == 413
        assert refused() == before + 1
        assert srv.guard.log.count() == 0
