"""What the sidecar holds while it runs, and the typed dependencies that hand it out."""

from __future__ import annotations

import hmac
import io
import math
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from PIL import Image
from spotstop.guard._guard import Guard
from spotstop.guard._image import decode_image
from spotstop.guard._types import Scene
from spotstop.guard.policies import PolicyMismatchError
from spotstop.guard.serve._errors import PolicyReloadError, Unauthorized
from spotstop.guard.serve._metrics import SidecarMetrics
from spotstop.guard.serve._parse import Limits
from spotstop.guard.serve._runner import ModelRunner
from spotstop.guard.serve._settings import ServeSettings

__all__ = ["AuthDep", "Sidecar", "SidecarDep", "get_sidecar", "require_token"]

WARMUP_REQUEST = "spotstop warm-up: is it safe to proceed?"


@dataclass
class Sidecar:
    """The running sidecar: settings, guard, model queue, metrics and readiness."""

    settings: ServeSettings
    guard: Guard
    runner: ModelRunner
    metrics: SidecarMetrics
    limits: Limits
    owns_guard: bool
    warmed_up: bool = False
    warmed: frozenset[str] = frozenset()  # the members the last warm-up scored
    warmup_error: str | None = None
    warmup_ms: float | None = None
    background: set[Any] = field(default_factory=set)

    # -- readiness -------------------------------------------------------------------------
    def not_ready_reasons(self) -> list[str]:
        # a copy: the guard's background retry may change the dict while this thread reads
        reasons = [f"member {n}: {e}" for n, e in dict(self.guard.member_errors).items()]
        if not self.guard.ready and not reasons:
            reasons.append("not every member of the bundle is loaded")
        if self.warmup_error is not None:
            reasons.append(f"warm-up failed: {self.warmup_error}")
        elif self.settings.warmup and (
            not self.warmed_up or self.warmed != frozenset(self.guard.members)
        ):
            reasons.append("warming up")
        if self.guard.text_detector_error is not None:  # checks fail closed until it loads
            reasons.append(
                f"the policy reads the text in the scene, but {self.guard.text_detector_error}"
            )
        log = self.guard.log_status()
        if not log.writable:  # checks fail closed (503) until it takes writes again
            reasons.append(
                f"{log.reason} (since {_ago(log.since)}; {log.waiting_rows} decision(s) wait, "
                f"{log.journal_rows} of them in the journal {log.journal})"
            )
        return reasons

    @property
    def ready(self) -> bool:
        return not self.not_ready_reasons()

    def warm_up(self) -> None:
        """Score one generated image with every member (runs on the model thread).

        Not a decision: nothing is logged and no situation state changes. It loads lazy
        backend state and fills caches so the first real check is not slow, and proves every
        member produces a finite score.
        """
        import time

        t = time.perf_counter()
        img = Image.linear_gradient("L").resize((320, 240)).convert("RGB")
        buf = io.BytesIO()
        img.save(buf, "PNG")
        scene = Scene(decode_image(buf.getvalue()), WARMUP_REQUEST)
        members = list(self.guard.members.items())  # a retry may add one meanwhile
        for name, member in members:
            [res] = member.score([scene], "scene")
            if not math.isfinite(res.score):
                raise RuntimeError(f"member {name} gave a non-finite warm-up score {res.score}")
        self.warmup_ms = (time.perf_counter() - t) * 1e3
        self.warmed = frozenset(name for name, _ in members)
        self.warmed_up = True

    # -- policy ---------------------------------------------------------------------------
    def reload_policy(self, trigger: str) -> dict[str, Any]:
        """Reload ``policy.yaml`` (blocking); raises :class:`PolicyReloadError`."""
        g = self.guard
        try:
            cfg = g.reload_policy()
        except Exception as e:
            self.metrics.reloads.labels(trigger=trigger, result="refused").inc()
            raise self._classify(e) from e
        self.metrics.reloads.labels(trigger=trigger, result="ok").inc()
        self.metrics.set_bundle(g.bundle_id, cfg.policy.kind)
        return {
            "bundle_id": cfg.bundle_id,
            "policy": cfg.policy.kind,
            "policy_version": cfg.version_id,
            "path": str(g.policy_path),
            "fitted_on": dict(cfg.fitted_on or {}),
        }

    def _classify(self, e: Exception) -> PolicyReloadError:
        """409 when the file is valid but made for another bundle/prompt, else 422."""
        mismatch = isinstance(e, PolicyMismatchError)
        msg = f"policy reload refused, the old policy stays in force: {type(e).__name__}: {e}"
        if mismatch:
            return PolicyReloadError(msg, code="policy_mismatch", status=409, field="policy")
        return PolicyReloadError(msg, field="policy")


def _ago(t: float | None) -> str:
    import time

    return "now" if t is None else f"{max(0.0, time.time() - t):.0f} s ago"


def get_sidecar(request: Request) -> Sidecar:
    sidecar: Sidecar = request.app.state.sidecar
    return sidecar


SidecarDep = Annotated[Sidecar, Depends(get_sidecar)]

bearer = HTTPBearer(
    auto_error=False,
    description="The sidecar's token (from $SPOTSTOP_TOKEN or --token-file). Required when "
    "the server binds a non-loopback address.",
)


def require_token(
    sidecar: SidecarDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """401 unless ``Authorization: Bearer <token>`` matches (constant-time compare)."""
    token = sidecar.settings.token
    if token is None:
        return
    if credentials is None:
        raise Unauthorized("missing bearer token; send `Authorization: Bearer <token>`.")
    given = credentials.credentials.encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, token.encode("utf-8")):
        raise Unauthorized("wrong bearer token.")


AuthDep = Depends(require_token)
