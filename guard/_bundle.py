"""Reading a bundle: ``manifest.yaml`` + members + ``policy.yaml``.

A bundle is the central artifact (DESIGN.md): member models, their rendered prompt templates,
image grids and answer strings, a file list with sha256, and the policy fitted for exactly this
bundle id and prompt hash. ``export/bundle.py`` writes bundles.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotstop.guard._config import parse_image_size
from spotstop.guard._errors import ConfigError, GuardError
from spotstop.guard._hf import OPTIONAL_MEMBER_FILES, TEST_PAIR_KINDS, describe_test_pair
from spotstop.guard._prompt import PromptSpec, RenderedTemplate
from spotstop.guard.validate import load_yaml

__all__ = [
    "POLICY_VERSIONS_DIR",
    "STATE_DIR",
    "Bundle",
    "BundleError",
    "BundleMember",
    "MemberFilesWatch",
    "bundle_content_id",
    "is_device_built",
    "load_bundle",
    "pair_prompt_hash",
    "sha256_file",
]

BUNDLE_FORMAT = "spotstop-bundle"
BUNDLE_VERSION = 1

POLICY_VERSIONS_DIR = "policies"
"""The bundle's folder of stored policy versions (``calibrate``'s history, beside
``policy.yaml``): fitted for this bundle's scores, never another's."""

STATE_DIR = "state"
"""The folder of a stateful policy's live state beside the decision log (the guard's default
``state_dir``; by default the log lies in the bundle): made on this bundle's scores."""


class BundleError(GuardError, ValueError):
    """A bundle is incomplete, altered, or not a spotstop bundle."""


@dataclass(frozen=True)
class BundleMember:
    """One member as the bundle's manifest records it (an entry of :attr:`Bundle.members`).

    name: the member's name in the bundle (and in the decision log's ``member_scores``);
    path: its folder inside the bundle; model_type: its architecture; backend: the backend
    the manifest names (``torch`` for a Hugging Face folder, ``onnx`` for an exported one);
    image_size: (height, width) of its image grid; prompt_hash: the hash of the prompt it was
    bundled with; template: its rendered chat template; revision: the source revision, when
    known. Load it with :func:`load_bundle_member`.
    """

    name: str
    path: Path
    model_type: str
    backend: str
    image_size: tuple[int, int]
    prompt_hash: str
    template: RenderedTemplate
    revision: str | None
    #: the member's visual-token budget (its own bundle setting; None in older manifests)
    visual_tokens: int | None = None


@dataclass(frozen=True)
class Bundle:
    """A loaded, verified bundle manifest (models are loaded by :class:`spotstop.guard.Guard`)."""

    path: Path
    bundle_id: str
    prompt_hash: str
    prompt: PromptSpec
    members: tuple[BundleMember, ...]
    policy_path: Path
    test_pair: bool
    manifest: Mapping[str, Any]
    #: every listed file's sha256 was checked when the manifest was read (``verify=True``)
    verified: bool = False
    #: each test member's kind as the manifest records it (``members[i].test_pair_kind``;
    #: None where a manifest written before kinds were recorded does not say)
    test_pair_kinds: tuple[str | None, ...] = ()

    @property
    def test_pair_note(self) -> str:
        """What to print beside this bundle's outputs when it is a test pair ('' otherwise):
        what its members are, from the manifest (:func:`~spotstop.guard._hf.describe_test_pair`)."""
        return describe_test_pair(self.test_pair_kinds) if self.test_pair else ""

    def __repr__(self) -> str:
        tp = ", TEST PAIR" if self.test_pair else ""
        names = ", ".join(m.name for m in self.members)
        return f"Bundle({self.bundle_id}, members=[{names}], prompt_hash={self.prompt_hash}{tp})"

    def missing_files(self, member: BundleMember) -> list[str]:
        """The files the manifest lists under ``member``'s folder that are not there (no
        hashing: what a guard opened with ``verify=False`` still checks, so that a member
        missing a weights file is reported unavailable at load, not at its first check)."""
        try:
            prefix = member.path.relative_to(self.path).as_posix() + "/"
        except ValueError:  # a member folder outside the bundle (torch): nothing listed
            return []
        return sorted(
            rel
            for rel in self.manifest["files"]
            if rel.startswith(prefix)
            and not is_device_built(rel)
            and not (self.path / rel).is_file()
        )

    def member_files(self, member: BundleMember) -> dict[str, str]:
        """``member``'s listed files (path in the bundle → sha256); empty for a member folder
        outside the bundle (a torch reference bundle lists none)."""
        try:
            prefix = member.path.relative_to(self.path).as_posix() + "/"
        except ValueError:
            return {}
        return {k: v for k, v in self.manifest["files"].items() if k.startswith(prefix)}

    def check_member_files(self, member: BundleMember) -> None:
        """Check again that ``member``'s listed files are the ones the manifest names, before
        they are read after the bundle was verified: a graph opened later (the decoder at the
        first check, sessions opened on demand for every check, a member loaded again after a
        failure) would otherwise run bytes that were never checked, e.g. of an export that
        replaced the bundle while the guard ran. Nothing to do for a bundle read with
        ``verify=False``. Unchanged files are not read again (:func:`sha256_file`)."""
        if not self.verified:
            return
        bad = _mismatches(self.path, self.member_files(member))
        bad += _unlisted(self.path, member.path, self.manifest["files"])
        if bad:
            raise BundleError(
                f"bundle {self.path} changed after it was verified: member {member.name}'s "
                + "; ".join(bad[:5])
                + ". The guard runs no file it has not verified and fails closed meanwhile; "
                "it checks again at the next scene. If an export or copy replaced the bundle, "
                "restart the guard to load the new one."
            )


