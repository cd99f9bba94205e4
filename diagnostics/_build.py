"""From the command's inputs to a written card: the card's composition root.

:func:`card_from_inputs` reads one input (a decision log, a scores CSV, the packaged demo log
or the simulated log), the optional previous card and ``--cues`` folder, computes the card and
writes ``card.json``, ``card.md`` and ``card.html``.

The demo log (:func:`demo_log_path`, package data ``diagnostics/data/demo_log.sqlite`` with
``demo_log.json`` beside it) is a real decision log: the trained tiny TEST pair checked a
held-out toy world (``spotstop world``) through the guard, and every decision carries the
world's label. ``spotstop demo --write-card-log PATH`` writes it again from its seed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.diagnostics._card import Card, write_card
from spotstop.diagnostics._data import read_scores_csv
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import DirectCut, LogData, direct_cut_of, log_cases
from spotstop.diagnostics._simulate import simulate_log

__all__ = ["DEMO_LOG", "card_from_inputs", "demo_log_meta", "demo_log_path", "read_previous"]

#: the packaged demo log, relative to the ``spotstop.diagnostics`` package
DEMO_LOG = "data/demo_log.sqlite"

#: what the demo is, said wherever it is shown
DEMO_WHAT = (
    "the trained tiny TEST pair on a TOY WORLD (drawn shapes labelled by a rule table): the "
    "card shows the method on that world, never anything about real safety"
)

#: the simulated log of ``--simulated`` (the former ``--demo``)
SIMULATED = "simulate_log(600, size_leak=0.3)"


def demo_log_path() -> Path:
    """The packaged demo log (``spotstop card --demo``); raises :class:`DataError` when the
    install lacks it."""
    path = Path(str(resources.files("spotstop.diagnostics").joinpath(DEMO_LOG)))
    if not path.is_file() or not path.with_suffix(".json").is_file():
        raise DataError(
            f"the packaged demo log {str(path)!r} (or its demo_log.json) is missing from this "
            "install: reinstall spotstop, write one with `spotstop demo --write-card-log "
            "PATH` and pass PATH as LOG, or use --simulated."
        )
    return path


def demo_log_meta(path: Path | None = None) -> dict[str, Any]:
    """``demo_log.json`` of the demo log at ``path`` (default: the packaged one), checked
    against the log's sha256."""
    log = demo_log_path() if path is None else Path(path)
    meta_path = log.with_suffix(".json")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(
            f"cannot read the demo log's description {str(meta_path)!r}: {exc}"
        ) from exc
    sha = hashlib.sha256(log.read_bytes()).hexdigest()
    if not isinstance(meta, dict) or meta.get("sha256") != sha:
        raise DataError(
            f"the demo log {str(log)!r} does not match {meta_path.name} (sha256 {sha[:12]}…, "
            "recorded "
            f"{str(meta.get('sha256') if isinstance(meta, dict) else None)[:12]}…): it was "
            "altered. Write both again with `spotstop demo --write-card-log PATH`."
        )
    return meta


