"""``policy.yaml``: the fusion, the threshold policy, its fitted starting state, provenance.

Format (``version: 2``)::

    version: 2
    bundle_id: tiny-demo-1a2b3c4d      # the bundle and prompt it was fitted for
    prompt_hash: 9f8e7d6c5b4a
    created: '2026-11-30T12:00:00+00:00'
    fusion: {method: avg2, members: [...], stats: {m: {median, iqr}}, weights: {m: w}}
    policy: {kind: situation, window: 8, min_refs: 3, fallback: {kind: frozen, threshold: 0.1}}
    state_seed: {situations: {kitchen-1: [0.3, -0.2]}}   # optional; stateful kinds only
    text_in_scene: {detect: true, reassuring: fail_closed, alarming: log}   # optional
    fitted_on: {...}                                    # provenance, free-form

A file spotstop writes (:func:`policy_text`) is sealed: its first line says so and its last
line is ``# sha256: <hex>`` of every line above it. A sealed file that does not end in its
seal is refused: it was cut short (read while a writer that does not replace files atomically
was still writing it: e.g. ``cp`` over it, an editor saving in place) or edited by hand. A cut
YAML file can parse: a file cut inside ``fitted_on`` (its last, free-form key) loaded as
another policy version, with fresh situation windows, under a version id no file holds (a
hand-written file with its keys in another order could lose more). A file without the first
line (written by hand) is read as it is; delete both lines of a sealed file to edit it by hand.

Loading validates every key and names it in the message; a policy never opens a live state
file (the guard owns live state, starting from ``state_seed``). A policy is identified in the
decision log by :attr:`PolicyConfig.version_id` and its fusion by :attr:`PolicyConfig.fusion_key`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from spotstop.guard._errors import ConfigError
from spotstop.guard._files import atomic_write_text
from spotstop.guard._fusion import Avg2Fusion, FusionError, _fusion_from_dict
from spotstop.guard._log_schema import PolicyRow
from spotstop.guard.policies._base import (
    LoadContext,
    Policy,
    PolicyError,
    PolicyMismatchError,
)
from spotstop.guard.policies._decide import Decided, batch_inputs, decide_batch
from spotstop.guard.policies._registry import policy_from_dict
from spotstop.guard.validate import (
    check_keys,
    check_mapping,
    dump_yaml,
    is_int,
    is_real,
    join_key,
    load_yaml,
)

__all__ = [
    "POLICY_SCHEMA_VERSION",
    "PolicyConfig",
    "TextInScene",
    "check_policy_matches",
    "dump_policy",
    "fusion_key",
    "load_policy",
    "policy_text",
]

POLICY_SCHEMA_VERSION = 2
"""The ``version`` that ``policy.yaml`` files must carry."""

#: how a sealed policy file begins (the first line :func:`policy_text` writes)
_SEALED = "# spotstop policy file, sealed"
_SEAL_FIRST_LINE = (
    f"{_SEALED}: its last line is the sha256 of the lines above it. "
    "To edit it by hand, delete this line and the last one.\n"
)
_SEAL_LINE = re.compile(r"# sha256: ([0-9a-f]{64})\n?")

_TOP_REQUIRED = ("version", "bundle_id", "prompt_hash", "created", "fusion", "policy", "fitted_on")
_TOP_OPTIONAL = ("state_seed", "text_in_scene")
_CUE_ACTIONS = ("log", "fail_closed")


@dataclass(frozen=True)
class TextInScene:
    """``text_in_scene:`` — read the scene's text at decision time (seed 002; off by default).

    detect: run the text detector (OCR + claim lexicon, ``spotstop[cues]``) on every scene and
        log its flags with the decision. A flag never makes a decision SAFE.
    reassuring / alarming: what a flag of that cue does: ``log`` (record it; default) or
        ``fail_closed`` (the decision is a fail-closed UNSAFE naming the text). Deployments
        where a printed "ALL CLEAR" must never be trusted set ``reassuring: fail_closed``.
    lexicon: a claim-lexicon YAML (relative paths are read from the policy file's folder);
        None: the packaged lexicon.
    reader: the claim reader by name (:func:`spotstop.guard.cues.claim_reader`): None or
        ``lexicon`` (the lexicon), or ``member:<name>`` (a text-only pass of the bundle's
        member ``<name>`` over the text read; a folder path names another member).
    """

    detect: bool = False
    reassuring: str = "log"
    alarming: str = "log"
    lexicon: str | None = None
    reader: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "detect": self.detect,
            "reassuring": self.reassuring,
            "alarming": self.alarming,
        }
        if self.lexicon is not None:
            d["lexicon"] = self.lexicon
        if self.reader is not None:
            d["reader"] = self.reader
        return d

    def action(self, cue: str) -> str:
        """``log`` or ``fail_closed`` for a flag of ``cue``."""
        return str(getattr(self, cue, "log"))


def _text_in_scene(d: Any, src: str) -> TextInScene:
    where = "text_in_scene"
    check_mapping(d, where=where, source=src, error=PolicyError)
    check_keys(
        d,
        where=where,
        required=("detect",),
        optional=("reassuring", "alarming", "lexicon", "reader"),
        source=src,
        error=PolicyError,
    )
    if not isinstance(d["detect"], bool):
        raise PolicyError(
            f"{where}.detect must be true or false; got {d['detect']!r}. Set it in {src}."
        )
    ctx = LoadContext(source=src, where=where, members=(), parse_fallback=_no_fallback)
    lexicon = d.get("lexicon")
    if lexicon is not None and (not isinstance(lexicon, str) or not lexicon.strip()):
        raise PolicyError(
            f"{where}.lexicon must be a path to a lexicon YAML or absent; got {lexicon!r}. "
            f"Set it in {src}."
        )
    reader = d.get("reader")
    if reader is not None:
        from spotstop.guard.cues import parse_reader_name

        try:
            parse_reader_name(reader, where=f"{where}.reader")
        except ConfigError as e:
            raise PolicyError(f"{e} Set it in {src}.") from None
    return TextInScene(
        detect=d["detect"],
        reassuring=ctx.choice(d, "reassuring", _CUE_ACTIONS, "log"),
        alarming=ctx.choice(d, "alarming", _CUE_ACTIONS, "log"),
        lexicon=lexicon,
        reader=reader,
    )


def _canonical(x: Any) -> bytes:
    return json.dumps(
        x, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    ).encode()


def fusion_key(fusion: Avg2Fusion) -> str:
    """A fingerprint of the fusion statistics (16 hex digits of a sha256 of its YAML section)."""
    return hashlib.sha256(_canonical(fusion.to_dict())).hexdigest()[:16]


@dataclass(frozen=True)
class PolicyConfig:
    """The contents of ``policy.yaml``.

    bundle_id / prompt_hash: the bundle and prompt the policy was fitted for (see
        :func:`check_policy_matches`). fusion: the Avg-2 fusion (reference statistics, weights).
    policy: the threshold policy. fitted_on: provenance (free-form; ``version`` holds the
        version number when it was stored with ``calibrate``). created: when, timezone-aware.
    state_seed: the fitted starting state of a stateful policy (None: start empty).
    text_in_scene: decision-time text detection (:class:`TextInScene`; off by default).
    base_dir: the folder the file was read from (relative paths in it are read from there;
        None for a dict). Not part of the file.
    """

    bundle_id: str
    prompt_hash: str
    fusion: Avg2Fusion
    policy: Policy
    fitted_on: Mapping[str, Any]
    created: datetime
    state_seed: Any = None
    text_in_scene: TextInScene = field(default_factory=TextInScene)
    version: int = field(default=POLICY_SCHEMA_VERSION)
    base_dir: Path | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        bad = _non_finite(self.fitted_on, "fitted_on")
        if bad is not None:  # the log keeps the policy as JSON, which has no NaN nor inf
            raise PolicyError(
                f"{bad[0]} is {bad[1]!r}; a policy's provenance must hold finite numbers (the "
                "log keeps it as JSON). Give None for an undefined value."
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in the order of ``policy.yaml``."""
        d: dict[str, Any] = {
            "version": self.version,
            "bundle_id": self.bundle_id,
            "prompt_hash": self.prompt_hash,
            "created": self.created.isoformat(),
            "fusion": self.fusion.to_dict(),
            "policy": self.policy.to_dict(),
        }
        if self.state_seed is not None:
            d["state_seed"] = self.policy.seed_to_dict(self.state_seed)
        if self.text_in_scene != TextInScene():
            d["text_in_scene"] = self.text_in_scene.to_dict()
        d["fitted_on"] = _plain(self.fitted_on)
        return d

    @cached_property
    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON of :meth:`to_dict`: the policy's identity.

        Computed once per object (the config is frozen), so the guard can stamp every
        decision with it at no cost."""
        return hashlib.sha256(_canonical(self.to_dict())).hexdigest()

    @cached_property
    def version_id(self) -> str:
        """``"v0002+3f9a1c2b"``: the stored version number (``adhoc`` when none) + digest prefix."""
        n = self.fitted_on.get("version")
        name = f"v{n:04d}" if is_int(n) else "adhoc"
        return f"{name}+{self.digest[:8]}"

    @cached_property
    def fusion_key(self) -> str:
        """Fingerprint of the fusion statistics, see :func:`fusion_key`."""
        return fusion_key(self.fusion)

    @property
    def kind(self) -> str:
        """The configured policy kind."""
        return self.policy.kind

    def initial_state(self) -> Any:
        """The policy's state before its first batch: from ``state_seed``, or empty."""
        return self.policy.initial_state(self.state_seed) if self.policy.stateful else None

    def log_row(self) -> PolicyRow:
        """This policy as the decision log keeps it (its ``policies`` table)."""
        return PolicyRow(
            version_id=self.version_id,
            kind=self.kind,
            fusion_key=self.fusion_key,
            bundle_id=self.bundle_id,
            prompt_hash=self.prompt_hash,
            created=self.created.isoformat(),
            document=self.to_dict(),
        )

    def variants_needed(self) -> tuple[str, ...]:
        """Scoring passes besides the scene that this policy reads."""
        return self.policy.variants_needed()

    def decide(
        self,
        member_scores: Mapping[str, Any],
        situation_ids: Sequence[str | None] | None = None,
        *,
        state: Any = None,
        members_text: Mapping[str, Any] | None = None,
    ) -> Decided:
        """Fuse a batch with this file's fusion and label it with its policy (one batch)."""
        x = batch_inputs(self.fusion, member_scores, situation_ids, members_text)
        return decide_batch(self.policy, x, state)

    def __repr__(self) -> str:
        return (
            f"PolicyConfig({self.version_id}, kind={self.kind}, bundle={self.bundle_id}, "
            f"fusion_key={self.fusion_key})"
        )


def load_policy(
    source: str | os.PathLike[str] | Mapping[str, Any], *, where: str | None = None
) -> PolicyConfig:
    """Load and validate ``policy.yaml`` (a path) or its parsed dict.

    where: how to name the source in messages ("Set it in <where>"); defaults to the path,
    or ``"the policy dict"``. Every key is checked; a message names its key path
    (``policy.alpha``), what is allowed, what came, and where to fix it. Unknown keys are
    errors, with a suggestion. Raises :class:`PolicyError` (``FileNotFoundError`` for a
    missing file). Reads nothing but the file itself.
    """
    base_dir: Path | None = None
    if isinstance(source, Mapping):
        doc: Any = source
        src = where or "the policy dict"
    else:
        path = Path(source)
        base_dir = path.parent
        src = where or str(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise PolicyError(
                f"{src} is not UTF-8 text ({e}); a policy file is YAML in UTF-8."
            ) from e
        _check_seal(text, src)
        doc = load_yaml(text, source=src, error=PolicyError)  # a key twice refused

    check_mapping(doc, where="", source=src, error=PolicyError)
    check_keys(
        doc, where="", required=_TOP_REQUIRED, optional=_TOP_OPTIONAL, source=src, error=PolicyError
    )
    version = doc["version"]
    if not is_int(version) or version != POLICY_SCHEMA_VERSION:
        raise PolicyError(
            f"version must be {POLICY_SCHEMA_VERSION}; got {version!r}. This spotstop reads "
            f"policy files of version {POLICY_SCHEMA_VERSION}; refit {src} with `spotstop "
            "policy init` (unlabelled frames) or `spotstop recalibrate` (the decision log)."
        )
    for key in ("bundle_id", "prompt_hash"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise PolicyError(
                f"{key} must be a non-empty string; got {doc[key]!r}. Set it in {src} to the "
                "value in the bundle's manifest.yaml."
            )
    created = _check_created(doc["created"], src)
    try:
        fusion = _fusion_from_dict(doc["fusion"], where="fusion", source=src, error=PolicyError)
    except FusionError as e:  # from the constructor; the dict was validated before
        raise PolicyError(f"fusion: {e} Fix it in {src}.") from e
    fitted_on = doc["fitted_on"]
    check_mapping(fitted_on, where="fitted_on", source=src, error=PolicyError)
    bad = _non_finite(fitted_on, "fitted_on")
    if bad is not None:  # the log keeps the policy as JSON, which has no NaN nor inf
        raise PolicyError(
            f"{bad[0]} is {bad[1]!r}; the policy's provenance must hold finite numbers (the log "
            f"keeps it as JSON). Write null for an undefined value in {src}."
        )
    policy = policy_from_dict(doc["policy"], where="policy", source=src, members=fusion.members)
    seed = None
    if doc.get("state_seed") is not None:
        ctx = LoadContext(
            source=src, where="state_seed", members=fusion.members, parse_fallback=_no_fallback
        )
        seed = policy.seed_from_dict(doc["state_seed"], ctx)
    in_scene = TextInScene()
    if doc.get("text_in_scene") is not None:
        in_scene = _text_in_scene(doc["text_in_scene"], src)
    return PolicyConfig(
        bundle_id=doc["bundle_id"],
        prompt_hash=doc["prompt_hash"],
        fusion=fusion,
        policy=policy,
        fitted_on=dict(fitted_on),
        created=created,
        state_seed=seed,
        text_in_scene=in_scene,
        version=int(version),
        base_dir=base_dir,
    )


def _no_fallback(d: Any, where: str) -> Policy:
    raise PolicyError(f"{where}: a state seed holds no policy.")


def policy_text(cfg: PolicyConfig) -> str:
    """``cfg`` as a sealed policy file: a first line that says it is sealed, the YAML, and a
    last line ``# sha256: <hex>`` of everything above it (see the module doc)."""
    body = _SEAL_FIRST_LINE + dump_yaml(cfg.to_dict())
    return f"{body}# sha256: {hashlib.sha256(body.encode('utf-8')).hexdigest()}\n"


def _check_seal(text: str, src: str) -> None:
    """Refuse a sealed file that does not end in the seal of its lines (cut short, or edited)."""
    if not text.startswith(_SEALED):
        return  # written by hand: read as it is
    body, _, last = text.removesuffix("\n").rpartition("\n")
    m = _SEAL_LINE.fullmatch(last + "\n")
    body += "\n"
    if m is None:
        why = "its last line is not a seal (`# sha256: ` and 64 hex digits)"
    elif m.group(1) != hashlib.sha256(body.encode("utf-8")).hexdigest():
        why = "its seal is not the sha256 of the lines above it"
    else:
        return
    raise PolicyError(
        f"{src} is not the whole file spotstop wrote: its first line says it is sealed, but "
        f"{why}. Either it was read while being written (a copy or an editor that writes in "
        "place: load it again once the write is done; `spotstop policy activate` replaces it "
        "atomically), or it was edited by hand (to keep the edits, delete its first and last "
        "lines: the file is then read as written by hand)."
    )


def dump_policy(cfg: PolicyConfig, path: str | os.PathLike[str]) -> None:
    """Write ``cfg`` as a sealed policy file (:func:`policy_text`) to ``path`` atomically
    (temp file + ``os.replace``)."""
    atomic_write_text(Path(path), policy_text(cfg))


def check_policy_matches(cfg: PolicyConfig, bundle_id: str, prompt_hash: str) -> None:
    """Raise :class:`PolicyMismatchError` unless the policy was fitted for this bundle and prompt."""
    wrong = []
    if cfg.bundle_id != bundle_id:
        wrong.append(f"bundle_id {cfg.bundle_id!r} but the bundle is {bundle_id!r}")
    if cfg.prompt_hash != prompt_hash:
        wrong.append(f"prompt_hash {cfg.prompt_hash!r} but the bundle's prompt is {prompt_hash!r}")
    if wrong:
        raise PolicyMismatchError(
            "policy.yaml was fitted for another bundle or prompt: it has "
            + "; and ".join(wrong)
            + ". Its fusion statistics and threshold do not carry over; refit the policy "
            "for this bundle with `calibrate`, or load the bundle it was made for."
        )


def check_policy_fits(cfg: PolicyConfig, members: Sequence[str], base_dir: Path | None) -> None:
    """Raise :class:`PolicyMismatchError` unless the policy can decide on a bundle of these
    ``members``: its fusion and its policy name only them, its claim reader (``member:<name>``,
    when it reads the text in the scene) is one of them or a member folder, and its text
    lexicon exists (a relative path read from ``base_dir``, the folder of the ``policy.yaml``
    it is or will be).

    One check for ``policy activate`` and the guard's load: a policy that names a member the
    bundle lacks fails every scene closed, and would be found only by the robot."""
    have = set(members)
    wrong = []
    unknown = [m for m in cfg.fusion.members if m not in have]
    if unknown:
        wrong.append(f"its fusion names member(s) {unknown}")
    needed = [m for m in cfg.policy.members_needed() if m not in have]
    if needed:
        wrong.append(f"its policy needs member(s) {needed}")
    lex = cfg.text_in_scene.lexicon
    if lex is not None:
        path = Path(lex)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        if not path.is_file():
            wrong.append(f"its text_in_scene.lexicon {str(path)!r} does not exist")
    reader = cfg.text_in_scene.reader
    no_reader = None
    if cfg.text_in_scene.detect and reader is not None:
        from spotstop.guard.cues import parse_reader_name
        from spotstop.guard.cues._reader import reader_member_problem

        kind, arg = parse_reader_name(reader)
        no_reader = reader_member_problem(arg, members) if kind == "member" else None
        if no_reader is not None:
            wrong.append(f"its text_in_scene.reader: {no_reader.rstrip('.')}")
    if wrong:  # members it lacks: made for another bundle; a missing file: a bad policy file
        error = PolicyMismatchError if unknown or needed or no_reader else PolicyError
        raise error(
            f"policy {cfg.version_id} cannot decide on this bundle (members "
            f"{sorted(have)}): " + "; and ".join(wrong) + ". Every scene would fail closed. "
            "Fix the policy file (or refit it for this bundle) and try again."
        )


def _check_created(x: Any, source: str) -> datetime:
    value = x
    if isinstance(x, str):
        try:
            value = datetime.fromisoformat(x)
        except ValueError:
            value = None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise PolicyError(
            "created must be an ISO 8601 time with a UTC offset, e.g. "
            f"'2026-05-01T12:00:00+00:00'; got {x!r}. Set it in {source}."
        )
    return value


def _plain(x: Any) -> Any:
    """Mappings and sequences as plain dicts and lists, for :func:`dump_yaml`."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def _non_finite(x: Any, where: str) -> tuple[str, float] | None:
    """The key path and value of the first NaN or infinite number in ``x`` (mappings and
    lists walked), or None."""
    if is_real(x) and not math.isfinite(x):
        return where, float(x)
    if isinstance(x, Mapping):
        items: Iterable[tuple[str, Any]] = ((join_key(where, str(k)), v) for k, v in x.items())
    elif isinstance(x, list | tuple):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(x))
    else:
        return None
    for key, v in items:
        found = _non_finite(v, key)
        if found is not None:
            return found
    return None
