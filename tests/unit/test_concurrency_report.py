"""Speedup against load in the reports (issue 28): the crossover concurrency with its interval, the
step count per concurrency, the cost model's batch-size line (or why it has none), the plot."""

import pytest

from spec_decode.analysis import concurrency
from spec_decode.analysis.batchcost import batch_model, describe_batch
from spec_decode.record.load import LoadSection, Running
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.record.sections import Latency, Speedup, Summary
from spec_decode.views.plots import write_plots
from spec_decode.views.report import sweep_summary

pytestmark = pytest.mark.unit


def rec(c: int, steps: int | None, metrics: dict, runs_cv: float = 0.01) -> JobRecord:
    spec = steps is not None
    name = ("" if spec else "baseline,") + f"benchmark.concurrency={c}" + (f",spec.steps={steps}" if spec else "")
    m = {"throughput_tok_s_cv": runs_cv, "throughput_tok_s_robust_cv": runs_cv, **metrics}
    m.setdefault("throughput_tok_s_ci95_lo", m["throughput_tok_s"] * 0.99)
    m.setdefault("throughput_tok_s_ci95_hi", m["throughput_tok_s"] * 1.01)
    return JobRecord(
        role="spec" if spec else "baseline",
        name=name,
        experiment="x",
        config={
            "benchmark": {"concurrency": c},
            "spec": {"steps": steps},
            "nccl": {"name": "default"},
            "hardware": {"name": "cpu"},
        },
        config_hash="",
        engine=EngineInfo("embedded"),
        speculative=spec,
        status="FINISHED",
        metrics=m,
    )


def speedup(c, steps, s, lo, hi):
    return rec(
        c,
        steps,
        {
            "throughput_tok_s": 100.0 * s,
            "speedup_vs_baseline": s,
            "speedup_vs_baseline_ci95_lo": lo,
            "speedup_vs_baseline_ci95_hi": hi,
            "accept_len": 2.0,
        },
    )


def test_crossover_is_read_on_a_log2_axis_with_its_interval_from_the_pointwise_bounds():
    pts = concurrency.curves(
        [speedup(1, 3, 1.8, 1.6, 2.0), speedup(16, 3, 0.8, 0.6, 0.95), speedup(4, 3, 1.2, 0.9, 1.5)]
    )
    (points,) = pts.values()
    assert [p["concurrency"] for p in points] == [1, 4, 16]
    x = concurrency.crossover(points)
    assert x["reached"] and x["concurrency"] == pytest.approx(8.0)  # halfway from 4 to 16 in log2
    assert x["lo"] == pytest.approx(2 ** (2 * 0.6 / 0.7))  # the lower bound leaves 1 between 1 and 4
    assert x["hi"] == pytest.approx(2 ** (2 + 2 * 0.5 / 0.55))  # the upper bound between 4 and 16
    assert concurrency.describe_crossover(x) == f"8.0, 95% interval [{x['lo']:.1f}, {x['hi']:.1f}]"


def test_crossover_not_reached_says_so_and_where_the_lower_bound_dips():
    x = concurrency.crossover(
        concurrency.curves([speedup(1, 1, 1.5, 1.4, 1.6), speedup(4, 1, 1.1, 0.95, 1.25)])[("default", 1)]
    )
    assert not x["reached"] and x["hi"] is None
    assert concurrency.describe_crossover(x).startswith(
        "not reached: speedup >= 1 up to concurrency 4 (the 95% lower bound falls below 1 from concurrency"
    )
    below = concurrency.crossover(concurrency.curves([speedup(2, 1, 0.9, 0.8, 0.97)])[("default", 1)])
    assert concurrency.describe_crossover(below).startswith("<= 2, 95% interval")


def test_a_curve_that_pays_again_at_a_higher_concurrency_says_where():
    """The H200 sweep's steps 1: below 1 at concurrency 1 and 2, above again at 32 (a baseline that stops
    scaling); "<= 1" alone would read as "never pays"."""
    pts = [speedup(1, 1, 0.82, 0.67, 0.999), speedup(8, 1, 0.96, 0.85, 1.07), speedup(32, 1, 1.44, 1.3, 1.59)]
    x = concurrency.crossover(concurrency.curves(pts)[("default", 1)])
    assert x["reached"] and x["recovers"] == 32
    assert concurrency.describe_crossover(x) == (
        "<= 1, 95% interval [1.0, 1.0]; above 1 again from concurrency 32 (95% lower bound > 1)"
    )
    falls = concurrency.crossover(concurrency.curves(pts[:2])[("default", 1)])
    assert falls["recovers"] is None and "again" not in concurrency.describe_crossover(falls)