@contextmanager
def _readable_copy(path: Path) -> Iterator[Path]:
    """A copy of a log in a temporary folder: opening a log writes to it (WAL mode, schema
    check), and package data may be read-only and must stay as installed."""
    with tempfile.TemporaryDirectory(prefix="spotstop-demo-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        yield copy


def read_previous(path: str | Path) -> dict[str, Any]:
    """An earlier ``card.json`` (its bundle is checked against the new card's later)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"--previous {str(p)!r} is not a readable card.json: {exc}") from exc
    if not isinstance(doc, dict) or "fields" not in doc:
        raise DataError(f"--previous {str(p)!r} is not a card.json (it has no 'fields').")
    return doc


def card_from_inputs(
    *,
    log: str | Path | Sequence[str | Path] | None = None,
    scores: str | Path | None = None,
    demo: bool = False,
    simulated: bool = False,
    labels: str | Path | None = None,
    journal: str | Path | None = None,
    bundle_id: str | None = None,
    previous: str | Path | None = None,
    cues: str | Path | None = None,
    direct_cut: float | None = None,
    out: str | Path,
    n_boot: int = 10_000,
    seed: int = 0,
    progress: bool = False,
    **kwargs: Any,
) -> Card:
    """Read the input, compute the card, write its three files into ``out``.

    Exactly one of ``log``, ``scores``, ``demo`` and ``simulated``. ``demo``: the packaged
    demo log (:func:`demo_log_path`), read as a decision log (delivered rates, replay,
    conformal audit), its provenance saying it is the trained tiny TEST pair on a toy world.
    ``simulated``: a simulated table (``simulate_log(600, size_leak=0.3)``, no guard answers).
    ``journal``: the guard's journal of ``log`` when it is not the default one
    (:func:`spotstop.guard.read_reviewed`).  ``bundle_id``: the bundle whose decisions
    the card reads, required when the log holds several (their scores are on other scales;
    :func:`~spotstop.diagnostics._from_log.one_bundle`).  ``direct_cut`` overrides the cut of the paper's direct answer (default: the deployed
    constant cut of a log when there is one, else 0).  The checks and the delivered rates
    draw ``min(n_boot, 1000)`` times unless ``n_boot_checks`` says otherwise.  Further
    keyword arguments go to :func:`~spotstop.diagnostics.compute_card` (e.g. ``group_by``,
    the resampling unit of ``--group-by``: ``"situation"`` by default, or ``"contrast"``).
    """
    if (log is not None) + (scores is not None) + bool(demo) + bool(simulated) != 1:
        raise DataError("give exactly one input: LOG, --scores CSV, --demo or --simulated.")
    if bundle_id is not None and log is None:
        raise DataError("bundle_id (--bundle-id) goes with a decision LOG.")
    common: dict[str, Any] = {
        "labels": labels,
        "previous": previous,
        "cues": cues,
        "direct_cut": direct_cut,
        "out": out,
        "n_boot": n_boot,
        "seed": seed,
        "progress": progress,
        **kwargs,
    }
    if demo:
        packaged = demo_log_path()
        meta = demo_log_meta(packaged)
        with _readable_copy(packaged) as copy:
            return _card(log=copy, shown=packaged, demo_meta=meta, **common)
    return _card(
        log=log, scores=scores, simulated=simulated, journal=journal, bundle_id=bundle_id, **common
    )


def _card(
    *,
    log: str | Path | Sequence[str | Path] | None = None,
    shown: Path | None = None,
    demo_meta: dict[str, Any] | None = None,
    scores: str | Path | None = None,
    simulated: bool = False,
    journal: str | Path | None = None,
    bundle_id: str | None = None,
    labels: str | Path | None,
    previous: str | Path | None,
    cues: str | Path | None,
    direct_cut: float | None,
    out: str | Path,
    n_boot: int,
    seed: int,
    progress: bool,
    **kwargs: Any,
) -> Card:
    """:func:`card_from_inputs` for one input; ``shown``: the path to report for ``log`` (the
    packaged demo log, read from a copy), ``demo_meta``: its ``demo_log.json``."""
    rng = np.random.default_rng(seed)
    prev = None if previous is None else read_previous(previous)
    data: LogData | None = None
    extra: dict[str, Any] = {}
    if simulated:
        table = simulate_log(600, rng=rng, size_leak=0.3)
        source = f"simulated: {SIMULATED} (no guard, no deployed policy)"
        cut = DirectCut(0.0, "the direct answer", "the direct answer of the simulated score")
    elif log is not None:
        cases = log_cases(log, labels=labels, journal=journal, bundle_id=bundle_id)
        what = log if isinstance(log, str | Path) else ", ".join(str(x) for x in log)
        table, data, source = cases.table, cases.log, f"decision log: {what}"
        cut = direct_cut_of(cases.log, cases.keep)
        extra = {"log": cases.provenance, "bundle_ids": cases.provenance["bundle_ids"]}
        extra["fusion_keys"] = cases.provenance["fusion_keys"]
        if shown is not None:
            source = f"demo: the packaged decision log {shown}, {DEMO_WHAT}"
            extra["log"] = {**cases.provenance, "log": str(shown)}
            extra["demo"] = {"log": str(shown), "test_pair": True, "toy_world": True,
                             **(demo_meta or {})}  # fmt: skip
    else:
        assert scores is not None
        table, source = read_scores_csv(scores), str(scores)
        cut = DirectCut(
            0.0,
            "the direct answer",
            "the direct answer (s > 0 is UNSAFE for a member's raw score; for a fused score "
            "in a CSV, pass --cut)",
        )
    if direct_cut is not None:
        cut = DirectCut(float(direct_cut), "--cut", "given with --cut")
    kwargs.setdefault("n_boot_checks", min(1000, n_boot))
    return write_card(
        table,
        out,
        direct_cut=cut.value,
        direct_cut_source=cut.label,
        direct_cut_note=cut.note,
        log=data,
        cues_dir=cues,
        previous=prev,
        n_boot=n_boot,
        rng=rng,
        provenance={"source": source, "seed": seed, **extra},
        progress=progress,
        **kwargs,
    )
