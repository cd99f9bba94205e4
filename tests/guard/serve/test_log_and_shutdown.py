"""The sidecar when its decision log cannot be written, and when it is told to stop.

* A fault injected into SQLite (every connection of the log made read-only): 503s, /readyz
  not ready with the reason, /healthz alive, the ``spotstop_log_*`` metrics; once the fault
  passes the sidecar answers logged 200s again within seconds, with no request needed.
* A real full file system (a 1 MiB tmpfs; only where the tests run as root, as CI does):
  the same, and a shutdown while full that leaves the refused decisions in the journal,
  which the next start imports.
* SIGTERM under load: every acknowledged decision is in the log.

The tiny TEST pair scores the scenes (its decisions mean nothing).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from spotstop.guard import DecisionLog  # noqa: E402
from spotstop.guard._journal import Journal  # noqa: E402

from tests._support import REPO_ROOT  # noqa: E402
from tests._support.serve import jpeg, live_server, multipart, settings_for  # noqa: E402


@pytest.fixture(scope="module")
def bundle(runtime_bundle: Path) -> Path:
    return runtime_bundle


def _set_query_only(log: DecisionLog, on: bool) -> None:
    """SQLITE_READONLY on every connection of the log (the model thread's included)."""
    for _, conn in list(log._connections):
        conn.execute(f"PRAGMA query_only = {int(on)}")


def _wait_for(what: str, cond: Callable[[], bool], timeout_s: float = 30.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


def test_injected_fault_503_not_ready_then_logged_200s_again_by_itself(
    bundle: Path, tmp_path: Path
) -> None:
    settings = settings_for(bundle, tmp_path, log_retry_s=0.2, journal=tmp_path / "j" / "journal")
    with live_server(settings) as live, live.client() as c:
        acked = [c.post("/v1/check", **multipart(jpeg(i))).json()["decision_id"] for i in range(3)]
        _set_query_only(live.guard.log, True)
        refused = [c.post("/v1/check", **multipart(jpeg(10 + i))) for i in range(4)]
        for r in refused:
            assert r.status_code == 503 and r.json()["code"] == "decision_not_logged"
            assert "read_only" in r.json()["message"]
        ready = c.get("/readyz")
        assert ready.status_code == 503 and not ready.json()["ready"]
        assert any("decision log (read_only)" in x for x in ready.json()["reasons"])
        assert c.get("/healthz").status_code == 200
        m = c.get("/metrics").text
        assert _metric(m, "spotstop_log_writable") == 0
        assert _metric(m, 'spotstop_log_fault{kind="read_only"}') == 1
        assert _metric(m, 'spotstop_log_write_failures_total{kind="read_only"}') >= 4
        assert (
            _metric(m, "spotstop_log_rows_pending") + _metric(m, "spotstop_log_rows_journal") == 4
        )
        _set_query_only(live.guard.log, False)  # the fault passes; nobody restarts anything
        _wait_for("/readyz 200", lambda: c.get("/readyz").status_code == 200, 10.0)
        m = c.get("/metrics").text
        assert _metric(m, "spotstop_log_writable") == 1
        assert _metric(m, "spotstop_log_rows_pending") == 0
        assert _metric(m, "spotstop_log_rows_set_aside_total") == 0  # a log fault sets none aside
        later = c.post("/v1/check", **multipart(jpeg(20)))
        assert later.status_code == 200
        acked.append(later.json()["decision_id"])
        with DecisionLog(settings.log) as lg:  # type: ignore[arg-type]
            rows = list(lg.records())
    ids = {r.decision_id for r in rows}
    assert set(acked) <= ids and len(rows) == 3 + 4 + 1  # the refusals are logged too
    assert sum(r.fail_closed for r in rows) == 4


# -- a real full file system ------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a small file system needs root (CI runs as root); the fault test above runs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Take every free byte of ``folder``'s file system; returns the filler file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _serve(bundle: Path, log: Path, *extra: str) -> Iterator[tuple[httpx.Client, Any]]:
    port = _free_port()
    cmd = [sys.executable, "-m", "spotstop.cli", "serve", "--bundle", str(bundle), "--port"]
    cmd += [str(port), "--log", str(log), "--log-level", "warning", "--no-warmup", *extra]
    err = log.parent.parent / f"serve-{port}.err"  # beside the (maybe small) log's folder
    stderr = open(err, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def up() -> bool:
        assert proc.poll() is None, err.read_text(errors="replace")[-3000:]
        try:
            client.get("/healthz")
            return True
        except httpx.HTTPError:
            return False

    try:
        _wait_for("the sidecar to start", up, 120.0)
        yield client, proc
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()


def _check(c: httpx.Client, i: int) -> httpx.Response:
    return c.post("/v1/check", **multipart(jpeg(i), request="x" * 1500, situation_id=f"s{i % 3}"))


def test_readyz_says_a_removed_log_folder_before_any_check_then_recovers_by_itself(
    bundle: Path, tmp_path: Path
) -> None:
    """The log's folder removed while the sidecar runs: the next decision cannot be logged, and
    /readyz says so at once (it was 200 until a check failed); the folder back, it is 200
    again with no request, and the next decision goes into the log there."""
    from spotstop.guard.serve import ServeSettings

    logs = tmp_path / "logs"
    logs.mkdir()
    settings = ServeSettings(
        bundle=bundle,
        log=logs / "decisions.sqlite",
        state_dir=tmp_path / "state",
        journal=tmp_path / "j" / "journal",
        log_retry_s=0.2,
    )
    with live_server(settings) as live, live.client() as c:
        _wait_for("/readyz 200", lambda: c.get("/readyz").status_code == 200, 60.0)
        assert c.post("/v1/check", **multipart(jpeg(0))).status_code == 200
        shutil.rmtree(logs)
        ready = c.get("/readyz")  # no check in between
        assert ready.status_code == 503 and not ready.json()["ready"]
        assert any(
            "decision log (io_error)" in x and "decisions.sqlite" in x
            for x in ready.json()["reasons"]
        ), ready.json()
        assert _metric(c.get("/metrics").text, "spotstop_log_writable") == 0
        logs.mkdir()  # the folder is back: the sidecar's probe opens a log there
        _wait_for("/readyz 200", lambda: c.get("/readyz").status_code == 200, 10.0)
        later = c.post("/v1/check", **multipart(jpeg(1)))
        assert later.status_code == 200
        with DecisionLog(settings.log, read_only=True) as lg:  # type: ignore[arg-type]
            assert [r.decision_id for r in lg.records()] == [later.json()["decision_id"]]
    assert live.guard.log_status().writable


def test_full_disk_recovers_without_restart_and_shutdown_while_full_loses_nothing(
    bundle: Path, tmp_path: Path
) -> None:
    with _tmpfs(tmp_path / "small", "1m") as small:
        log = small / "decisions.sqlite"
        journal = tmp_path / "journal" / "decisions.journal"  # a second place
        args = ("--state-dir", str(small / "state"), "--journal", str(journal))
        args += ("--log-min-free-bytes", "64K")
        with _serve(bundle, log, *args) as (c, proc):
            acked = [_check(c, i).json()["decision_id"] for i in range(10)]
            filler = _fill(small)
            full = [_check(c, i).status_code for i in range(10, 30)]
            assert full == [503] * 20  # nothing acknowledged without its row
            reasons = c.get("/readyz").json()["reasons"]
            assert any("disk_full" in r and str(log) in r for r in reasons), reasons
            filler.unlink()  # the space comes back
            took = _wait_for("/readyz 200", lambda: c.get("/readyz").status_code == 200, 15.0)
            again = [_check(c, i) for i in range(30, 40)]
            assert [r.status_code for r in again] == [200] * 10, (took, again[0].text)
            acked += [r.json()["decision_id"] for r in again]
            filler = _fill(small)
            assert [_check(c, i).status_code for i in range(40, 50)] == [503] * 10
            proc.send_signal(signal.SIGTERM)  # stopped while the disk is full
            assert proc.wait(60) in (0, -signal.SIGTERM)
        waiting = Journal(journal).read().n_rows
        assert waiting > 0  # the refusals went to the journal, not nowhere
        filler.unlink()
        with _serve(bundle, log, *args) as (c, _):  # the next start imports the journal
            _wait_for("/readyz 200", lambda: c.get("/readyz").status_code == 200, 30.0)
            m = c.get("/metrics").text
            assert _metric(m, "spotstop_log_rows_journal") == 0
        with DecisionLog(log) as lg:
            rows = list(lg.records())
    ids = {r.decision_id for r in rows}
    assert set(acked) <= ids
    assert len(rows) == 50  # every decision made: acknowledged, refused while full, or at exit
    assert Journal(journal).read().n_rows == 0


# -- SIGTERM under load ---------------------------------------------------------------------


def test_sigterm_under_load_every_acknowledged_decision_is_logged(
    bundle: Path, tmp_path: Path
) -> None:
    log = tmp_path / "decisions.sqlite"
    acked: list[str] = []
    answered: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    with _serve(bundle, log, "--state-dir", str(tmp_path / "state")) as (c, proc):
        url = str(c.base_url)

        def hammer(k: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as cl:
                i = 0
                while not stop.is_set():
                    try:
                        r = cl.post("/v1/check", **multipart(jpeg(1000 * k + i)))
                    except httpx.HTTPError:
                        return  # the server is gone: nothing more is acknowledged
                    i += 1
                    with lock:
                        answered.append(r.status_code)
                        if r.status_code == 200:
                            acked.append(r.json()["decision_id"])

        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        _wait_for("some decisions", lambda: len(acked) >= 8, 60.0)
        proc.send_signal(signal.SIGTERM)  # requests are in flight now
        assert proc.wait(60) in (0, -signal.SIGTERM)
        stop.set()
        for t in threads:
            t.join(30)
    with DecisionLog(log) as lg:
        ids = {r.decision_id for r in lg.records()}
    missing = set(acked) - ids
    assert not missing, f"{len(missing)} acknowledged decision(s) missing from the log"
    assert len(acked) >= 8 and set(answered) <= {200, 503}


# -- the serve config file ------------------------------------------------------------------


def test_serve_config_file_keys_units_and_paths(tmp_path: Path) -> None:
    from spotstop.guard.serve import ServeSettings, SettingsError
    from spotstop.guard.serve._settings import load_serve_config

    cfg = tmp_path / "robot" / "serve.yaml"
    cfg.parent.mkdir()
    cfg.write_text(
        "bundle: bundles/b1\nlog: /var/lib/spotstop/decisions.sqlite\njournal: journal/j\n"
        "log_max_bytes: 2G\nlog_keep_days: 30\nlog_min_free_bytes: 64M\nqueue_size: 64\n"
        "token_env: MY_TOKEN\n"
    )
    got = load_serve_config(cfg)
    assert got["bundle"] == cfg.parent / "bundles" / "b1"  # relative to the file
    assert got["log"] == Path("/var/lib/spotstop/decisions.sqlite")
    assert got["journal"] == cfg.parent / "journal" / "j"
    assert got["log_max_bytes"] == 2 << 30 and got["log_min_free_bytes"] == 64 << 20
    assert got["token_env"] == "MY_TOKEN"
    token_env = got.pop("token_env")
    s = ServeSettings(**got)
    assert token_env == "MY_TOKEN" and s.log_options.max_bytes == 2 << 30
    assert s.log_options.keep_days == 30 and s.log_options.journal == got["journal"]
    for text, match in [
        ("log_max_byte: 1G\n", r"'log_max_byte' is not a known key.*Did you mean 'log_max_bytes'"),
        ("token: abcdefabcdefabcdef\n", r"'token' is not a known key \(name token_file"),
        ("log_max_bytes: lots\n", r"log_max_bytes must be a number of bytes"),
        ("- a\n- b\n", r"must be a YAML mapping"),
        ("journal: 5\n", r"journal must be a path"),
    ]:
        cfg.write_text(text)
        with pytest.raises(SettingsError, match=match):
            load_serve_config(cfg)
    with pytest.raises(SettingsError, match=r"log_keep_days must be a positive number of days"):
        ServeSettings(bundle=tmp_path, log_keep_days=-1)
    with pytest.raises(SettingsError, match=r"log_retry_s must be a positive number"):
        ServeSettings(bundle=tmp_path, log_retry_s=0)
    with pytest.raises(SettingsError, match=r"max_situation_chars must be at most 4096"):
        ServeSettings(bundle=tmp_path, max_situation_chars=4097)


def test_serve_config_values_of_the_wrong_type_are_refused_by_name(tmp_path: Path) -> None:
    """A quoted 'false' (a string: truthy) turned warm-up on; `device: 0` loaded no member
    ("'int' object has no attribute 'lower'"); `token_env: 5` stopped serve with a TypeError."""
    from spotstop.guard.serve import ServeSettings, SettingsError
    from spotstop.guard.serve._settings import load_serve_config

    cfg = tmp_path / "serve.yaml"
    for text, match in [
        ("warmup: 'false'\n", r"warmup must be true or false; got 'false'"),
        ("sighup: 0\n", r"sighup must be true or false; got 0"),
        ("sighup: no\n", r"sighup must be true or false; got 'no'"),  # YAML 1.2: text
        ("warmup: off\n", r"warmup must be true or false; got 'off'"),
        ("device: 0\n", r"device must be a device name such as 'cpu'.*got 0"),
    ]:
        cfg.write_text(f"bundle: b\n{text}")
        with pytest.raises(SettingsError, match=match):
            ServeSettings(**load_serve_config(cfg))
    cfg.write_text("bundle: b\ntoken_env: 5\n")
    with pytest.raises(SettingsError, match=r"token_env must name an environment variable"):
        load_serve_config(cfg)
    cfg.write_text(
        "bundle: b\nwarmup: false\nsighup: False\ndevice: cuda:0\n"
    )  # as YAML reads them
    s = ServeSettings(**load_serve_config(cfg))
    assert (s.warmup, s.sighup, s.device) == (False, False, "cuda:0")


def test_cli_serve_reads_its_config_and_a_flag_wins(bundle: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        f"bundle: {bundle}\nstate_dir: state\nlog_max_bytes: 100M\nport: 1\n"
        f"journal: {tmp_path / 'journal'}\n"
    )
    port = _free_port()
    log = tmp_path / "decisions.sqlite"
    cmd = [sys.executable, "-m", "spotstop.cli", "serve", "--config", str(cfg), "--port"]
    cmd += [str(port), "--log", str(log), "--no-warmup", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:

            def up() -> bool:
                assert proc.poll() is None, "the server exited"
                try:
                    return c.get("/readyz").status_code == 200
                except httpx.HTTPError:
                    return False

            _wait_for("the sidecar from its config", up, 120.0)  # port 1 was overridden
            assert c.post("/v1/check", **multipart(jpeg(1))).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert (tmp_path / "state").is_dir() and log.is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "spotstop.cli", "serve", "--config", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "cannot be read" in bad.stderr


def test_the_jetson_unit_and_container_serve_lines_parse() -> None:
    import json as _json
    import shlex

    from spotstop.cli._root import build_parser

    root = REPO_ROOT / "jetson"
    unit = (root / "spotstop-sidecar.service").read_text().replace("\\\n", " ")
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    serve = shlex.split(start.split("spotstop-jetson", 1)[1])
    docker = (root / "Dockerfile").read_text().replace("\\\n", " ")
    cmd = next(line for line in docker.splitlines() if line.startswith("CMD "))
    for argv in (serve, _json.loads(cmd[4:])):
        args = build_parser("serve").parse_args(argv)
        assert args.journal == Path("/var/lib/spotstop-journal/decisions.journal")
        assert args.log == Path("/var/lib/spotstop/decisions.sqlite")
    assert build_parser("serve").parse_args(serve).log_max_bytes == 2 << 30


def test_every_metric_the_table_documents_is_exposed_and_the_journal_fault_shows(
    bundle: Path, tmp_path: Path
) -> None:
    """The metrics table (guard/serve/_metrics.py) listed spotstop_log_amendments_pending and
    spotstop_log_journal_fault, which /metrics never exposed: a journal that could take no
    waiting decision (they then live in memory only) raised no alert."""
    from spotstop.guard.serve import _metrics

    documented = set(re.findall(r"^``(spotstop_\w+)``", _metrics.__doc__ or "", re.MULTILINE))
    assert {"spotstop_log_journal_fault", "spotstop_log_amendments_pending"} <= documented
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    settings = settings_for(bundle, tmp_path, log_retry_s=0.2, journal=blocker / "journal")
    with live_server(settings) as live, live.client() as c:
        c.post("/v1/check", **multipart(jpeg(0)))
        text = c.get("/metrics").text
        exposed = set(re.findall(r"^# TYPE (spotstop_\w+) ", text, re.MULTILINE))
        assert documented <= exposed, sorted(documented - exposed)
        assert _metric(text, "spotstop_log_journal_fault") == 0  # nothing asked it yet
        assert _metric(text, "spotstop_log_amendments_pending") == 0
        _set_query_only(live.guard.log, True)  # the log refuses: decisions go to the journal
        assert c.post("/v1/check", **multipart(jpeg(1))).status_code == 503
        _wait_for(
            "the journal fault on /metrics",
            lambda: _metric(c.get("/metrics").text, "spotstop_log_journal_fault") == 1,
            10.0,
        )
        _set_query_only(live.guard.log, False)
