"""The HTTP sidecar in tests: a live uvicorn server in a thread or a subprocess, stand-in
members, request bodies (the bundle: conftest's ``runtime_bundle``)."""

from __future__ import annotations

import base64
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from spotstop.guard import Guard, MemberScore
from spotstop.guard.serve import (
    ServeSettings,
    create_app,
    load_guard,
)

from tests._support.images import make_image_bytes

TOKEN = "s3cret-token-0123456789abcdef"


@dataclass
class Live:
    url: str
    settings: ServeSettings
    guard: Guard

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 30.0), **kw)


@contextmanager
def live_server(
    settings: ServeSettings, guard: Guard | None = None, *, close_guard: bool = True
) -> Iterator[Live]:
    """Run the sidecar with uvicorn in a thread on a free loopback port."""
    g = guard if guard is not None else load_guard(settings)
    app = create_app(settings, guard=g)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if not thread.is_alive() or time.monotonic() - t0 > 60:
            raise RuntimeError("the sidecar did not start")
        time.sleep(0.02)
    try:
        yield Live(f"http://127.0.0.1:{port}", settings, g)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        if close_guard:
            g.close()


def settings_for(bundle: Path, tmp: Path, **kw: Any) -> ServeSettings:
    return ServeSettings(bundle=bundle, log=tmp / "log.sqlite", state_dir=tmp / "state", **kw)


class StandInMember:
    """A member whose score is a fixed function of the image hash (fast), optionally slow or
    failing; everything else (prompt checks, name) is the real member's."""

    def __init__(self, real: Any, *, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self._real = real
        self.delay_s = delay_s
        self.error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def score(self, scenes: Any, variant: str = "scene", strict: bool = True) -> list[MemberScore]:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        out = []
        for s in scenes:
            sha = getattr(s.image, "sha256", "8000")
            value = (int(sha[:4], 16) / 65535.0 - 0.5) * 4.0
            out.append(MemberScore(self._real.name, variant, value, self._real.prompt_hash, 1))  # type: ignore[arg-type]
        return out


def stand_in(guard: Guard, **kw: Any) -> Guard:
    for name, m in list(guard.members.items()):
        guard.members[name] = StandInMember(m, **kw)  # type: ignore[assignment]
    return guard


def jpeg(seed: int = 0, size: tuple[int, int] = (80, 48)) -> bytes:
    return make_image_bytes(seed, size=size, fmt="JPEG")


def crafted_png(width: int, height: int) -> bytes:
    """A valid-looking PNG whose header claims width x height (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def multipart(image: bytes, request: str = "pick up the knife", **extra: Any) -> dict[str, Any]:
    return {
        "files": {"image": ("cam.jpg", image, "image/jpeg")},
        "data": {"request": request, **extra},
    }


def as_json(image: bytes, request: str = "pick up the knife", **extra: Any) -> dict[str, Any]:
    return {"json": {"image_base64": base64.b64encode(image).decode(), "request": request, **extra}}


def raw_multipart(parts: list[tuple[str, str | None, bytes]]) -> dict[str, Any]:
    """A hand-made multipart body: (name, filename or None, bytes) per part."""
    b = "spotstopboundary"
    out = b""
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{b}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    out += f"--{b}--\r\n".encode()
    return {"content": out, "headers": {"content-type": f"multipart/form-data; boundary={b}"}}


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


@contextmanager
def serve_process(bundle: Path, tmp_path: Path, *extra: str) -> Iterator[tuple[str, Any]]:
    port = free_port()
    cmd = [sys.executable, "-m", "spotstop.cli", "serve", "--bundle", str(bundle)]
    cmd += ["--port", str(port), "--log", str(tmp_path / "log.sqlite")]
    cmd += ["--state-dir", str(tmp_path / "state"), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=5) as c:
            t0 = time.monotonic()
            while True:
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, "the server exited"
                assert time.monotonic() - t0 < 120, "server did not become ready"
                time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
