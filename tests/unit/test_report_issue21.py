"""The report of issue 21's fields: acceptance per position and histogram, latency percentiles, the
per-category table, the lossless verdict column, the recommendation, performance-only labels; the same
from a reported experiment's metrics.json. The records are built as JSON with the contract's names
(shared/briefs s3 contract) and read like a results.json."""

import json

import matplotlib
import pytest

from spec_decode.views import metrics_json, plots, report

matplotlib.use("Agg")
pytestmark = pytest.mark.unit


def lat(p50: float) -> dict:
    return {"p50": p50, "p90": 1.5 * p50, "p99": 2 * p50, "mean": 1.1 * p50, "n": 1000}


def record(
    steps: int,
    tput: float,
    hist: list[int],
    verdict: str = "pass",
    simulate: float | None = None,
    runs: int = 5,
    spread: float = 0.01,
) -> dict:
    reach = [sum(hist[i:]) for i in range(len(hist))]
    rates = [reach[i] / reach[i - 1] for i in range(1, len(hist))]
    vals = [tput * (1 + spread * d) for d in (-1, -0.5, 0, 0.5, 1)][:runs]
    mean = sum(vals) / len(vals)
    metrics = {
        "throughput_tok_s": mean,
        "throughput_tok_s_ci95_lo": mean - 3,
        "throughput_tok_s_ci95_hi": mean + 3,
        "throughput_tok_s_cv": spread * 0.8,
        "throughput_tok_s_robust_cv": spread * 0.74,
        "accept_len": 1 + sum(a * n for a, n in enumerate(hist)) / sum(hist),
        "accept_len_request_weighted": 2.5,
        "accept_len_request_mean": 2.4,
        **{f"accept_rate_pos{i}": r for i, r in enumerate(rates, start=1)},
        "ttft_ms_p50": 12.0,
        "itl_ms_p50": 2.0,
        "lossless_match_rate": 1.0,
        "category_code_accept_len": 3.1,
        "category_code_throughput_tok_s": 410.0,
        "cycle_ms": 4.0 + steps,
        "draft_ms": 0.5 * steps,
        "verify_ms": 3.0 + 0.1 * steps,
        "extend_ms": 0.4,
        "other_ms": 0.1,
        "draft_pct": 10.0,
        "verify_pct": 70.0,
        "extend_pct": 15.0,
        "other_pct": 5.0,
    }
    return {
        "role": "spec",
        "name": f"nccl=default,spec.steps={steps}" + (",spec.simulate_accept_len=3" if simulate else ""),
        "experiment": "e",
        "config_hash": "h",
        "engine": {"name": "embedded"},
        "speculative": True,
        "status": "FINISHED",
        "started_at": float(steps) + (0.5 if simulate else 0),
        "config": {
            "nccl": {"name": "default"},
            "spec": {"steps": steps, "simulate_accept_len": simulate},
            "hardware": {"name": "cpu"},
        },
        "throughput_tok_s": {
            "mean": mean,
            "n": runs,
            "cv": spread * 0.8,
            "robust_cv": spread * 0.74,
            "ci95_lo": mean - 3,
            "ci95_hi": mean + 3,
            "std": 1.0,
        },
        "metrics": metrics,
        "acceptance": {
            "histogram": hist,
            "per_position": rates,
            "source": "profile",
            "accept_len_weighted": 2.5,
            "accept_len_unweighted": 2.4,
            "per_request": [],
        },
        # H2's sections, as the contract names them
        "latency": {"ttft_ms": lat(12.0), "itl_ms": lat(2.0), "tpot_ms": lat(2.1), "e2e_ms": lat(1000.0)},
        "categories": {
            "code": {"n": 4, "accept_len": 3.1, "throughput_tok_s": 410.0},
            "chat": {"n": 4, "accept_len": 2.2, "throughput_tok_s": 350.0},
        },
        "lossless": {
            "checked": verdict != "skipped",
            "requests": 8,
            "matched": 8 if verdict == "pass" else 7,
            "match_rate": 1.0 if verdict == "pass" else 0.875,
            "first_divergence": {},
            "verdict": verdict,
            "reason": "",
        },
        "requests": [],
    }


def sweep():
    from spec_decode.record.results import JobRecord

    return [
        JobRecord.from_dict(json.loads(json.dumps(d)))
        for d in (
            record(1, 300.0, [10, 90]),
            record(3, 420.0, [5, 15, 30, 50], verdict="fail"),
            record(5, 380.0, [5, 5, 10, 20, 20, 40], spread=0.2),
            record(3, 600.0, [0, 0, 0, 100], verdict="skipped", simulate=3.0),
        )
    ]


