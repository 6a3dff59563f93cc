"""The step recommendation (spec_decode.analysis.recommend): noisy cells refused, a conservative score, "cannot
decide" when the data cannot, performance-only records never chosen. Records carry real runs and the
aggregates analysis.finish computes from them (stats.summarize)."""

import pytest

from spec_decode.analysis import recommend, stats
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner.client import RunRecord

pytestmark = pytest.mark.unit


def cell(
    steps: int, tput: list[float], nccl: str = "default", speedup: tuple | None = None, simulate: float | None = None
) -> JobRecord:
    runs = [
        RunRecord(
            launch=0,
            run=i,
            start_wall=float(i),
            end_wall=i + 1.0,
            wall_s=500 / v,
            prompt_tokens=10,
            completion_tokens=500,
        )
        for i, v in enumerate(tput)
    ]
    s = stats.summarize([r.throughput_tok_s for r in runs])
    m = {
        "throughput_tok_s": s.mean,
        **{f"throughput_tok_s_{k}": getattr(s, k) for k in ("cv", "robust_cv", "ci95_lo", "ci95_hi")},
    }
    if speedup:
        m.update(zip(("speedup_vs_baseline", "speedup_vs_baseline_ci95_lo", "speedup_vs_baseline_ci95_hi"), speedup))
    return JobRecord(
        role="spec",
        name=f"nccl={nccl},spec.steps={steps}",
        experiment="e",
        config={"nccl": {"name": nccl}, "spec": {"steps": steps, "simulate_accept_len": simulate}},
        config_hash="",
        engine=EngineInfo("embedded"),
        speculative=True,
        status="FINISHED",
        runs=runs,
        metrics=m,
        throughput_tok_s=s,
    )


def steady(mean: float) -> list[float]:
    return [mean * (1 + d) for d in (-0.01, -0.005, 0.0, 0.005, 0.01)]


NOISY = [450.0, 600.0, 750.0, 520.0, 680.0]  # mean 600, CV 20%, robust CV 19.8%; CI lower bound ~451


def test_a_planted_noisy_cell_is_refused_even_with_the_best_lower_bound():
    recs = [cell(1, steady(300)), cell(2, steady(350)), cell(3, NOISY)]
    noisy = recs[2]
    assert noisy.metrics["throughput_tok_s_ci95_lo"] > 440  # it would win on the score alone
    rec = recommend.recommend(recs)
    # never picked -- and its interval [451, 749] lies above steps=2's: steps=2 is no answer either (issue 44)
    assert (rec.decision, rec.steps, rec.score_name) == ("cannot decide", None, "throughput_tok_s")
    v = {x.steps: x for x in rec.verdicts}
    assert not v[3].stable and not v[3].competes
    assert v[3].reason == "noisy: robust CV 19.8% > 5% over 5 runs"
    assert v[2].reason == "stable: robust CV 0.7% <= 5% over 5 runs" and v[2].competes
    assert "2 of 3 cell(s) compete, and 1 noisy cell(s) could be better" in rec.reason, rec.reason
    assert "nccl=default,spec.steps=3: excluded, noisy: robust CV 19.8% > 5%" in recommend.describe(rec)


def test_one_outlier_run_does_not_make_a_cell_noisy_but_a_spread_does():
    one_burst = [400.0, 402.0, 398.0, 401.0, 300.0]  # a neighbour's burst hit one run: CV 11%
    assert stats.summarize(one_burst).cv > 0.10
    assert recommend.verdict(cell(2, one_burst)).stable
    assert not recommend.verdict(cell(2, NOISY)).stable
    assert recommend.verdict(cell(2, [400.0, 404.0])).reason == "noisy: unknown spread with 2 run(s) (< 3)"


def test_cannot_decide_when_best_and_runner_up_overlap():
    recs = [cell(2, steady(350)), cell(3, steady(353))]
    rec = recommend.recommend(recs)
    assert rec.decision == "cannot decide" and rec.cell is None
    assert rec.reason.startswith(
        "the best and another stable cell overlap: nccl=default,spec.steps=3 throughput_tok_s 95% CI ["
    )
    assert recommend.tag(rec).startswith("cannot decide: the best and another stable cell overlap")


def test_a_wide_ci_below_the_runner_up_still_overlaps_the_best():
    # Seen on embedded_depth: by lower bound steps=2 is second (1.607, upper 1.766 < best's 1.773), but
    # steps=3's wider CI [1.596, 1.885] reaches into the best's: the data cannot tell 3 and 5 apart.
    recs = [
        cell(2, steady(350), speedup=(1.684, 1.607, 1.766)),
        cell(3, steady(352), speedup=(1.735, 1.596, 1.885)),
        cell(5, steady(355), speedup=(1.873, 1.773, 1.978)),
    ]
    rec = recommend.recommend(recs)
    assert rec.decision == "cannot decide" and rec.cell is None
    assert "nccl=default,spec.steps=3 [1.596, 1.885]" in rec.reason
    recs[1] = cell(3, steady(352), speedup=(1.735, 1.596, 1.760))
    rec = recommend.recommend(recs)
    assert (rec.decision, rec.steps) == ("recommend", 5)
    assert "above every other competing cell's (highest upper bound: nccl=default,spec.steps=2 1.766)" in rec.reason


def test_cannot_decide_without_a_stable_cell():
    rec = recommend.recommend([cell(1, NOISY), cell(2, [500.0, 700.0, 600.0, 450.0, 750.0])])
    assert rec.decision == "cannot decide"
    assert rec.reason == "no stable cell: 2 of 2 noisy (> 5%); rerun with more runs or on a quieter machine"


def test_speedup_lower_bound_is_the_score_when_every_cell_has_one():
    # tok/s ranks steps=3 first, the paired speedup's lower bound ranks steps=2 first: the score decides
    recs = [cell(2, steady(350), speedup=(1.60, 1.55, 1.65)), cell(3, steady(360), speedup=(1.45, 1.40, 1.50))]
    rec = recommend.recommend(recs)
    assert (rec.decision, rec.steps, rec.score_name) == ("recommend", 2, "speedup_vs_baseline")
    assert [v.score for v in rec.verdicts] == [1.55, 1.40]


def test_performance_only_records_are_labelled_and_never_recommended():
    forced = cell(5, steady(900), simulate=4.0)  # the fastest, and stable: forced acceptance
    rec = recommend.recommend([cell(1, steady(300)), cell(2, steady(400)), forced])
    assert rec.steps == 2
    v = {x.steps: x for x in rec.verdicts}
    assert v[5].performance_only and not v[5].competes and v[5].stable
    assert v[5].reason.startswith("performance-only (forced acceptance): not a drafter choice; stable:")
    only = recommend.recommend([forced])
    assert only.decision == "cannot decide" and "1 performance-only" in only.reason