class MemberFilesWatch:
    """Notices a member's files written in place under its open graph sessions.

    onnxruntime maps a graph's external weights file into memory: a session opened on a
    verified file runs whatever bytes that file holds later. A file replaced by a rename (an
    export's swap, ``mv``) leaves the session its old, verified inode; one written in place
    (``cp`` over it, an editor) changes the weights under it with no other check. So before
    each run :meth:`check` stats the member's listed files (microseconds) and, for one whose
    inode is the one verified but whose size or times moved, checks the bundle's files again
    (:meth:`Bundle.check_member_files`): a mismatch raises :class:`BundleError` (the scene
    fails closed) until the bytes are the manifest's again.
    """

    def __init__(self, bundle: Bundle, member: BundleMember) -> None:
        self._bundle, self._member = bundle, member
        self._files = tuple((rel, str(bundle.path / rel)) for rel in bundle.member_files(member))
        self._seen = self._stats()

    def _stats(self) -> dict[str, tuple[int, ...] | None]:
        out: dict[str, tuple[int, ...] | None] = {}
        for rel, path in self._files:
            try:
                st = os.stat(path)
            except OSError:  # gone: an open session keeps the inode it mapped
                out[rel] = None
            else:
                out[rel] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return out

    def check(self) -> None:
        """Raise :class:`BundleError` when a file the sessions may map was written in place
        with other bytes than the manifest's."""
        if not self._bundle.verified:
            return
        now = self._stats()
        written = [
            rel
            for rel, key in now.items()
            if (old := self._seen.get(rel)) is not None
            and key is not None
            and key[:2] == old[:2]  # the same inode: what the sessions map
            and key != old
        ]
        if not written:
            return
        self._bundle.check_member_files(self._member)  # raises on other bytes
        self._seen.update({rel: now[rel] for rel in written})


