"""GuardClient against what a real socket can bring: a proxy set in the environment, a stale
answer left on a kept-alive connection, a compressed or oversize reply, an image path that
blocks on read, a client already closed. The fake servers speak raw HTTP/1.1 on loopback."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")

from spotstop.guard import Decision, Scene
from spotstop.guard.client import GuardClient

IMAGE = b"\xff\xd8 not decoded by the fake server"
REQUEST = "open the door"

#: (request head, request body) -> the bytes to send back; the fake answers each
#: request on a connection in turn (keep-alive) until the client closes it
Answer = Callable[[bytes, bytes], bytes]


def decision(label: str = "SAFE", decision_id: str = "a" * 32) -> dict[str, Any]:
    """A reply row for (IMAGE, REQUEST) that the client trusts when its label is SAFE."""
    score = -1.0 if label == "SAFE" else 1.0
    return Decision(
        request=REQUEST,
        image_sha256=hashlib.sha256(IMAGE).hexdigest(),
        member_scores={"a": score},
        fused_score=score,
        policy_score=score,
        threshold=0.0,
        policy="frozen",
        label=label,  # type: ignore[arg-type]
        fail_closed=False,
        latency_ms={},
        bundle_id="b",
        prompt_hash="p",
        decision_id=decision_id,
    ).to_json()


def reply(body: bytes, *headers: bytes) -> bytes:
    head = [b"HTTP/1.1 200 OK", b"Content-Type: application/json", *headers]
    head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
    while m and len(body) < int(m.group(1)):
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


@contextmanager
def fake_server(answer: Answer) -> Iterator[tuple[str, list[bytes]]]:
    """A loopback HTTP/1.1 server; yields its URL and the request heads it received."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    heads: list[bytes] = []

    def one(conn: socket.socket) -> None:
        with conn:
            try:
                while (got := _read_request(conn)) is not None:
                    heads.append(got[0])
                    conn.sendall(answer(*got))
            except OSError:  # the client closed the connection: this one is done
                pass

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:  # the listening socket was closed: the test is over
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", heads
    finally:
        srv.close()