def batch_sweep(spec_fixed: float, spec_per: float) -> list[JobRecord]:
    """Baseline step = 1 + 0.5 x batch ms; steps=3 (accept len 2.5) step = spec_fixed + spec_per x batch ms."""
    out = []
    for b in (1, 4, 16):
        out.append(rec(b, None, {"throughput_tok_s": 1e3 * b / (1 + 0.5 * b), "running_req_median": float(b)}))
        out.append(
            rec(
                b,
                3,
                {
                    "throughput_tok_s": 1e3 * b * 2.5 / (spec_fixed + spec_per * b),
                    "accept_len": 2.5,
                    "running_req_median": float(b),
                },
            )
        )
    return out


def test_cost_model_learns_the_batch_size_and_where_speculation_stops_paying():
    model = batch_model(batch_sweep(1.5, 1.5))
    assert model["learned"]
    base, spec = model["arms"]["baseline"], model["arms"]["steps=3"]
    assert (base["fixed_ms"], base["per_request_ms"]) == pytest.approx((1.0, 0.5))
    assert (spec["fixed_ms"], spec["per_request_ms"]) == pytest.approx((1.5, 1.5))
    # 2.5 x (1 + 0.5 b) > 1.5 + 1.5 b  <=>  b < 4
    assert model["crossover_batch"]["steps=3"] == "pays below batch 4.0"
    assert "pays at every batch" in describe_batch(batch_model(batch_sweep(2.0, 0.8)))


def test_cost_model_says_it_cannot_learn_the_batch_from_one_concurrency():
    model = batch_model([r for r in batch_sweep(1.5, 1.5) if r.config["benchmark"]["concurrency"] == 4])
    assert not model["learned"]
    assert describe_batch(model).startswith(
        "cost model vs batch size: cannot learn the batch size: it needs the "
        "baseline and a step count each measured at 2 or more running-batch sizes"
    )


def test_report_has_the_concurrency_table_and_plot(tmp_path):
    recs = [
        speedup(c, k, s, s - 0.1, s + 0.1)
        for c, k, s in ((1, 1, 1.5), (4, 1, 1.2), (16, 1, 0.9), (1, 3, 1.8), (4, 3, 1.3), (16, 3, 0.95))
    ]
    text, _ = sweep_summary(recs)
    assert "speedup vs baseline at the same concurrency (95% CI), by concurrency:" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("steps=1 "))
    assert "1.50 [1.40, 1.60]" in line and "0.90 [0.80, 1.00]" in line
    assert "recommended step count per concurrency" in text and "  c=16: " in text
    assert "cost model vs batch size: cannot learn the batch size" in text  # no running batch in these records
    assert (tmp_path / "speedup_vs_concurrency.png") in write_plots(recs, tmp_path)
    assert "speedup_vs_concurrency.png" not in [p.name for p in write_plots(recs[:1], tmp_path / "one")]


def load_section(**kw) -> LoadSection:
    """A load section with only what a test sets (record.load)."""
    none = dict(request_rate=None, request_tok_s=None, accept_len_per_request=None, running=None)
    return LoadSection(
        **{"concurrency": 1, "mode": "closed loop", "requests": 0, "runs": [], **none, **kw}, latency=Latency()
    )


