"""The live state of the active policy (the situation windows), owned by the guard.

Policies are pure: they read a state and return the next one. The guard keeps the current
value here (:meth:`StateStore.advance`, when a batch is decided) and persists it once the
batch's rows are in the decision log (or kept for it), atomically, to
``<state_dir>/state-<policy version id>.json`` — one file per policy version, so a refit
never reads windows made on another fusion scale, and re-activating a version resumes its
windows. A fresh file starts from the policy file's ``state_seed`` (fitted from the log by
``calibrate``), or empty. Loading a policy never touches these files; only the guard does.

The file never runs ahead of the log: a crash between the two writes leaves it behind (the
windows miss the last batch, which the log holds), never holding the scores of decisions the
log never got (a caller that got no answer would ask again, and its scene would enter twice).

One process should own a state folder: two guards writing the same file overwrite each
other's windows (decisions stay correct, the references of the loser are lost).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from spotstop.guard._files import atomic_write_text
from spotstop.guard.policies import LoadContext, Policy, PolicyConfig, PolicyError

__all__ = ["StateStore"]

_FORMAT = 1
#: the state a store has not written yet (a fresh file starts from the policy's seed)
_UNWRITTEN = object()


def _no_fallback(d: Any, where: str) -> Policy:
    raise PolicyError(f"{where}: a state file holds no policy.")


class StateStore:
    """The current state of one policy version, with its file (None: memory only)."""

    def __init__(self, cfg: PolicyConfig, folder: str | Path | None) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self.path: Path | None = None
        if cfg.policy.stateful and folder is not None:
            self.path = Path(folder) / f"state-{cfg.version_id}.json"
        on_disk = self.path is not None and self.path.exists()
        self._state = self._load() if on_disk else cfg.initial_state()
        # what the file holds: a write that failed leaves the state ahead of the file, and
        # the next flush (after the next logged batch, or at close) writes it, whether or not the state moved again
        self._written: Any = self._state if on_disk else _UNWRITTEN

    @property
    def state(self) -> Any:
        """The state before the next batch (None for a stateless policy)."""
        with self._lock:
            return self._state

    def advance(self, state: Any) -> None:
        """Make ``state`` current, in memory (the scores were observed); :meth:`flush` writes
        it once the batch's rows are logged."""
        if not self.cfg.policy.stateful:
            return
        with self._lock:
            self._state = state

    def flush(self) -> None:
        """Write the state if the file is behind it: after each batch is logged, after a
        failed write, at close, or when the guard leaves this version. Raises when the write
        fails."""
        if not self.cfg.policy.stateful:
            return
        with self._lock:
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        if self._state == self._written and self.path.exists():
            return  # nothing moved (e.g. no scene had a situation): no write, no fsync
        doc = {
            "format": _FORMAT,
            "policy_version": self.cfg.version_id,
            "fusion_key": self.cfg.fusion_key,
            "kind": self.cfg.kind,
            "state": self.cfg.policy.seed_to_dict(self._state),
        }
        atomic_write_text(self.path, json.dumps(doc, allow_nan=False, indent=1))
        self._written = self._state

    def _load(self) -> Any:
        assert self.path is not None  # only called with a path
        where = f"state file {str(self.path)!r}"
        fix = (
            "Delete it to start again from the policy's state_seed (situations fall back "
            "until their windows refill)."
        )
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PolicyError(f"{where} could not be read as JSON: {e}. {fix}") from e
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise PolicyError(f"{where} is not a spotstop state file of format {_FORMAT}. {fix}")
        if doc.get("policy_version") != self.cfg.version_id:
            raise PolicyError(
                f"{where} belongs to policy {doc.get('policy_version')!r}, not "
                f"{self.cfg.version_id!r} (another fit: its scores are on another scale). {fix}"
            )
        ctx = LoadContext(
            source=where,
            where="state",
            members=self.cfg.fusion.members,
            parse_fallback=_no_fallback,
        )
        try:
            seed = self.cfg.policy.seed_from_dict(doc.get("state"), ctx)
        except PolicyError as e:  # the message names the file's key; say how to start again
            raise PolicyError(f"{e} {fix}") from e
        return self.cfg.policy.initial_state(seed)