#: (device, inode, size, mtime_ns, ctime_ns) of a file → its sha256, for files hashed in this
#: process.
_DIGESTS: dict[tuple[int, ...], str] = {}
_DIGESTS_LOCK = threading.Lock()


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes.

    A bundle's graphs are hashed when the manifest is verified and again when a TensorRT
    engine record is checked against them (gigabytes on a real pair): the digest is kept per
    (device, inode, size, mtime, ctime) in this process, so an unchanged file is read once,
    and a file that was replaced or written since is read again. The ctime is in the key
    because a tool can set the mtime back after writing (``cp -p``, ``touch -r``, ``rsync
    -t``); nothing sets the ctime back. File times tick coarsely (a few ms), so a digest is
    kept only for a file last changed at least 2 s before it was read and unchanged while it
    was read: a later write then always shows in its times.
    """
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _DIGESTS_LOCK:
        hit = _DIGESTS.get(key)
    if hit is not None:
        return hit
    settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 2_000_000_000
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    after = os.stat(path)
    if (
        settled
        and (
            after.st_dev,
            after.st_ino,
            after.st_size,
            after.st_mtime_ns,
            after.st_ctime_ns,
        )
        == key
    ):
        with _DIGESTS_LOCK:
            _DIGESTS[key] = digest
    return digest


def is_device_built(rel: str) -> bool:
    """Whether a bundle path is built on the device after export, not part of the artifact.

    TensorRT engines, their record and build log (``members/<name>/trt/*.plan``,
    ``engines.yaml``, ``build.log``) are made on the target by ``trt/build.sh``: they are
    checked by the engine record (``spotstop.guard.backends._trt_record``), not by the manifest's sha256
    list, so rebuilding them on the device does not break the bundle's verification.
    """
    parts = Path(rel).parts
    return (  # in a member's own trt/ folder only: a member may be named trt
        len(parts) == 4
        and parts[0] == "members"
        and parts[2] == "trt"
        and Path(rel).suffix in (".plan", ".yaml", ".log")
    )


def pair_prompt_hash(member_hashes: Mapping[str, str]) -> str:
    """The bundle's prompt hash: one hash over the members' prompt hashes."""
    blob = "\n".join(f"{k}={member_hashes[k]}" for k in sorted(member_hashes)).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _opt_tokens(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BundleError(f"{where} must be a positive integer; got {value!r}.")
    return value


def bundle_content_id(
    prompt_hash: str, files: Mapping[str, str], members: Sequence[Mapping[str, Any]]
) -> str:
    """The content part of a bundle id: the prompt hash, every listed file's sha256 and each
    member's image grid and visual-token budget, so a bundle written at another budget (same
    member files) has another id and a policy fitted for one is refused by the other."""
    grids = "".join(f"|{m['name']}:{m.get('image_size')}:{m.get('visual_tokens')}" for m in members)
    blob = prompt_hash + "".join(f"{k}{v}" for k, v in sorted(files.items())) + grids
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _manifest_problem(m: Mapping[str, Any]) -> str | None:
    """What is wrong with the types of a manifest's sections (None: nothing); keys that are
    missing are named where they are read."""
    files = m.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        return "files must map each file's path to its sha256"
    prompt = m.get("prompt")
    if not isinstance(prompt, dict) or not all(isinstance(v, str) for v in prompt.values()):
        return "prompt must hold text, unsafe_answer and safe_answer as text"
    members = m.get("members")
    if not isinstance(members, list) or not members:
        return "members must be a non-empty list"
    for i, e in enumerate(members):
        if not isinstance(e, dict):
            return f"members[{i}] must be a mapping"
        t = e.get("template")
        if t is not None and (
            not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values())
        ):
            return f"members[{i}].template must hold with_image and without_image as text"
    names = [str(e.get("name")) for e in members]
    if len(set(names)) != len(names):
        return f"members must have distinct names; got {names}"
    return None


def _mismatches(root: Path, files: Mapping[str, str]) -> list[str]:
    """What differs between the listed ``files`` (path → sha256) and the bundle at ``root``:
    one line per file that is missing or whose sha256 differs (device-built files are checked
    by their engine record instead)."""
    bad = []
    for rel, digest in files.items():
        if is_device_built(rel):  # verified by the engine record when a backend uses it
            continue
        f = root / rel
        if not f.is_file():
            bad.append(f"{rel}: missing")
        elif sha256_file(f) != digest:
            bad.append(f"{rel}: sha256 differs")
    return bad


def _unlisted(root: Path, member_dir: Path, files: Mapping[str, str]) -> list[str]:
    """The files a member's loader reads where they are there (:data:`OPTIONAL_MEMBER_FILES`:
    e.g. ``preprocessor_config.json``'s image mean and std) that its folder holds but the
    manifest does not list: read at load, no sha256 would check them and the bundle id would
    not change (an export lists every file, so they were put in after it). Nothing for a
    reference bundle that lists no files."""
    try:
        rel = member_dir.relative_to(root).as_posix()
    except ValueError:  # a member folder outside the bundle (torch reference): nothing listed
        return []
    if not files:
        return []
    return [
        f"{rel}/{name}: not in the manifest"
        for name in OPTIONAL_MEMBER_FILES
        if f"{rel}/{name}" not in files and (member_dir / name).exists()
    ]


def _outside(root: Path, files: Mapping[str, str]) -> list[str]:
    """Listed files that lie outside the bundle once links are followed ("rel -> target")."""
    real = root.resolve()
    out = []
    for rel in files:
        target = (root / rel).resolve()
        if not target.is_relative_to(real):
            out.append(f"{rel} -> {target}")
    return out


#: the files every member's folder holds, and those of an exported member besides
_MEMBER_FILES = ("config.json", "tokenizer.json")
_EXPORTED_FILES = ("spotstop_onnx.yaml",)


def _member_path(
    root: Path, entry: Mapping[str, Any], where: str, files: Mapping[str, str]
) -> Path:
    """The member's folder. A bundle that carries its members (it lists files) or a member
    exported for the runtime must hold it: ``members/NAME`` (as the export writes it), whose
    files the manifest lists, so that everything the member loads is verified and is the
    named member's. Only a reference bundle of Hugging Face folders (torch, nothing listed)
    names folders elsewhere."""
    raw = _req(entry, "path", where)
    if not isinstance(raw, str) or not raw:
        raise BundleError(
            f"{where}.path must be the member's folder as text (e.g. members/NAME); got "
            f"{raw!r}. The manifest is damaged: copy the bundle again, or export it again."
        )
    mp = Path(raw)
    if not files and str(entry.get("backend", "torch")) == "torch":
        return mp if mp.is_absolute() else root / mp
    rel = mp.as_posix().rstrip("/")
    need = _MEMBER_FILES + (() if entry.get("backend", "torch") == "torch" else _EXPORTED_FILES)
    unlisted = [f"{rel}/{n}" for n in need if f"{rel}/{n}" not in files]
    if mp.is_absolute() or ".." in mp.parts:
        why = "must be a folder inside the bundle (a relative path such as members/NAME)"
    elif unlisted:
        why = f"is not a member folder whose files the manifest lists ({', '.join(unlisted)})"
    elif rel != (own := f"members/{entry.get('name')}"):
        # the path is in neither the sha256 list nor the id: two members of one architecture
        # swapped would each score with the other's graphs under the same id and policy
        raise BundleError(
            f"{where}.path {raw!r} is not {own!r}, the folder the export writes for member "
            f"{entry.get('name')}: the member would score with another folder's files under "
            "its own name, fusion statistics and policy. The manifest was edited by hand; "
            "copy the bundle again, or export it again."
        )
    else:
        return root / mp
    raise BundleError(
        f"{where}.path {raw!r} {why}: the member would load files that no sha256 checks. "
        "The manifest was edited by hand; copy the bundle again, or export it again."
    )


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise BundleError(f"{where}.{key} is missing from manifest.yaml.")
    return d[key]


def load_bundle(path: str | os.PathLike[str], *, verify: bool = True) -> Bundle:
    """Read ``manifest.yaml``; with ``verify`` check every listed file's sha256."""
    root = Path(path)
    mpath = root / "manifest.yaml"
    if not mpath.is_file():
        raise BundleError(
            f"{root} is not a spotstop bundle (no manifest.yaml). Make one with "
            "`spotstop demo` (tiny test pair) or the export tools."
        )
    m = load_yaml(mpath.read_text(encoding="utf-8"), source=str(mpath), error=BundleError)
    if not isinstance(m, dict) or m.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{mpath} is not a spotstop bundle manifest (format != {BUNDLE_FORMAT}).")
    if m.get("version") != BUNDLE_VERSION:
        raise BundleError(
            f"manifest.yaml version {m.get('version')!r} is not supported; this spotstop reads "
            f"version {BUNDLE_VERSION}. Upgrade spotstop or re-export the bundle."
        )
    problem = _manifest_problem(m)
    if problem is not None:
        raise BundleError(f"{mpath}: {problem}; the manifest is damaged: copy or export it again.")
    files = _req(m, "files", "manifest")
    if verify:
        links = _outside(root, files)
        if links:
            raise BundleError(
                f"bundle {root} reaches outside itself through links ({len(links)} file(s)): "
                + "; ".join(links[:5])
                + ". The guard runs only what the bundle holds, checked at load: copy the "
                "bundle with its links resolved (`cp -rL`), or export it again."
            )
        bad = _mismatches(root, files)
        if bad:
            raise BundleError(
                f"bundle {root} does not match its manifest ({len(bad)} file(s)): "
                + "; ".join(bad[:5])
                + ". The bundle was altered or copied incompletely; copy it again."
            )
    p = _req(m, "prompt", "manifest")
    try:
        prompt = PromptSpec(**p)
    except (TypeError, ConfigError) as e:
        raise BundleError(f"manifest.prompt is invalid: {e}") from e
    members = []
    for i, entry in enumerate(_req(m, "members", "manifest")):
        where = f"manifest.members[{i}]"
        t = _req(entry, "template", where)
        members.append(
            BundleMember(
                name=str(_req(entry, "name", where)),
                path=_member_path(root, entry, where, files),
                model_type=str(_req(entry, "model_type", where)),
                backend=str(entry.get("backend", "torch")),
                image_size=parse_image_size(
                    _req(entry, "image_size", where), f"{where}.image_size"
                ),
                prompt_hash=str(_req(entry, "prompt_hash", where)),
                template=RenderedTemplate(
                    with_image=_req(t, "with_image", f"{where}.template"),
                    without_image=_req(t, "without_image", f"{where}.template"),
                ),
                revision=entry.get("revision"),
                visual_tokens=_opt_tokens(entry.get("visual_tokens"), f"{where}.visual_tokens"),
            )
        )
    if verify:
        extra = [f for mm in members for f in _unlisted(root, mm.path, files)]
        if extra:
            raise BundleError(
                f"bundle {root} holds member files its manifest does not list ({len(extra)}): "
                + "; ".join(extra[:5])
                + ". The member would read them at load and no sha256 checks them: they were "
                "put in after the export. Remove them, or export the bundle again."
            )
    ph = pair_prompt_hash({mm.name: mm.prompt_hash for mm in members})
    if ph != m.get("prompt_hash"):
        raise BundleError(
            f"manifest.prompt_hash {m.get('prompt_hash')!r} does not match its members' "
            f"prompt hashes ({ph}); the manifest was edited by hand."
        )
    bundle_id = str(_req(m, "bundle_id", "manifest"))
    if verify:  # the id names the content: a file's entry dropped or its sha256 replaced, or a
        # grid edited, shows here (the policy, fitted for the id, would otherwise still match)
        content = bundle_content_id(ph, files, m["members"])
        if not bundle_id.endswith(f"-{content}"):
            raise BundleError(
                f"manifest.bundle_id {bundle_id!r} does not name the bundle's content (its files' "
                f"sha256, prompt and image grids give {content!r}): the manifest was edited by "
                "hand (a file's entry dropped or its sha256 replaced, an image_size changed). "
                "Copy the bundle again, or export it again."
            )
    return Bundle(
        path=root,
        bundle_id=bundle_id,
        prompt_hash=ph,
        prompt=prompt,
        members=tuple(members),
        policy_path=root / str(m.get("policy", "policy.yaml")),
        test_pair=bool(m.get("test_pair", False)),
        manifest=m,
        verified=verify,
        test_pair_kinds=_test_pair_kinds(m["members"]),
    )


def _test_pair_kinds(entries: Sequence[Mapping[str, Any]]) -> tuple[str | None, ...]:
    """Each test member's ``test_pair_kind`` (None where not recorded), checked by name."""
    kinds: list[str | None] = []
    for i, entry in enumerate(entries):
        kind = entry.get("test_pair_kind")
        if kind is not None and kind not in TEST_PAIR_KINDS:
            raise BundleError(
                f"manifest.members[{i}].test_pair_kind must be one of {sorted(TEST_PAIR_KINDS)}; "
                f"got {kind!r}: the manifest was edited by hand. Export the bundle again."
            )
        if entry.get("test_pair") or kind is not None:
            kinds.append(kind)
    return tuple(kinds)
