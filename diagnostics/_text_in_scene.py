"""Text in the scene: the card section of seed 002 (Shift-Reliance Alignment).

Reads what ``spotstop reliance``, ``shift`` and ``select`` wrote into one folder (``--cues
DIR``; any subset of ``reliance.json``, ``shift.json``, ``select.json``) and, when the log
holds text flags written at decision time (``cue_flags``), the share of decisions flagged per
cue.  Reports: reliance per member and for the guard with intervals (and the placebo flag);
d̂ per cue with its interval and its detector's sensitivity and false-positive rate; the
predicted extra error of the guard (``Σ_cue reliance · misleading share``, from
``select.json`` when present, else from the point values of the two files, without an
interval), with the intercept's weighting and the selection check's W_s when select.json
has them; the OCR model's name and sha256; and what to do. A misleading share measured
without labelled frames rests on the assumption that text is independent of the label: the
section says so beside every such number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from spotstop.diagnostics._check_base import CardCheck, CardContext, CheckResult, fmt
from spotstop.diagnostics._data import group_codes
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import LogData
from spotstop.diagnostics._resample import share_estimate
from spotstop.diagnostics._results import Estimate

__all__ = ["CueFiles", "TextInSceneCheck", "log_cue_shares", "read_cue_files"]

CUES = ("reassuring", "alarming")
_FILES = ("reliance", "shift", "select")


@dataclass(frozen=True)
class CueFiles:
    """The parsed files of a ``--cues`` folder (None where a file is absent)."""

    folder: Path
    reliance: Mapping[str, Any] | None = None
    shift: Mapping[str, Any] | None = None
    select: Mapping[str, Any] | None = None

    @property
    def found(self) -> list[str]:
        """The files present, e.g. ``["reliance.json", "shift.json"]``."""
        return [f"{k}.json" for k in _FILES if getattr(self, k) is not None]


def _load(path: Path, required: tuple[str, ...]) -> Mapping[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc}); rewrite it with spotstop.") from exc
    missing = [k for k in required if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise DataError(
            f"{path}: missing key(s) {', '.join(missing)}; it is not a file written by "
            f"`spotstop {path.stem}`."
        )
    return doc


def read_cue_files(folder: str | Path) -> CueFiles:
    """Read ``reliance.json``, ``shift.json`` and ``select.json`` from ``folder`` (any subset;
    none at all is an error that names the files)."""
    d = Path(folder)
    files = CueFiles(
        folder=d,
        reliance=_load(d / "reliance.json", ("candidates",)),
        shift=_load(d / "shift.json", ("cues", "prevalence")),
        select=_load(d / "select.json", ("candidates",)),
    )
    if not files.found:
        raise DataError(
            f"--cues {str(d)!r} holds none of reliance.json, shift.json, select.json; pass the "
            "--out folder of `spotstop reliance`, `shift` or `select`."
        )
    return files


def log_cue_shares(log: LogData, *, n_boot: int, rng: np.random.Generator) -> dict[str, Any]:
    """Per cue flagged at decision time: the share of decisions with a reading that were
    flagged, and among labelled unsafe and safe ones (group-bootstrap intervals)."""
    flags = log.arrays.cue_flags
    out: dict[str, Any] = {}
    if not flags:
        return out
    group = group_codes(*log.group_ids())
    for cue, f in flags.items():
        read = f >= 0
        among = {"flagged": (read, " of read"), "flagged_unsafe": (read & (log.label == 1), " of unsafe"),
                 "flagged_safe": (read & (log.label == 0), " of safe")}  # fmt: skip
        out[cue] = {
            key: share_estimate(
                f == 1,
                mask,
                group,
                n_boot=n_boot,
                rng=rng,
                what=f"the {cue} flag share{who} decisions",
            )
            for key, (mask, who) in among.items()
        }
        out[cue]["n_read"] = int(read.sum())
    return out


@dataclass(frozen=True)
class TextInScene:
    """What the section found: parsed reliance, shift and predictions, log flags, advice."""

    files: CueFiles | None
    reliance: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    shift: Mapping[str, Mapping[str, Estimate]] = field(default_factory=dict)
    extra_error: Mapping[str, Any] = field(default_factory=dict)
    ocr: Mapping[str, Any] = field(default_factory=dict)
    log_flags: Mapping[str, Any] = field(default_factory=dict)
    advice: tuple[str, ...] = ()

    @property
    def guard_follows_reassuring(self) -> bool:
        """Some guard's reliance on reassuring text has an interval above 0."""
        return any(
            c["kind"] == "guard" and c["cues"]["reassuring"]["reliance"].ci.low > 0
            for c in self.reliance.values()
        )


