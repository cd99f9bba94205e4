"""Benchmark: the HTTP sidecar against in-process ``Guard.check`` on the same scenes.

Run: ``python bench/sidecar.py [--bundle DIR] [--n 100] [--concurrency 4]``.

Without ``--bundle`` the demo bundle on the tiny TEST pair is built (once) under
``$SPOTSTOP_HOME/bench`` (default ``~/.cache/spotstop/bench``); its decisions mean nothing
but its cost is that of real scoring through the torch backend.

Phases, one after the other (never two at once, so they do not compete for the CPU):

1. in-process: ``Guard.check`` on each scene, sequentially (its own decision log).
2. sidecar: ``spotstop serve`` in a subprocess on a loopback port, then
   ``GuardClient.check`` (multipart) on the same scenes, sequentially; then the same with a
   JSON/base64 body (raw httpx); then ``--concurrency`` clients at once (throughput with the
   queue busy); and ``GET /healthz`` round trips (the HTTP floor).

Latency is wall time per call as the caller sees it; requests/s is calls / wall time of the
phase. The ratio lines give the HTTP overhead.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def _bundle(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    from spotstop.guard import spotstop_home

    root = spotstop_home() / "bench"
    if not (root / "bundle" / "policy.yaml").is_file():
        from spotstop.cli import make_demo_bundle

        root.mkdir(parents=True, exist_ok=True)
        print(f"building the demo bundle (tiny TEST pair) in {root} …", file=sys.stderr)
        make_demo_bundle(root)
    return root / "bundle"


def _stats(lat_s: list[float], wall_s: float) -> tuple[float, float, float]:
    a = np.asarray(lat_s) * 1e3
    return len(a) / wall_s, float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _timed(fn: Callable[[int], object], n: int) -> tuple[list[float], float]:
    lat = []
    t0 = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    return lat, time.perf_counter() - t0


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="bundle folder (default: demo)")
    ap.add_argument("--n", type=int, default=100, help="scenes per phase (default 100)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per phase (default 5)")
    ap.add_argument("--concurrency", type=int, default=4, help="clients in the concurrent phase")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    # bench/diagnostics.py would shadow the diagnostics package: drop this folder from the path
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]

    import httpx
    from spotstop.export.scenes import demo_scenes
    from spotstop.guard import Guard
    from spotstop.guard.client import GuardClient

    bundle = _bundle(args.bundle)
    scenes = demo_scenes(args.n, seed=args.seed, situations=[f"s{i % 4}" for i in range(args.n)])
    warm = demo_scenes(args.warmup, seed=args.seed + 1)
    tmp = Path(tempfile.mkdtemp(prefix="spotstop-bench-"))
    rows: list[tuple[str, tuple[float, float, float]]] = []
    try:
        # -- 1. in-process ------------------------------------------------------------------
        with Guard(bundle, log=tmp / "inproc.sqlite", state_dir=tmp / "state_inproc") as g:
            bundle_id, test_pair = g.bundle_id, g.bundle.test_pair
            for s in warm:
                g.check(s)
            inproc = [None] * args.n
            lat, wall = _timed(lambda i: inproc.__setitem__(i, g.check(scenes[i])), args.n)
            rows.append(("in-process Guard.check", _stats(lat, wall)))

        # -- 2. sidecar -----------------------------------------------------------------------
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable, "-m", "spotstop.cli", "serve", "--bundle", str(bundle),
            "--port", str(port), "--log", str(tmp / "sidecar.sqlite"),
            "--state-dir", str(tmp / "state_sidecar"), "--deadline", "0",
            "--queue-size", str(max(32, 2 * args.concurrency)), "--log-level", "warning",
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            with httpx.Client(base_url=url, timeout=5) as h:
                t0 = time.monotonic()
                while True:
                    try:
                        if h.get("/readyz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if proc.poll() is not None or time.monotonic() - t0 > 120:
                        err = proc.stderr.read().decode() if proc.stderr else ""
                        raise SystemExit(f"the sidecar did not become ready:\n{err}")
                    time.sleep(0.1)
            with GuardClient(url, timeout_s=60) as gc:
                for s in warm:
                    gc.check(s)
                side = [None] * args.n
                lat, wall = _timed(lambda i: side.__setitem__(i, gc.check(scenes[i])), args.n)
                rows.append(("sidecar /v1/check multipart (GuardClient)", _stats(lat, wall)))

            bodies = [
                {
                    "image_base64": base64.b64encode(bytes(s.image)).decode(),  # type: ignore[arg-type]
                    "request": s.request,
                    "situation_id": s.situation_id,
                }
                for s in scenes
            ]
            with httpx.Client(base_url=url, timeout=60) as h:
                lat, wall = _timed(lambda i: h.post("/v1/check", json=bodies[i]).json(), args.n)
                rows.append(("sidecar /v1/check JSON base64 (httpx)", _stats(lat, wall)))
                lat, wall = _timed(lambda i: h.get("/healthz"), args.n)
                rows.append(("sidecar GET /healthz (HTTP floor)", _stats(lat, wall)))

            per_client = args.n // args.concurrency
            clients = [GuardClient(url, timeout_s=120) for _ in range(args.concurrency)]

            def run_client(k: int) -> list[float]:
                out = []
                for j in range(per_client):
                    t = time.perf_counter()
                    d = clients[k].check(scenes[(k * per_client + j) % args.n])
                    out.append(time.perf_counter() - t)
                    if d.decision_id == "":
                        raise SystemExit(f"the sidecar refused a check: {d.fail_reason}")
                return out

            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as ex:
                lat = [x for chunk in ex.map(run_client, range(args.concurrency)) for x in chunk]
            wall = time.perf_counter() - t0
            for c in clients:
                c.close()
            rows.append((f"sidecar, {args.concurrency} concurrent clients", _stats(lat, wall)))
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    fails = sum(d.fail_closed for d in inproc) + sum(d.fail_closed for d in side)  # type: ignore[union-attr]
    same = sum(
        abs(a.fused_score - b.fused_score) < 1e-4  # type: ignore[union-attr]
        for a, b in zip(inproc, side, strict=True)
    )
    print(
        f"spotstop sidecar benchmark — {args.n} scenes per phase (demo scenes, JPEG/PNG "
        f"160–640 px), bundle {bundle_id}{' (TEST pair)' if test_pair else ''}, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'mode':<44} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for name, (rps, p50, p99) in rows:
        print(f"{name:<44} {rps:>8.1f} {p50:>8.2f} {p99:>8.2f}")
    rps0, p50_0, p99_0 = rows[0][1]
    rps1, p50_1, p99_1 = rows[1][1]
    print(
        f"ratio sidecar/in-process (multipart, sequential): p50 ×{p50_1 / p50_0:.3f} "
        f"({p50_1 - p50_0:+.2f} ms), p99 ×{p99_1 / p99_0:.3f}, requests/s ×{rps1 / rps0:.3f}"
    )
    print(
        f"same fused score in-process and via the sidecar: {same}/{args.n}; "
        f"fail-closed decisions: {fails}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