def test_summary_renders_every_issue21_table():
    text, table = report.sweep_summary(sweep())
    assert table["lossless"] == ["pass (100% match)", "fail (88% match)", "pass (100% match)", "skipped"]
    assert table["job"][3] == "nccl=default,spec.steps=3,spec.simulate_accept_len=3 [performance-only]"
    lines = text.splitlines()
    acc = next(i for i, line in enumerate(lines) if line.startswith("acceptance rate by draft position"))
    row = next(line for line in lines[acc:] if line.startswith("nccl=default,spec.steps=3 "))
    # positions 1..3 of [5, 15, 30, 50]: 95/100, 80/95, 50/80; the histogram and its source
    assert row.split()[1:4] == ["0.950", "0.842", "0.625"] and "5 15 30 50" in row and "profile" in row
    assert row.split()[4:6] == ["-", "-"]  # positions 4..5 do not exist at 3 steps
    lat_row = next(line for line in lines if line.startswith("nccl=default,spec.steps=1 ") and "12.00 / 18.00" in line)
    assert "12.00 / 18.00 / 24.00" in lat_row and "2.00 / 3.00 / 4.00" in lat_row and "1000.00 / 1500.00" in lat_row
    assert any(
        line.split()[1:5] == ["code", "4", "3.10", "410.0"]
        for line in lines
        if line.startswith("nccl=default,spec.steps=5")
    )
    # steps=3 is the fastest real cell, but its lossless check failed: steps=1 is the only one left, and the
    # noisy steps=5's interval lies above it -- no answer (it was "the only competing cell", issue 44)
    assert (
        "recommendation: cannot decide -- 1 of 4 cell(s) compete, and 1 noisy cell(s) could be better than the "
        "best of them: nccl=default,spec.steps=1 throughput_tok_s 95% CI [297.0, 303.0] vs "
        "nccl=default,spec.steps=5 [377.0, 383.0] (noisy); rerun with more runs (benchmark.runs) or on a quieter "
        "machine" in lines
    )
    assert (
        "nccl=default,spec.steps=3: excluded, lossless check failed (outputs differ from plain decoding); "
        "stable: robust CV 0.7% <= 5% over 5 runs; score 417.0" in text
    )
    assert "nccl=default,spec.steps=5: excluded, noisy: robust CV 14.8% > 5% over 5 runs" in text
    assert "performance-only (forced acceptance): not a drafter choice" in text


def test_acceptance_plots_show_the_measured_shares_and_rates():
    recs = sweep()
    figs = plots.figures(recs)
    assert {"acceptance_histogram.png", "accept_rate_by_position.png"} <= set(figs)
    ax = figs["acceptance_histogram.png"].axes[0]
    bars = {c.get_label(): [round(p.get_height(), 4) for p in c.patches] for c in ax.containers}
    assert bars["steps=3 (100 verifies, profile)"] == [0.05, 0.15, 0.30, 0.50]
    assert "steps=3 [performance-only] (100 verifies, profile)" in bars
    assert "performance-only" in ax.get_title()
    ax = figs["accept_rate_by_position.png"].axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert lines["steps=5"] == pytest.approx([95 / 100, 90 / 95, 80 / 90, 60 / 80, 40 / 60])
    # the cost model's fitted decay drawn beside the measured rates
    assert any(label.startswith("cost model's fit, nccl=default") for label in lines)


def test_metrics_json_keeps_the_issue21_fields_and_renders_the_same_report():
    recs = sweep()
    metrics = json.loads(json.dumps(metrics_json.to_metrics(recs)))
    e = metrics["jobs"]["nccl=default,spec.steps=3"]
    assert e["acceptance"] == {"histogram": [5, 15, 30, 50], "source": "profile"}
    assert e["accept_rate_pos2"] == pytest.approx(80 / 95, abs=1e-4) and e["ttft_ms_p50"] == 12.0
    assert e["lossless"]["verdict"] == "fail" and e["categories"]["code"]["n"] == 4
    back = metrics_json.records_from_metrics(metrics)
    assert report.sweep_summary(back)[0] == report.sweep_summary(recs)[0]
    assert sorted(plots.figures(back)) == sorted(plots.figures(recs))


def test_a_single_job_run_gets_its_charts_and_a_sweep_child_does_not(tmp_path):
    """Charts are drawn once per sweep (the parent's); a job run alone still gets its own (real sqlite store)."""
    from mlflow.tracking import MlflowClient

    from spec_decode.runner.context import JobContext
    from spec_decode.views.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "charts", str(tmp_path / "art"), tmp_path)
    parent = tracker.client.create_run(tracker.experiment_id(), run_name="sweep").info.run_id
    alone, child = sweep()[0], sweep()[0]
    alone_id = tracker.start(alone, JobContext(out_dir=tmp_path / "a", run_name="a"))
    child_id = tracker.start(child, JobContext(out_dir=tmp_path / "c", run_name="c", parent_run_id=parent))
    for run_id, rec in ((alone_id, alone), (child_id, child)):
        tracker.finish(run_id, rec, tmp_path)
    c = MlflowClient(uri)
    assert {a.path for a in c.list_artifacts(alone_id, "plots")} == {
        "plots/acceptance_histogram.png",
        "plots/accept_rate_by_position.png",
    }
    assert not c.list_artifacts(child_id, "plots")