def test_a_proxy_in_the_environment_never_answers_for_the_sidecar(
    monkeypatch: pytest.MonkeyPatch,
):
    """The sidecar is local: ``HTTP_PROXY`` (set on a robot for its uplink) must not carry the
    check, its token and its image to a proxy, nor let the proxy answer SAFE."""
    safe = reply(json.dumps(decision()).encode())
    with fake_server(lambda head, body: safe) as (proxy, seen):
        # control: the fake's SAFE is trusted when it is the sidecar itself
        with GuardClient(proxy, timeout_s=5.0) as gc:
            assert gc.check(Scene(IMAGE, REQUEST)).label == "SAFE"
        seen.clear()
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(var, proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with socket.socket() as s:  # a port nobody listens on: the sidecar is down
            s.bind(("127.0.0.1", 0))
            down = f"http://127.0.0.1:{s.getsockname()[1]}"
        with GuardClient(down, timeout_s=5.0, token="s3cret") as gc:
            d = gc.check(Scene(IMAGE, REQUEST))
        assert d.label == "UNSAFE" and d.fail_closed and "unreachable" in (d.fail_reason or "")
        assert seen == [], seen  # nothing (no token, no image) went to the proxy


def test_a_stale_answer_left_on_a_kept_alive_connection_is_not_the_next_calls():
    """A server that sends its answer twice leaves a copy on the connection; the client's next
    call on it must not take that copy (a decision already answered) for its own."""
    calls = []

    def twice_then_unsafe(head: bytes, body: bytes) -> bytes:
        calls.append(head)
        if len(calls) == 1:
            first = reply(json.dumps(decision("SAFE", "a" * 32)).encode())
            return first + first
        return reply(json.dumps(decision("UNSAFE", "b" * 32)).encode())

    with fake_server(twice_then_unsafe) as (url, _), GuardClient(url, timeout_s=5.0) as gc:
        first = gc.check(Scene(IMAGE, REQUEST))
        assert first.label == "SAFE" and first.decision_id == "a" * 32  # control
        second = gc.check(Scene(IMAGE, REQUEST))
        assert second.label == "UNSAFE" and second.fail_closed, second
        assert "already" in (second.fail_reason or ""), second.fail_reason
        [again] = gc.check_batch([Scene(IMAGE, REQUEST)])  # the same rule for batches
        assert again.label == "UNSAFE"


def test_a_compressed_or_oversize_reply_fails_closed_without_being_inflated():
    """The sidecar never compresses and its replies are small: a gzip body (a few hundred kB
    that would inflate to 64 MB) and a body over the reply limit are refused, not parsed."""
    row = json.dumps(decision()).encode()
    bomb = gzip.compress(b" " * (64 << 20) + row)
    for answer, why in [
        (reply(bomb, b"Content-Encoding: gzip"), "Content-Encoding"),
        (reply(b" " * (40 << 20) + row), "bytes"),
    ]:
        with fake_server(lambda head, body, a=answer: a) as (url, heads):
            with GuardClient(url, timeout_s=20.0) as gc:
                d = gc.check(Scene(IMAGE, REQUEST))
            assert d.label == "UNSAFE" and d.fail_closed, why
            assert why in (d.fail_reason or ""), d.fail_reason
            assert b"accept-encoding: identity" in heads[0].lower()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs a FIFO")
def test_timeout_s_also_bounds_reading_the_scenes_image(tmp_path: Path):
    """An image path whose read blocks (a FIFO no camera process writes yet, a hung network
    mount) is within the call's ``timeout_s``, like the exchange: the call fails closed."""
    fifo = tmp_path / "cam.fifo"
    os.mkfifo(fifo)
    out: dict[str, Any] = {}

    def run() -> None:
        with GuardClient("http://127.0.0.1:9", timeout_s=0.5) as gc:
            out["one"] = gc.check(Scene(fifo, REQUEST))
            out["batch"] = gc.check_batch([Scene(IMAGE, "a"), Scene(fifo, "b")])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10.0)  # far past 2 × 0.5 s; without the bound the call never returns
    try:
        assert not t.is_alive(), "check() did not return: timeout_s does not bound the read"
        for d in [out["one"], *out["batch"]]:
            assert d.label == "UNSAFE" and d.fail_closed and d.decision_id == ""
            assert "image" in (d.fail_reason or "") and "0.5 s" in (d.fail_reason or "")
    finally:  # give the blocked readers their end of file
        for _ in range(2):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader left
                break


def test_healthy_and_ready_never_raise_even_once_closed():
    gc = GuardClient("http://127.0.0.1:9", timeout_s=1.0)
    gc.close()
    assert gc.healthy() is False and gc.ready() is False


def test_an_image_path_is_read_as_the_guard_reads_it(tmp_path: Path):
    """A path to a file past the guard's byte limit was read whole into memory (a 300 MB file:
    300 MB; /dev/zero: until the process ran out) before anything was sent. The client reads
    as the guard does: at most DEFAULT_MAX_BYTES, and the scene fails closed saying so."""
    from spotstop.guard._image import DEFAULT_MAX_BYTES

    big = tmp_path / "video.mp4"
    with big.open("wb") as fh:  # sparse: no disk is used
        fh.truncate(DEFAULT_MAX_BYTES + 4096)
    with GuardClient("http://127.0.0.1:9", timeout_s=20.0) as gc:
        got = [gc.check(Scene(big, REQUEST)), *gc.check_batch([Scene(IMAGE, "a"), Scene(big, "b")])]
        folder = gc.check(Scene(tmp_path, REQUEST))
    for d in got:
        assert d.label == "UNSAFE" and d.fail_closed and d.decision_id == ""
        assert f"the limit is {DEFAULT_MAX_BYTES} bytes" in (d.fail_reason or ""), d.fail_reason
    assert "is a directory" in (folder.fail_reason or ""), folder.fail_reason
