"""From the command's inputs to a written card: the card's composition root.

:func:`card_from_inputs` reads one input (a decision log, a scores CSV or the demo), the
optional previous card and ``--cues`` folder, computes the card and writes ``card.json``,
``card.md`` and ``card.html``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from spotstop.diagnostics._card import Card, write_card
from spotstop.diagnostics._data import read_scores_csv
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import DirectCut, LogData, direct_cut_of, log_cases
from spotstop.diagnostics._simulate import simulate_log

__all__ = ["card_from_inputs", "read_previous"]


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
    labels: str | Path | None = None,
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

    Exactly one of ``log``, ``scores`` and ``demo``.  ``direct_cut`` overrides the cut of the
    paper's direct answer (default: the deployed constant cut of a log when there is one,
    else 0).  The checks and the delivered rates draw ``min(n_boot, 1000)`` times unless
    ``n_boot_checks`` says otherwise.  Further keyword arguments go to
    :func:`~spotstop.diagnostics.compute_card` (e.g. ``group_by``, the resampling unit of
    ``--group-by``: ``"situation"`` by default, or ``"contrast"``).
    """
    if (log is not None) + (scores is not None) + bool(demo) != 1:
        raise DataError("give exactly one input: LOG, --scores CSV or --demo.")
    rng = np.random.default_rng(seed)
    prev = None if previous is None else read_previous(previous)
    data: LogData | None = None
    extra: dict[str, Any] = {}
    if demo:
        table = simulate_log(600, rng=rng, size_leak=0.3)
        source = "demo: simulate_log(600, size_leak=0.3)"
        cut = DirectCut(0.0, "the direct answer", "the direct answer of the simulated score")
    elif log is not None:
        cases = log_cases(log, labels=labels)
        what = log if isinstance(log, str | Path) else ", ".join(str(x) for x in log)
        table, data, source = cases.table, cases.log, f"decision log: {what}"
        cut = direct_cut_of(cases.log, cases.keep)
        extra = {"log": cases.provenance, "bundle_ids": cases.provenance["bundle_ids"]}
        extra["fusion_keys"] = cases.provenance["fusion_keys"]
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
