"""An experiment's summary.json: the headline numbers DVC tracks as its metric (``dvc metrics show`` /
``diff``, ``dvc exp show``), written by the report stage beside table.txt.

metrics.json is the full record of every job (thousands of keys: per-position acceptance, latency
percentiles, phases, per block ...); as DVC's metric it made ``dvc metrics show`` a table of ~11,600
columns and cost DVC seconds of CPU per command. summary.json keeps what the experiment's table shows
per cell -- the cells the report renders (``analysis.blocks.cells``: folded over blocks where the sweep
has them, else the jobs) -- from the same computed values: speedup with its 95% CI (and the rerun
interval of a block design), tok/s of the spec and of its baseline, accept length, the recommendation's
verdict on the cell; and per experiment the recommendation, the A/A control and how many spec cells have
a speedup CI above 1.0. Tens of keys per experiment.
"""

from __future__ import annotations

from spec_decode.analysis import blocks, control, recommend
from spec_decode.record.results import JobRecord

# a cell's record metric -> its summary key (the record's own names: a reader finds them in metrics.json)
CELL_METRICS = (
    "throughput_tok_s",
    "baseline_throughput_tok_s",
    "speedup_vs_baseline",
    "speedup_vs_baseline_ci95_lo",
    "speedup_vs_baseline_ci95_hi",
    "speedup_vs_baseline_rerun95_lo",  # block designs only (analysis.blocks)
    "speedup_vs_baseline_rerun95_hi",
    "accept_len",
)
PLACES = 4  # metrics.json's precision


def summary(recs: list[JobRecord]) -> dict:
    """The summary of a sweep's records (those ``records_from_metrics`` rebuilds from metrics.json)."""
    cells = blocks.cells(recs)
    rec = recommend.recommend(cells)
    verdicts = {v.cell: v for v in rec.verdicts} if rec is not None else {}
    out_cells: dict[str, dict] = {}
    for c in cells:
        entry: dict = {k: round(c.metrics[k], PLACES) for k in CELL_METRICS if k in c.metrics}
        if c.status != "FINISHED":
            entry["status"] = c.status
        if c.label in verdicts:
            entry["verdict"] = "competes" if verdicts[c.label].competes else "excluded"
        out_cells[c.label] = entry
    spec = [c for c in cells if c.speculative and "speedup_vs_baseline_ci95_lo" in c.metrics]
    out = {
        "cells": out_cells,
        "interval": blocks.interval_label(recs),
        "aa_control": control.check(cells).status,
        "spec_cells_with_ci": len(spec),
        "spec_cells_ci_above_1": sum(c.metrics["speedup_vs_baseline_ci95_lo"] > 1.0 for c in spec),
    }
    if rec is not None:
        out["recommendation"] = f"steps={rec.steps} ({rec.cell})" if rec.decision == "recommend" else rec.decision
    return out
