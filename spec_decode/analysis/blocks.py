"""Cells over blocks (issue 25): an interval that covers what changes between launches and over a sweep.

A job's own interval (``stats.paired_ratio`` over its 5 pairs) describes the spread of runs inside one
server launch, a minute or so of the sweep. What moves a rerun -- the machine's speed drifting over
minutes on a shared host, the contention level (which biases the speedup itself, docs/paired-baseline.md),
a new server launch -- is not in it. The block design puts it in:

- ``benchmark.block`` is a label with no effect on what a job does. A reported experiment lists it as
  the *first* sweep axis, ``benchmark.block: range(0,${benchmark.blocks})`` (command-line sweep axes
  come after the config's, so Hydra's basic launcher varies the first config axis slowest): with
  ``benchmark.blocks=4`` the whole sweep runs once per block, each cell's launches are spread over the
  whole sweep and slow drift hits every cell alike. Each block of a cell is one job: its own server launch, its paired baseline
  beside it (the baseline measurement of the block, serving the spec cell).
- ``cells(records)`` folds the blocks of each cell into one record: the speedup is the geometric mean
  of the per-block paired speedups, with a Student-t 95% CI on their logs (n_blocks - 1 df); tok/s and
  every other number the views read are means over the blocks (tok/s with its t-CI over block means).
  The interval is therefore built from launch-level values: a launch-to-launch or drift effect is in it.
- Beside that confidence interval (where the cell's true speedup lies) each folded cell carries its
  **rerun interval** (``speedup_vs_baseline_rerun95_lo/hi``): where the speedup of an equal-size rebuild
  (the same number of blocks) lands with 95% probability, a prediction interval on the logs,
  ``t_(n-1) * sd * sqrt(1/n + 1/n)``, sqrt 2 wider than the CI. A rebuild's own estimate is noisy too,
  so a perfect 95% CI holds an equal-size rebuild only P(|t_(n-1)| < t_0.975 / sqrt 2) of the time
  (0.89 at 4 blocks); "inside the committed interval" is judged against the rerun interval
  (``analysis.compare``). Its sd is the launch-to-launch sd of one sweep, so it holds a rebuild that sees the
  same noise; a shift between machine starts is not in it (the GPU rebuilds so far and the cells they moved:
  docs/reproducibility.md, "What it does not hold").

Records without ``benchmark.block`` variation pass through unchanged (the cheap mode: one launch per
cell, the within-launch interval, labelled ``interval: runs within one launch`` in the summary).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import statistics
from typing import TYPE_CHECKING

from spec_decode.analysis.stats import robust_cv, summarize, t_cdf, t_ppf
from spec_decode.record.sections import Ratio, Speedup

if TYPE_CHECKING:  # the record type, for annotations only (record is the floor below analysis, which imports it)
    from spec_decode.record.results import JobRecord

BLOCK_KEY = "block"  # benchmark.block
WITHIN_LAUNCH = "runs within one launch (cheap mode: misses launch-to-launch and sweep drift)"


def block_of(rec: JobRecord) -> int | None:
    return (rec.config.get("benchmark") or {}).get(BLOCK_KEY)


def cell_key(rec: JobRecord) -> str:
    """The record's config without the block label (and the name/tracking that do not define a cell)."""
    conf = {k: v for k, v in rec.config.items() if k not in ("name", "tracking")}
    conf["benchmark"] = {k: v for k, v in (conf.get("benchmark") or {}).items() if k != BLOCK_KEY}
    return json.dumps([rec.role, conf], sort_keys=True, default=str)


def drop_block(label: str) -> str:
    """A job's override set without the block items (``benchmark.block=2``, ``benchmark.blocks=4``): the
    cell's name, the same in the cheap mode and the block design."""
    return ",".join(
        p
        for p in label.split(",")
        if not p.lstrip("+~").startswith((f"benchmark.{BLOCK_KEY}=", f"benchmark.{BLOCK_KEY}s="))
    )


def log_half(sd: float, n: int, confidence: float = 0.95) -> float:
    """The Student-t CI's half-width on the logs of n values whose logs spread with sd (df = n - 1)."""
    return t_ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)


def log_t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean of positive values and its Student-t CI on the logs (df = n - 1)."""
    logs = [math.log(v) for v in values]
    m = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(m), float("nan"), float("nan")
    half = log_half(statistics.stdev(logs), len(logs), confidence)
    return math.exp(m), math.exp(m - half), math.exp(m + half)


def rerun_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """Where the geometric mean of an equal-size rerun lands with probability ``confidence``: the
    Student-t prediction interval on the logs, sd * sqrt(1/n + 1/n), i.e. the CI's half-width x sqrt 2."""
    g, lo, hi = log_t_interval(values, confidence)
    half = math.sqrt(2) * math.log(hi / g) if len(values) >= 2 else float("nan")
    return g * math.exp(-half), g * math.exp(half)


def ci_holds_a_rebuild(df: int, confidence: float = 0.95) -> float:
    """How often an equal-size rebuild's estimate lands inside the reported CI of a cell with ``df``
    degrees of freedom, both with the same launch-level sd: P(|t_df| < t_crit / sqrt 2). The rebuild's
    own noise is what the CI leaves out (0.89 at 4 blocks, 0.86 at 8); the rerun interval puts it in."""
    crit = t_ppf(0.5 + confidence / 2, df)
    return float(2 * t_cdf(crit / math.sqrt(2), df) - 1)


