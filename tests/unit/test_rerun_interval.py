"""The rerun interval (issue 25): where an equal-size rebuild's speedup lands, the interval a committed
number is judged by. A 95% CI of the mean holds an equal-size rebuild's estimate only ~89% of the time at
4 blocks (the rebuild's own noise); the rerun interval holds it 95% of the time."""

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from scipy import stats as st

from spec_decode.analysis import blocks, compare
from spec_decode.views import experiment, report

pytestmark = pytest.mark.unit


def test_the_rerun_interval_is_the_t_prediction_interval_sqrt_2_wider_than_the_ci():
    per_block = [1.50, 1.30, 1.62, 1.41]
    logs = [math.log(v) for v in per_block]
    g, lo, hi = blocks.log_t_interval(per_block)
    rlo, rhi = blocks.rerun_interval(per_block)
    half = st.t.ppf(0.975, 3) * statistics.stdev(logs) * math.sqrt(1 / 4 + 1 / 4)
    assert (rlo, rhi) == (pytest.approx(g * math.exp(-half)), pytest.approx(g * math.exp(half)))
    assert math.log(rhi / g) == pytest.approx(math.sqrt(2) * math.log(hi / g))
    assert all(math.isnan(x) for x in blocks.rerun_interval([1.5]))


@pytest.mark.parametrize("n", [4, 8])
def test_an_equal_size_rebuild_lands_in_the_rerun_interval_95_percent_of_the_time(n):
    """Simulated launches (log-normal speedups, 12% launch-to-launch sd as measured on this VM): a
    committed cell of n blocks, then a rebuild of n blocks. Fails if the interval is the CI (~89%)."""
    rng = random.Random(25)
    trials, in_rerun, in_ci = 4000, 0, 0
    for _ in range(trials):
        committed = [math.exp(rng.gauss(0.5, 0.12)) for _ in range(n)]
        rebuild = math.exp(statistics.fmean(rng.gauss(0.5, 0.12) for _ in range(n)))
        rlo, rhi = blocks.rerun_interval(committed)
        _, lo, hi = blocks.log_t_interval(committed)
        in_rerun += rlo <= rebuild <= rhi
        in_ci += lo <= rebuild <= hi
    assert 0.94 <= in_rerun / trials <= 0.96
    expected_ci = blocks.ci_holds_a_rebuild(n - 1)  # 0.89 at 4 blocks, 0.86 at 8: what compare prints
    assert abs(in_ci / trials - expected_ci) < 0.015 and expected_ci < 0.91


def entry(s, lo, hi, rerun=None):
    e = {
        "role": "spec",
        "status": "FINISHED",
        "accept_len": 2.0,
        "interval": "4 blocks (launch-level values, t with 3 df)",
    }
    e.update(speedup_vs_baseline=s, speedup_vs_baseline_ci95_lo=lo, speedup_vs_baseline_ci95_hi=hi)
    if rerun:
        e.update(speedup_vs_baseline_rerun95_lo=rerun[0], speedup_vs_baseline_rerun95_hi=rerun[1])
    return e


def test_compare_counts_coverage_against_the_committed_rerun_interval_and_says_the_ci_count_too():
    a = {
        "cells": {
            "s=2": entry(1.635, 1.529, 1.749, (1.487, 1.798)),  # embedded_steps_nccl's default 2 steps
            "s=3": entry(1.869, 1.689, 2.068, (1.620, 2.157)),
        }
    }
    b = {"jobs": {"s=2": entry(1.497, 1.404, 1.597), "s=3": entry(1.628, 1.55, 1.7)}}  # rebuild 1, rebuild 2
    rows = {r.cell: r for r in compare.compare(a, b)}
    assert [(rows[k].inside, rows[k].inside_ci) for k in ("s=2", "s=3")] == [(True, False), (True, False)]
    assert rows["s=2"].judged_by == "rerun interval" and "(rerun 1.487-1.798)" in rows["s=2"].a
    assert compare.coverage(list(rows.values())).startswith(
        "coverage: 2 of 2 speedups of B inside A's 95% rerun interval (where an equal-size rebuild lands "
        "with 95% at A's launch-to-launch noise; a machine start's own shift is not in it); 0 of 2 inside A's 95% CI, which holds an equal-size rebuild (its launch noise alone) ~89% of the time at 4 blocks"
    )
    b["jobs"]["s=2"] = entry(1.435, 1.35, 1.52)  # rebuild 2's cell: outside both
    assert not {r.cell: r for r in compare.compare(a, b)}["s=2"].inside


def test_the_projected_half_width_at_the_sweeps_own_size_is_the_fold_s_half_width():
    """halfwidth_pct is the folded cell's speedup_ci95_halfwidth_pct for the same per-block values: the
    plan's "(this sweep)" figure is the one the table shows, not another formula."""
    for per_block in ([1.50, 1.30, 1.62, 1.41], [1.678, 1.681, 1.675], [1.2, 1.25, 1.22, 1.19, 1.3, 1.21]):
        g, lo, hi = blocks.log_t_interval(per_block)
        sd = statistics.stdev(math.log(v) for v in per_block)
        assert blocks.halfwidth_pct(sd, len(per_block)) == pytest.approx(100 * (hi - lo) / 2 / g)


def test_a_plan_from_four_blocks_predicts_the_half_width_an_eight_block_sweep_gets():
    """Simulated sweeps (4 spec cells, log-normal launch speedups, 1.5% launch sd): the projection made
    from a 4-block sweep's spread, at 8 blocks, against the median half-width of real 8-block sweeps.
    Fails if the plan keeps 4 blocks' t, or forgets the sqrt(n)."""
    rng = random.Random(41)

    def sweep(n):
        return [[math.exp(rng.gauss(0.5, 0.015)) for _ in range(n)] for _ in range(4)]

    def sd_med(cells):
        return statistics.median(statistics.stdev(math.log(v) for v in c) for c in cells)

    planned = statistics.median(blocks.halfwidth_pct(sd_med(sweep(4)), 8) for _ in range(2000))
    actual = statistics.median(
        statistics.median(100 * (hi - lo) / 2 / g for g, lo, hi in map(blocks.log_t_interval, sweep(8)))
        for _ in range(2000)
    )
    assert planned == pytest.approx(actual, rel=0.08)
    assert blocks.halfwidth_pct(0.015, 8) < blocks.halfwidth_pct(0.015, 4) / 1.5  # 8 blocks: > 1.5x narrower


def test_the_committed_h100_block_sweep_prints_its_interval_plan():
    """The sweep summary of a committed 4-block experiment (its real metrics) carries the plan, and the plan's
    4-block figure is the measured median half-width (1.4%); a cheap-mode or 2-block sweep prints none."""
    root = Path(__file__).resolve().parents[2]
    metrics = json.loads((root / "experiments/embedded_h100x1_steps_nccl/metrics.json").read_text())
    text, _ = report.sweep_summary(experiment.records_from_metrics(metrics))
    plan = next(line for line in text.splitlines() if line.startswith("interval plan:"))
    measured = sorted(
        c["speedup_ci95_halfwidth_pct"] for c in metrics["cells"].values() if "speedup_ci95_halfwidth_pct" in c
    )
    assert f"~{statistics.median(measured):.1f}% at 4 (this sweep)" in plan and "at 8 blocks" in plan
    cells = blocks.cells(experiment.records_from_metrics(metrics))
    for c in cells:
        if c.speedup_vs_baseline is not None:
            c.speedup_vs_baseline.per_block = c.speedup_vs_baseline.per_block[:2]
    assert blocks.projection(cells) is None
