"""`python -m spec_decode.views.experiment starts SWEEP_1 SWEEP_2 [SWEEP_3 ...]`: one design's sweeps from
several machine starts as a table (the numbers: ``analysis.starts``; docs/reproducibility.md, "Several
starts")."""

from __future__ import annotations

from tabulate import tabulate

from spec_decode.analysis import starts as st


def _pct(sd: float | None) -> str:
    return "-" if sd is None else f"{100 * sd:.2f}%"


def table(sweeps: list[dict], names: list[str]) -> list[str]:
    """Per spec cell: each start's speedup, the sd between starts and within (launch to launch), the start
    effect's test and where the next start's cell lands; then which sweep is which start, what makes them not
    one design (if anything), and the summary line."""
    rows = st.starts(sweeps)
    k = len(sweeps)
    body = [
        [r.cell, *("-" if v is None else f"{v:.3f}" for v in r.values), _pct(r.between_sd)]
        + [_pct(r.test.within_sd if r.test else None), r.effect]
        + ["-" if r.interval is None else f"[{r.interval[0]:.3f}, {r.interval[1]:.3f}]"]
        for r in rows
    ]
    headers = ["cell", *(f"start {i + 1}" for i in range(k)), "sd between starts", "sd within (launches)"]
    headers += [
        "start effect (one-way ANOVA)",
        "next start, 95% (t, starts - 1 df)" if k >= 3 else "next start (3+ starts)",
    ]
    lines = tabulate(body, headers=headers, tablefmt="plain", disable_numparse=True).splitlines()
    keys = [f"start {i + 1}: {n}" for i, n in enumerate(names)]
    warn = [f"warning: {w}" for w in st.warnings(sweeps, names)]
    notes = [f"note: {n}" for n in st.notes(sweeps, names)]
    return [*lines, "", *keys, *warn, *notes, st.summary(rows, k)]