def fold(blocks: list[JobRecord]) -> JobRecord:
    """One record for a cell measured in several blocks (see the module doc)."""
    blocks = sorted(blocks, key=lambda r: block_of(r) or 0)
    done = [r for r in blocks if r.status == "FINISHED" and "throughput_tok_s" in r.metrics]
    out = copy.copy(blocks[0])
    out.name = drop_block(blocks[0].name)
    out.config = {
        **blocks[0].config,
        "benchmark": {k: v for k, v in (blocks[0].config.get("benchmark") or {}).items() if k != BLOCK_KEY},
    }
    out.status = "FINISHED" if len(done) == len(blocks) else next(r.status for r in blocks if r not in done)
    out.error = (
        None
        if out.status == "FINISHED"
        else "; ".join(f"block {block_of(r)}: {r.error}" for r in blocks if r not in done)
    )
    out.extra = {
        **blocks[0].extra,
        "interval": f"{len(done)} blocks (launch-level values, t with {max(len(done) - 1, 0)} df)",
        "blocks": [block_of(r) for r in done],
    }
    if not done:
        out.metrics = {}
        return out
    keys = set.intersection(*(set(r.metrics) for r in done))
    m = {k: statistics.fmean(r.metrics[k] for r in done) for k in keys}
    tput = [r.metrics["throughput_tok_s"] for r in done]
    s = summarize(tput)
    out.throughput_tok_s = dataclasses.replace(s, robust_cv=robust_cv(tput), unit="block means")
    m.update(
        throughput_tok_s=s.mean,
        throughput_tok_s_std=s.std,
        throughput_tok_s_cv=s.cv,
        throughput_tok_s_robust_cv=robust_cv(tput),
        throughput_tok_s_ci95_lo=s.ci95_lo,
        throughput_tok_s_ci95_hi=s.ci95_hi,
        throughput_tok_s_median=s.median,
    )
    for k in [k for k in m if k.startswith("speedup")]:
        del m[k]
    ratios = [r.metrics["speedup_vs_baseline"] for r in done if "speedup_vs_baseline" in r.metrics]
    if len(ratios) == len(done):
        g, lo, hi = log_t_interval(ratios)
        rlo, rhi = rerun_interval(ratios)
        m.update(
            speedup_vs_baseline=g,
            speedup_vs_baseline_ci95_lo=lo,
            speedup_vs_baseline_ci95_hi=hi,
            speedup_ci95_halfwidth_pct=100 * (hi - lo) / 2 / g,
            speedup_vs_baseline_rerun95_lo=rlo,
            speedup_vs_baseline_rerun95_hi=rhi,
        )
        out.speedup_vs_baseline = Speedup.of(
            Ratio(g, lo, hi, float(len(ratios) - 1), not (lo <= 1.0 <= hi)),
            "blocks",
            per_block=ratios,
            rerun95=[rlo, rhi],
        )
    out.metrics = m
    out.checks = [c for r in done for c in r.checks if not c.ok] or done[0].checks
    return out


def has_blocks(recs: list[JobRecord]) -> bool:
    return len({block_of(r) for r in recs if block_of(r) is not None}) > 1


def cells(recs: list[JobRecord]) -> list[JobRecord]:
    """The sweep's cells: records folded over ``benchmark.block`` where it varies, else the records."""
    if not has_blocks(recs):
        return recs
    groups: dict[str, list[JobRecord]] = {}
    for r in recs:
        groups.setdefault(cell_key(r), []).append(r)
    return [fold(g) for g in groups.values()]


def interval_label(recs: list[JobRecord]) -> str:
    """What the sweep's intervals cover (the summary and the record say it)."""
    if not has_blocks(recs):
        return WITHIN_LAUNCH
    n = len({block_of(r) for r in recs})
    return f"{n} blocks spread over the sweep (launch-level values, t with {n - 1} df)"


PLAN_SIZES = (3, 4, 6, 8)  # the block counts the projection prints


def halfwidth_pct(sd: float, n: int, confidence: float = 0.95) -> float:
    """The speedup half-width (%) a cell of ``n`` blocks gets when its per-block log speedups spread with
    standard deviation ``sd``: ``sinh(log_half)`` (the geometric CI's half-width over its centre, as
    ``speedup_ci95_halfwidth_pct``)."""
    return 100 * math.sinh(log_half(sd, n, confidence))


def projection(cells: list[JobRecord], sizes: tuple[int, ...] = PLAN_SIZES) -> str | None:
    """What more (or fewer) blocks would buy: the median half-width at each of ``sizes`` blocks, from the
    median launch-to-launch spread of this sweep's spec cells (the sd of each cell's per-block log
    speedups). A plan, not a promise: an sd from 3-4 launches is itself rough, and a machine start with a
    slow period widens every interval (docs/reproducibility.md). None below 3 blocks a cell."""
    per = [c.speedup_vs_baseline.per_block for c in cells if c.speedup_vs_baseline is not None]
    per = [p for p in per if p and len(p) >= 3]
    if not per:
        return None
    sd = statistics.median(statistics.stdev(math.log(v) for v in p) for p in per)
    now = round(statistics.median(len(p) for p in per))
    at = ", ".join(
        f"~{halfwidth_pct(sd, n):.1f}% at {n}" + (" (this sweep)" if n == now else "") for n in sorted({*sizes, now})
    )
    return (
        f"interval plan: at this sweep's launch-to-launch spread (median sd of a spec cell's log per-block "
        f"speedups {sd:.4f}, from {now} launches a cell: itself a rough estimate) the median speedup "
        f"half-width would be {at} blocks (benchmark.blocks)"
    )
