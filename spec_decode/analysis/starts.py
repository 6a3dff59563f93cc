"""One design measured on several machine starts: the shift a start adds, which one sweep's rerun interval
leaves out (issue 41; docs/reproducibility.md, "What it does not hold").

A block-design sweep's intervals are built from its own launches (``analysis.blocks``): they hold a rebuild
that sees the same launch-to-launch noise. A lent GPU comes back as a fresh machine start, perhaps another
machine, and a start can move a cell by more than its launches vary. Given k sweeps of one design, each from
its own start, per spec cell (the speedups' logs; each start's value is its blocks' geometric mean):

- **the starts' values** and the sd of their logs, ``s_b``;
- **a start effect or not**: one-way ANOVA of the block values with the start as the factor. F = the mean
  square between starts / the mean square within (launch to launch), df (k - 1, N - k); a start effect is
  *shown* when p < 0.05, else "not shown" (never "absent": 2-4 starts see only a large one). Needs the
  block values (a block-design sweep); a cheap-mode sweep has one launch a cell and no within term.
- **where the next start's cell lands** (95%, k >= 3): the prediction interval on the logs,
  ``mean +- t_(k-1) * s_b * sqrt(1 + 1/k)``. It treats each start's value as one draw, launch noise and start
  shift together, so it holds whatever a start moves; with k - 1 df it is wide (t_2 = 4.30) until more
  starts come.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict

from spec_decode.analysis.blocks import drop_block
from spec_decode.analysis.compare import _is_baseline, entries
from spec_decode.analysis.stats import t_ppf
from spec_decode.core.gc_imports import frozen_imports

MIN_STARTS_FOR_INTERVAL = 3
ALPHA = 0.05


@dataclasses.dataclass
class StartsRow:
    cell: str
    values: list[float | None]  # each start's speedup (None: the cell is not in that sweep)
    between_sd: float | None = None  # sd of the starts' log speedups
    within_sd: float | None = None  # pooled launch-to-launch sd of the block logs (None: no block values)
    f: float | None = None  # the one-way ANOVA's F (start as the factor)
    p: float | None = None
    df: tuple[int, int] | None = None
    interval: tuple[float, float] | None = None  # the next start's cell, 95%

    @property
    def effect(self) -> str:
        if self.p is None:
            return "no test (needs block values from 2+ starts)"
        return f"{'shown' if self.p < ALPHA else 'not shown'} (F={self.f:.1f}, df {self.df[0]},{self.df[1]}, p={fmt_p(self.p)})"


def fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 0.001 else "<0.001"


def f_sf(f: float, dfn: int, dfd: int) -> float:
    """P(F_(dfn, dfd) > f): scipy.special.fdtrc, the function scipy.stats.f.sf calls."""
    with frozen_imports():
        from scipy import special
    return float(special.fdtrc(dfn, dfd, f))


def block_values(metrics: dict) -> dict[str, list[float]]:
    """Each spec cell's per-block speedups (a block-design sweep's jobs), keyed as ``compare.entries``
    keys its cells; empty for a cheap-mode sweep (one launch a cell: no within-start term)."""
    if not metrics.get("cells"):
        return {}
    groups: dict[str, list[float]] = defaultdict(list)
    for name, job in metrics["jobs"].items():  # baselines too: entries() keys a cell by what varies among all
        got = job.get("speedup_vs_baseline")
        groups[drop_block(name)] += [] if _is_baseline(name, job) or got is None else [got]
    return {k: v for k, v in entries({"cells": dict(groups)}).items() if v}


def anova(groups: list[list[float]]) -> tuple[float, float, tuple[int, int], float] | None:
    """One-way ANOVA on the logs: (F, p, (df between, df within), pooled within sd); None without a
    within term (every group of one value) or with fewer than 2 groups."""
    logs = [[math.log(v) for v in g] for g in groups if g]
    k, n = len(logs), sum(map(len, logs))
    if k < 2 or n - k < 1:
        return None
    grand = statistics.fmean(x for g in logs for x in g)
    ss_b = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in logs)
    ss_w = sum((x - statistics.fmean(g)) ** 2 for g in logs for x in g)
    ms_b, ms_w = ss_b / (k - 1), ss_w / (n - k)
    if ms_w == 0:
        return (math.inf, 0.0, (k - 1, n - k), 0.0) if ms_b > 0 else None
    f = ms_b / ms_w
    return f, f_sf(f, k - 1, n - k), (k - 1, n - k), math.sqrt(ms_w)


def next_start(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Where the next start's value lands: the t prediction interval on the logs (k - 1 df)."""
    if len(values) < MIN_STARTS_FOR_INTERVAL:
        return None
    logs = [math.log(v) for v in values]
    m, sd, k = statistics.fmean(logs), statistics.stdev(logs), len(logs)
    half = t_ppf(0.5 + confidence / 2, k - 1) * sd * math.sqrt(1 + 1 / k)
    return math.exp(m - half), math.exp(m + half)


def starts(sweeps: list[dict]) -> list[StartsRow]:
    """One row per spec cell of the first sweep (every sweep a metrics.json of one design)."""
    cells = [entries(m) for m in sweeps]
    blocks = [block_values(m) for m in sweeps]
    rows = []
    for key, e in cells[0].items():
        if _is_baseline(key, e):
            continue
        vals = [(c.get(key) or {}).get("speedup_vs_baseline") for c in cells]
        row = StartsRow(key, vals)
        got = [v for v in vals if v is not None]
        if len(got) >= 2:
            row.between_sd = statistics.stdev(math.log(v) for v in got)
        row.interval = next_start(got)
        groups = [b.get(key, []) for b in blocks]
        if sum(bool(g) for g in groups) >= 2 and (a := anova(groups)) is not None:
            row.f, row.p, row.df, row.within_sd = a
        rows.append(row)
    return rows


def summary(rows: list[StartsRow], k: int) -> str:
    """One line: how many cells show a start effect, and what that means for the rerun interval."""
    tested = [r for r in rows if r.p is not None]
    shown = [r for r in tested if r.p < ALPHA]
    head = f"{k} starts, {len(rows)} spec cell(s): a start effect shown in {len(shown)} of {len(tested)} tested"
    if not tested:
        return head.split(":")[0] + ": no cell has block values from 2+ starts (no test)"
    if shown:
        return head + (
            " (p < 0.05): there a machine start moves the cell by more than its launches vary, and a rerun interval "
            "from one start (launch noise only) is too narrow for a rebuild on another start"
            + ("; the next-start interval holds both" if k >= MIN_STARTS_FOR_INTERVAL else "")
        )
    return head + " (not shown is not absent: a few starts see only a large effect)"
