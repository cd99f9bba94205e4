"""From the command's inputs to a written card: the card's composition root.

:func:`card_from_inputs` reads one input (a decision log, a scores CSV or the demo),
computes the card and writes ``card.json``, ``card.md`` and ``card.html``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from spotstop.diagnostics._card import Card, write_card
from spotstop.diagnostics._data import read_scores_csv
from spotstop.diagnostics._errors import DataError
from spotstop.diagnostics._from_log import log_cases
from spotstop.diagnostics._simulate import simulate_log

__all__ = ["card_from_inputs"]


def card_from_inputs(
    *,
    log: str | Path | None = None,
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
) -> Card:
    """Read the input, compute the card, write its three files into ``out``."""
    if previous is not None or cues is not None:
        raise DataError("--previous and --cues are not available in this build yet.")
    rng = np.random.default_rng(seed)
    cut = 0.0 if direct_cut is None else float(direct_cut)
    extra: dict[str, Any] = {}
    if demo:
        table = simulate_log(600, rng=rng, size_leak=0.3)
        source = "demo: simulate_log(600, size_leak=0.3)"
    elif log is not None:
        cases = log_cases(log, labels=labels)
        table, source = cases.table, f"decision log: {log}"
        extra["log"] = cases.provenance
    else:
        assert scores is not None
        table, source = read_scores_csv(scores), str(scores)
    return write_card(
        table,
        out,
        policy_cut=cut,
        n_boot=n_boot,
        rng=rng,
        provenance={"source": source, "seed": seed, "policy_cut": cut, **extra},
        progress=progress,
    )
