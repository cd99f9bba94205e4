"""Versioned policies in a bundle: history is never overwritten; one version is active.

Layout (inside the bundle folder)::

    policy.yaml                      the ACTIVE policy: what the Guard loads
    policies/policy-v0001.yaml       history, one file per version, never rewritten
    policies/policy-v0002.yaml

* :func:`write_policy_version` writes ``policies/policy-vNNNN.yaml`` with the next free
  number. The name is claimed with a hard link from a fully written temp file, which fails
  if the name exists, so two writers never overwrite each other and a reader never sees a
  half-written version. If ``policy.yaml`` matches no version yet (the bundle's first
  policy, or a hand edit), it is archived first as its own version, byte for byte.
  ``fitted_on.version`` holds the number and ``fitted_on.previous`` the version that was
  active when it was fitted.
* A version becomes active with :func:`activate_policy_version` (``spotstop policy
  activate``, or ``spotstop recalibrate --activate``): the file is loaded, validated and
  checked against the bundle id and prompt hash, then copied byte for byte over
  ``policy.yaml`` atomically (temp file + ``os.replace``). A running guard picks it up on
  ``Guard.reload_policy()`` (the sidecar: ``POST /v1/policy/reload`` or SIGHUP); until then
  it keeps the policy it loaded. Rolling back is activating an older version.
* Which version is active: the one whose bytes equal ``policy.yaml``
  (:func:`active_policy_version`).
* A stateful policy's fitted starting state (the situation windows from the log) is part of
  the version itself (``state_seed``); the guard keeps the live state, one file per version
  (:mod:`spotstop.guard._state`), so re-activating a version resumes its windows.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spotstop.calibrate._logdata import CalibrationError
from spotstop.guard._bundle import POLICY_VERSIONS_DIR
from spotstop.guard._files import NEW_FILE_MODE, atomic_write_bytes
from spotstop.guard.policies import (
    PolicyConfig,
    check_policy_fits,
    check_policy_matches,
    load_policy,
    policy_text,
)
from spotstop.guard.validate import load_yaml

__all__ = [
    "POLICY_DIR",
    "PolicyVersion",
    "activate_policy_version",
    "active_policy_version",
    "list_policy_versions",
    "resolve_policy_version",
    "write_policy_version",
]

POLICY_DIR = POLICY_VERSIONS_DIR
_NAME = re.compile(r"^policy-v(\d{4,})\.yaml$")


@dataclass(frozen=True)
class PolicyVersion:
    """One stored policy version: its number, file, sha256, and what it holds."""

    number: int
    path: Path
    sha256: str
    kind: str
    created: str
    active: bool

    @property
    def name(self) -> str:
        """``vNNNN``."""
        return f"v{self.number:04d}"

    def __str__(self) -> str:
        mark = "*" if self.active else " "
        return f"{mark} {self.name}  {self.kind:<9}  created {self.created}  {self.path.name}"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bundle_paths(bundle_dir: str | os.PathLike[str]) -> tuple[Path, Path, Any]:
    from spotstop.guard import load_bundle

    bundle = load_bundle(bundle_dir, verify=False)
    return bundle.policy_path, bundle.policy_path.parent / POLICY_DIR, bundle


def _peek(path: Path) -> tuple[str, str]:
    try:
        doc = load_yaml(path.read_text(encoding="utf-8"), source=str(path))
        return str(doc["policy"]["kind"]), str(doc["created"])
    except Exception:  # a damaged history file is listed, not fatal
        return "?", "?"


def list_policy_versions(bundle_dir: str | os.PathLike[str]) -> list[PolicyVersion]:
    """Every stored version of a bundle, oldest first; ``active`` marks the one in force."""
    active_path, pdir, _ = _bundle_paths(bundle_dir)
    active_sha = _sha(active_path) if active_path.is_file() else None
    out: list[PolicyVersion] = []
    if not pdir.is_dir():
        return out
    for p in sorted(pdir.iterdir()):
        m = _NAME.match(p.name)
        if not m or not p.is_file():
            continue
        sha = _sha(p)
        kind, created = _peek(p)
        out.append(PolicyVersion(int(m.group(1)), p, sha, kind, created, sha == active_sha))
    out.sort(key=lambda v: v.number)
    return out


def active_policy_version(bundle_dir: str | os.PathLike[str]) -> PolicyVersion | None:
    """The version whose bytes equal ``policy.yaml``, or None (no match, or no policy.yaml)."""
    return next((v for v in list_policy_versions(bundle_dir) if v.active), None)


def resolve_policy_version(bundle_dir: str | os.PathLike[str], version: str | int) -> PolicyVersion:
    """A version by number (``2``, ``"v0002"``, ``"2"``) or by file name."""
    versions = list_policy_versions(bundle_dir)
    text = str(version).strip()
    m = re.fullmatch(r"v?(\d+)", text)
    given = Path(text)
    for v in versions:
        if m and v.number == int(m.group(1)):
            return v
        # a file name alone, or a path to this very file; never another folder's namesake
        if v.path.name == given.name and (
            given.name == text or (given.exists() and given.resolve() == v.path.resolve())
        ):
            return v
    if given.name != text and not m:
        raise CalibrationError(
            f"{text!r} is a path outside bundle {bundle_dir}'s policies/ folder; a version is "
            "named by its number (2, v0002) or its file name there. To use that file, store it "
            "as a version of this bundle first (spotstop.calibrate.write_policy_version(BUNDLE, "
            "load_policy(FILE))), then activate the version it gets."
        )
    have = ", ".join(v.name for v in versions) or "none"
    raise CalibrationError(
        f"bundle {bundle_dir} has no policy version {version!r}; it has: {have}. "
        "List them with `spotstop policy list BUNDLE`."
    )


def _claim(pdir: Path, data: bytes, start: int) -> tuple[int, Path]:
    """Write ``data`` as the first free ``policy-vNNNN.yaml`` from ``start``, byte for byte;
    never overwrite."""
    pdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=pdir, prefix=".policy.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), NEW_FILE_MODE)  # readable as policy.yaml is (mkstemp: 0600)
            os.fsync(f.fileno())
        n = start
        while True:
            target = pdir / f"policy-v{n:04d}.yaml"
            try:
                os.link(tmp, target)  # atomic, fails if the name exists
                return n, target
            except FileExistsError:
                n += 1
            except OSError:  # no hard links on this filesystem: exclusive create
                try:
                    with open(target, "xb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    return n, target
                except FileExistsError:
                    n += 1
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _next_number(pdir: Path) -> int:
    nums = [int(m.group(1)) for p in pdir.glob("policy-v*.yaml") if (m := _NAME.match(p.name))]
    return max(nums, default=0) + 1


def _archive(bundle_dir: str | os.PathLike[str], pdir: Path, data: bytes, sha: str) -> int:
    """Store ``data`` (the policy in force, sha256 ``sha``) as a version and return its
    number. Two processes storing at once each archived it: the one whose copy is not the
    lowest-numbered removes its own, so the bytes are one version (both use the lowest)."""
    n, path = _claim(pdir, data, _next_number(pdir))
    lower = [v.number for v in list_policy_versions(bundle_dir) if v.sha256 == sha and v.number < n]
    if lower:
        path.unlink()
        return min(lower)
    return n


def write_policy_version(bundle_dir: str | os.PathLike[str], cfg: PolicyConfig) -> PolicyVersion:
    """Write ``cfg`` as the next version of the bundle's policy (see the module docstring).

    The policy must be for this bundle (id and prompt hash). Returns the new version (not
    active: see :func:`activate_policy_version`).
    """
    active_path, pdir, bundle = _bundle_paths(bundle_dir)
    check_policy_matches(cfg, bundle.bundle_id, bundle.prompt_hash)
    pdir.mkdir(parents=True, exist_ok=True)
    known = {v.sha256 for v in list_policy_versions(bundle_dir)}
    previous: dict[str, Any] | None = None
    if active_path.is_file():
        sha = _sha(active_path)
        if sha not in known:  # archive the policy in force before anything else
            n_old = _archive(bundle_dir, pdir, active_path.read_bytes(), sha)
            previous = {"version": n_old, "sha256": sha}
        else:
            act = active_policy_version(bundle_dir)
            previous = None if act is None else {"version": act.number, "sha256": act.sha256}
    # the number is claimed below; the text must name it, so retry on a lost race
    while True:
        n = _next_number(pdir)
        # the number and predecessor are this store's: a loaded version's own are replaced
        given = {k: v for k, v in cfg.fitted_on.items() if k not in ("version", "previous")}
        fitted_on = {"version": n, "previous": previous, **given}
        text = policy_text(replace(cfg, fitted_on=fitted_on))
        got, path = _claim(pdir, text.encode("utf-8"), n)
        if got == n:
            break
        path.unlink()  # lost the race for n (the text names n): write again
    kind, created = _peek(path)
    return PolicyVersion(n, path, _sha(path), kind, created, False)


def activate_policy_version(
    bundle_dir: str | os.PathLike[str], version: str | int
) -> PolicyVersion:
    """Make a stored version the active ``policy.yaml`` (validated first; atomic copy).

    Raises :class:`spotstop.guard.policies.PolicyError` when the version is invalid or fitted for
    another bundle or prompt; ``policy.yaml`` is then left as it was.
    """
    v = resolve_policy_version(bundle_dir, version)
    active_path, _, bundle = _bundle_paths(bundle_dir)
    cfg = load_policy(v.path)  # reads the file only: no live state is touched
    check_policy_matches(cfg, bundle.bundle_id, bundle.prompt_hash)
    # as the guard will load it: relative paths from policy.yaml's folder
    check_policy_fits(cfg, [m.name for m in bundle.members], active_path.parent)
    atomic_write_bytes(active_path, v.path.read_bytes())
    return replace(v, active=True)