def _reliance(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, c in doc["candidates"].items():
        cues = {
            cue: {
                "reliance": Estimate.from_dict(c[cue]["reliance"]),
                "placebo_moves": bool(c[cue].get("placebo_moves", False)),
            }
            for cue in CUES
            if cue in c
        }
        out[name] = {"kind": c.get("kind", "member"), "error": c.get("error", ""), "cues": cues}
    return out


def _shift(doc: Mapping[str, Any]) -> dict[str, dict[str, Estimate]]:
    keys = ("q", "sens", "fpr", "d_hat", "misleading_share")
    return {
        cue: {k: Estimate.from_dict(v[k]) for k in keys if k in v} for cue, v in doc["cues"].items()
    }


def _extra_error(files: CueFiles, rel: Mapping[str, Any], sh: Mapping[str, Any]) -> dict[str, Any]:
    """The guard's predicted extra error per cue and in total."""
    if files.select is not None:
        for c in files.select["candidates"]:
            if c.get("kind") == "guard":
                extra = {k: v for k, v in (c.get("extra_error") or {}).items()}
                return {
                    "candidate": c["name"],
                    "by_cue": extra,
                    "predicted_error": Estimate.from_dict(c["predicted_error"]),
                    "source_error": Estimate.from_dict(c["source_error"]),
                    # Eq. 1's intercept: the source error weighted to the deployment (what
                    # the predicted error adds the extra error to; select.json since v2)
                    "intercept": Estimate.from_dict(c["intercept"]) if "intercept" in c else None,
                    "source": "select.json",
                    # the first candidate is SRA's pick only where its prediction is a
                    # number: with every predicted error undefined the order is by name
                    "best": _ranked_first(files.select["candidates"]),
                }
    guards = [n for n, c in rel.items() if c["kind"] == "guard"]
    if guards and sh:
        g = rel[guards[0]]["cues"]
        extra = {
            cue: g[cue]["reliance"].value * sh[cue]["misleading_share"].value
            for cue in CUES
            if cue in g and cue in sh
        }
        return {
            "candidate": guards[0],
            "by_cue": extra,
            "source": "reliance.json × shift.json point values (no interval: run `spotstop "
            "select` for one)",
        }
    return {}


def _ranked_first(candidates: Sequence[Mapping[str, Any]]) -> str | None:
    """The candidate SRA ranks first, or None where it could not rank (the first candidate's
    predicted error, the lowest one, is undefined: then every one is)."""
    first = candidates[0] if candidates else None
    if first is None or "predicted_error" not in first:
        return None
    ok = math.isfinite(Estimate.from_dict(first["predicted_error"]).value)
    return str(first["name"]) if ok else None


def _basis(files: CueFiles | None) -> tuple[str | None, str | None]:
    """The misleading shares' basis and the assumption they rest on (None: from labels, or
    a file written before schema 2, which does not say)."""
    for doc in (None if files is None else files.select, None if files is None else files.shift):
        if doc is not None and "misleading_share_basis" in doc:
            return doc["misleading_share_basis"], doc.get("assumption")
    return None, None


def _check_rows(files: CueFiles | None) -> list[tuple[str, str]]:
    """The selection check of select.json: W_s per selector and family, and its warning."""
    chk = None if files is None or files.select is None else files.select.get("check")
    if not chk:
        return []
    rows = []
    for cue, fam in chk.get("families", {}).items():
        ws = ", ".join(f"{s} {v['w_s']:.3f}" for s, v in fam.get("selectors", {}).items())
        rows.append((f"selection check on {cue} text (worst mean regret W_s)", ws))
    if chk.get("warning"):
        rows.append(("selection check: warning", chk["warning"]))
    return rows


def _advice(ts: TextInScene) -> tuple[str, ...]:
    out = []
    best = ts.extra_error.get("best")
    unranked = ts.extra_error.get("source") == "select.json" and best is None
    for name, c in ts.reliance.items():
        if c["kind"] != "guard":
            continue
        r = c["cues"].get("reassuring", {}).get("reliance")
        if r is not None and r.ci.low > 0:
            if best and best != name:
                choose = f", or choose candidate {best} (SRA ranks it first)"
            elif unranked:
                choose = (
                    ". SRA could not rank the candidates (every predicted error is undefined; "
                    "see select.json), so it names none to choose instead"
                )
            else:
                choose = ""
            out.append(
                f"This guard ({name}) follows reassuring text: its error on unsafe scenes rises "
                f"by {fmt(r, pct=False, signed=True)} under a reassuring sign. Set the text "
                f"detector to fail closed on reassuring text{choose}."
            )
        a = c["cues"].get("alarming", {}).get("reliance")
        if a is not None and a.ci.low > 0:
            out.append(
                f"The guard ({name}) also stops on alarming text on safe scenes (reliance "
                f"{fmt(a, pct=False, signed=True)}): false alarms, not missed hazards."
            )
    d = ts.shift.get("reassuring", {}).get("d_hat")
    if d is not None and d.ci.low > 0:
        out.append(
            f"Reassuring text appears in {fmt(d)} % of deployment frames (corrected for the "
            "detector's errors)."
        )
    guards = [c for c in ts.reliance.values() if c["kind"] == "guard"]
    if not guards and ts.files is not None:
        # "nothing to do" would rest on a reliance that was never measured
        out.append(
            "Whether the guard follows scene text was not measured: "
            + ("reliance.json holds no guard" if ts.reliance else "--cues holds no reliance.json")
            + "; run `spotstop reliance --bundle BUNDLE` to measure the guard as deployed."
        )
    elif not out and ts.files is not None:
        out.append("No guard's reliance on scene text is resolved above zero: nothing to do.")
    return tuple(out)


class TextInSceneCheck(CardCheck):
    """Reliance, shift and prediction from ``--cues DIR``, and the log's text flags."""

    name: ClassVar[str] = "text_in_scene"
    title: ClassVar[str] = "Text in the scene"
    explanation: ClassVar[str] = (
        "How much the members and the guard follow reassuring or alarming text in the scene "
        "(matched edits, seed 002 Eq. 2), how often such text misleads in this deployment "
        "(d̂ corrected for the detector's sens/fpr, Sec. 3.4), and the extra error it predicts "
        "(Eq. 1); a guard that follows reassuring text → set the detector to fail closed or "
        "choose another candidate."
    )

    def run(self, ctx: CardContext) -> CheckResult:
        files = None if ctx.cues_dir is None else read_cue_files(ctx.cues_dir)
        rel = {} if files is None or files.reliance is None else _reliance(files.reliance)
        sh = {} if files is None or files.shift is None else _shift(files.shift)
        prov = {} if files is None or files.shift is None else files.shift.get("provenance", {})
        ocr = {
            "name": (prov.get("ocr_model") or {}).get("name"),
            "sha256": (prov.get("ocr_model") or {}).get("sha256"),
            "lexicon_sha256": prov.get("lexicon_sha256"),
        }
        flags = {} if ctx.log is None else log_cue_shares(ctx.log, n_boot=ctx.n_boot, rng=ctx.rng)
        extra = {} if files is None else _extra_error(files, rel, sh)
        ts = TextInScene(files, rel, sh, extra, ocr, flags)
        ts = TextInScene(files, rel, sh, extra, ocr, flags, _advice(ts))
        basis, assumption = _basis(files)
        weighting = None if files is None or files.select is None else files.select.get("weighting")
        data = {
            "misleading_share_basis": basis,
            "assumption": assumption,
            "weighting": weighting,
            "selection_check": None
            if files is None or files.select is None
            else files.select.get("check"),
            "files": None if files is None else files.found,
            "reliance": rel,
            "shift": sh,
            "prevalence_source": None
            if files is None or files.shift is None
            else files.shift.get("prevalence_source"),
            "predicted_extra_error": extra,
            "ocr_model": ocr,
            "log_flags": flags,
            "advice": list(ts.advice),
        }
        return CheckResult(data, _rows(ts, assumption, weighting, _check_rows(files)), result=ts)


def _rows(
    ts: TextInScene,
    assumption: str | None = None,
    weighting: Mapping[str, Any] | None = None,
    check: list[tuple[str, str]] | None = None,
) -> tuple[tuple[str, str], ...]:
    if ts.files is None and not ts.log_flags:
        return (
            (
                "not measured",
                "pass --cues DIR (the --out folder of `spotstop reliance`, `shift` or "
                "`select`), or log text flags at decision time",
            ),
        )
    rows: list[tuple[str, str]] = []
    for name, c in ts.reliance.items():
        for cue, r in c["cues"].items():
            flag = (
                " (placebo moves: the edit itself, not the text, moves it)"
                if r["placebo_moves"]
                else ""
            )
            rows.append(
                (
                    f"reliance of {name} ({c['kind']}, {c['error']} error) on {cue} text",
                    fmt(r["reliance"], pct=False, signed=True) + flag,
                )
            )
    mark = " (assumes text independent of the label †)" if assumption else ""
    for cue, s in ts.shift.items():
        rows.append(
            (
                f"{cue} text in the deployment: d̂",
                f"{fmt(s.get('d_hat'))} % (detector sens {fmt(s.get('sens'), pct=False)}, fpr "
                f"{fmt(s.get('fpr'), pct=False)}); misleading share "
                f"{fmt(s.get('misleading_share'))} %{mark}",
            )
        )
    if ts.extra_error:
        by = ts.extra_error["by_cue"]
        total = sum(v for v in by.values() if v is not None and math.isfinite(v))
        pe = ts.extra_error.get("predicted_error")
        icpt = ts.extra_error.get("intercept")
        pred = (
            ""
            if pe is None
            else f"; predicted error {fmt(pe, pct=False)} = "
            + (
                f"its source error weighted to this deployment {fmt(icpt, pct=False)} + the "
                "extra error"
                if icpt is not None
                else "its source error (weighted to this deployment) + the extra error"
            )
            + f" (unweighted source error {fmt(ts.extra_error['source_error'], pct=False)})"
        )
        rows.append(
            (
                f"predicted extra error of {ts.extra_error['candidate']}",
                ", ".join(f"{k} {v:+.3f}" for k, v in by.items() if v is not None)
                + f" (total {total:+.3f}){pred}; from {ts.extra_error['source']}"
                + (" †" if assumption else ""),
            )
        )
    if weighting and weighting.get("description"):
        rows.append(("predicted error: weighting", str(weighting["description"])))
    if assumption:
        rows.append(("† assumption", assumption))
    rows += check or []
    if ts.ocr.get("name"):
        rows.append(("OCR model", f"{ts.ocr['name']} (sha256 {ts.ocr['sha256']})"))
    for cue, f in ts.log_flags.items():
        rows.append(
            (
                f"{cue} flags logged at decision time",
                f"{fmt(f['flagged'])} % of {f['n_read']} read decisions; unsafe "
                f"{fmt(f['flagged_unsafe'])} %, safe {fmt(f['flagged_safe'])} %",
            )
        )
    rows += [("what to do", a) for a in ts.advice]
    return tuple(rows)