def test_cost_model_learns_the_batch_from_paired_baselines_when_there_is_no_baseline_job():
    """The default strategy (paired) runs no baseline job: the baseline server beside each spec job, at the
    same concurrency, gives the baseline's points (its own running batch from the load section)."""
    spec = []
    for r in (x for x in batch_sweep(1.5, 1.5) if x.speculative):
        b = r.metrics["running_req_median"]
        r.metrics["baseline_throughput_tok_s"] = 1e3 * b / (1 + 0.5 * b)
        r.speedup_vs_baseline = Speedup(method="paired")
        r.load = load_section(paired_baseline=load_section(running=Running(1, b, 1, b, b, 1, 1.0, {})))
        spec.append(r)
    model = batch_model(spec)
    assert model["learned"]
    assert (model["arms"]["baseline"]["fixed_ms"], model["arms"]["baseline"]["per_request_ms"]) == pytest.approx(
        (1.0, 0.5)
    )
    assert model["crossover_batch"]["steps=3"] == "pays below batch 4.0"
    for r in spec:  # a separate baseline job's figure is not a paired point
        r.speedup_vs_baseline = Speedup(method="welch")
    assert not batch_model(spec)["learned"]


def test_the_readme_facts_give_the_speedups_per_concurrency_not_one_line_across_them():
    from spec_decode.views.experiment import facts
    from spec_decode.views.metrics_json import to_metrics

    recs = [speedup(c, k, s, s - 0.1, s + 0.1) for c, k, s in ((1, 1, 1.5), (16, 1, 0.9), (1, 3, 1.8), (16, 3, 0.95))]
    for i, r in enumerate(recs):
        r.out_dir = f"/sweep/{i}"
        m = r.metrics
        r.throughput_tok_s = Summary(
            mean=m["throughput_tok_s"], ci95_lo=m["throughput_tok_s_ci95_lo"], ci95_hi=m["throughput_tok_s_ci95_hi"]
        )
    lines = facts(to_metrics(recs))
    speedups = [x for x in lines if "speedup vs its baseline" in x]
    assert speedups == [
        "- `nccl=default` at concurrency 1 speedup vs its baseline (95% CI): 1.50x [1.40, 1.60] at 1, "
        "1.80x [1.70, 1.90] at 3 steps",
        "- `nccl=default` at concurrency 16 speedup vs its baseline (95% CI): 0.90x [0.80, 1.00] at 1, "
        "0.95x [0.85, 1.05] at 3 steps",
    ]
    one = facts(to_metrics([r for r in recs if r.config["benchmark"]["concurrency"] == 1]))
    assert (
        "- `nccl=default` speedup vs its baseline (95% CI): 1.50x [1.40, 1.60] at 1, 1.80x [1.70, 1.90] at 3 steps"
        in one
    )


def test_the_readme_facts_give_the_speedups_per_forced_accept_length():
    """A forced-acceptance sweep (spec.simulate_accept_len=2.0,3.5): one speedup / best-step line per
    accept length; a best step count across them would compare 2.0 with 3.5."""
    from spec_decode.views.experiment import facts
    from spec_decode.views.metrics_json import to_metrics

    recs = [speedup(1, k, s, s - 0.1, s + 0.1) for k, s in ((1, 1.5), (3, 1.3), (3, 2.4), (5, 2.2))]
    for i, (r, forced) in enumerate(zip(recs, (2.0, 2.0, 3.5, 3.5))):
        r.out_dir = f"/sweep/{i}"
        r.config["spec"]["simulate_accept_len"] = forced
        r.name = f"spec.simulate_accept_len={forced},spec.steps={r.steps}"
        m = r.metrics
        m["throughput_tok_s"] = 100 * m["speedup_vs_baseline"]
        r.throughput_tok_s = Summary(
            mean=m["throughput_tok_s"], ci95_lo=m["throughput_tok_s"] - 1, ci95_hi=m["throughput_tok_s"] + 1
        )
    lines = facts(to_metrics(recs))
    assert [x for x in lines if "speedup vs its baseline" in x] == [
        "- `nccl=default` at forced accept length 2.0 speedup vs its baseline (95% CI): 1.50x [1.40, 1.60] at 1, "
        "1.30x [1.20, 1.40] at 3 steps",
        "- `nccl=default` at forced accept length 3.5 speedup vs its baseline (95% CI): 2.40x [2.30, 2.50] at 3, "
        "2.20x [2.10, 2.30] at 5 steps",
    ]
    best = [x for x in lines if "best measured" in x]
    assert best[0].startswith("- `nccl=default` at forced accept length 2.0 best measured: 1 steps")
    assert best[1].startswith("- `nccl=default` at forced accept length 3.5 best measured: 3 steps")
