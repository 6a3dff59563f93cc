"""Each self-consistency check on crafted numbers that pass and that fail."""

import pytest

from spec_decode.checks import cost_model_metrics, run_checks

pytestmark = pytest.mark.unit


def record(**metrics):
    base = {"throughput_tok_s": 94.0, "accept_len": 1.73 * 94.0 / 87.15, "cycle_ms": 19.85, "draft_ms": 0.6,
            "verify_ms": 18.66, "extend_ms": 0.4, "other_ms": 0.19, "other_pct": 1.0}
    base.update(metrics)
    return {"metrics": base, "speculative": True,
            "runs": [{"wall_s": 5.0, "e2e_latency_s": 4.9}], "profile": {"non_cycle_ms_per_request": 20.0}}


def by_name(rec):
    m = rec["metrics"]
    m.update(cost_model_metrics(m))
    return {c.name: c for c in run_checks(m, rec["runs"], rec["profile"], rec["speculative"])}


def test_consistent_numbers_pass():
    # accept_len chosen so that accept_len / cycle == measured tok/s
    rec = record(accept_len=94.0 * 19.85 / 1e3)
    checks = by_name(rec)
    assert checks["throughput_vs_accept_over_cycle"].ok is True
    assert checks["phases_within_cycle"].ok is True
    assert checks["client_vs_engine_time"].ok is True
    assert checks["acceptance_not_collapsed"].ok is True


def test_source_story_is_inconsistent_by_8_percent():
    # 94.0 tok/s x 19.85 ms/cycle = 1.87 tokens per cycle, but the reported accept length was 1.73
    c = by_name(record(accept_len=1.73))["throughput_vs_accept_over_cycle"]
    assert c.ok is False
    assert c.value == pytest.approx(94.0 / (1.73 / 0.01985) - 1, abs=1e-4)
    assert "outside the cycles" in c.message


def test_phases_exceeding_cycle_fail():
    assert by_name(record(verify_ms=25.0))["phases_within_cycle"].ok is False


def test_collapsed_acceptance_fails():
    assert by_name(record(accept_len=1.0))["acceptance_not_collapsed"].ok is False
    rec = record()
    del rec["metrics"]["accept_len"]
    assert by_name(rec)["acceptance_not_collapsed"].ok is False


def test_client_much_slower_than_engine_fails():
    rec = record()
    rec["runs"] = [{"wall_s": 6.0, "e2e_latency_s": 5.0}]
    assert by_name(rec)["client_vs_engine_time"].ok is False


def test_speedup_vs_cost_model_and_break_even():
    # source story: baseline 88.8 tok/s -> T_dec 11.26 ms; verify/decode 1.66; S = L T_dec / T_cycle
    rec = record(accept_len=1.73, baseline_throughput_tok_s=88.8, speedup_vs_baseline=94.0 / 88.8)
    c = by_name(rec)["speedup_vs_cost_model"]
    m = rec["metrics"]
    assert m["verify_decode_ratio"] == pytest.approx(18.66 / (1000 / 88.8), abs=1e-3)
    assert m["break_even_accept_len"] == pytest.approx(19.85 / (1000 / 88.8), abs=1e-3)
    assert m["predicted_speedup"] == pytest.approx(0.98, abs=0.01)
    assert c.ok is False  # measured 1.059x vs predicted 0.98x
    ok = record(accept_len=1.87, baseline_throughput_tok_s=88.8, speedup_vs_baseline=94.0 / 88.8)
    assert by_name(ok)["speedup_vs_cost_model"].ok is True


def test_checks_only_read_the_metrics():
    rec = record(accept_len=1.73, baseline_throughput_tok_s=88.8, speedup_vs_baseline=94.0 / 88.8)
    before = dict(rec["metrics"])
    run_checks(rec["metrics"], rec["runs"], rec["profile"], True)
    assert rec["metrics"] == before


def test_plots_handle_repeated_step_counts(tmp_path):
    """Two jobs with the same steps and profile (e.g. a prompt sweep) must not break the plots: each job
    keeps its own phase bar, and the throughput plot draws every job's point."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from spec_decode import report
    from spec_decode.results import EngineInfo, JobRecord

    def rec(steps, tput, prompt):
        return JobRecord(role="spec", name=f"benchmark.prompt_index={prompt},spec.steps={steps}", experiment="x",
                         config={"nccl": {"name": "default"}, "spec": {"steps": steps}, "hardware": {"name": "cpu"}},
                         config_hash="", engine=EngineInfo("embedded"), speculative=True, status="FINISHED",
                         metrics={"throughput_tok_s": tput, "accept_len": 2.0 + steps / 3, "cycle_ms": 5.0,
                                  "draft_ms": 1.0, "verify_ms": 3.0, "extend_ms": 0.8, "other_ms": 0.2})

    recs = [rec(1, 300, 0), rec(1, 310, 1), rec(3, 500, 0), rec(3, 520, 1)]
    figs = report.figures(recs)
    assert sorted(figs) == ["accept_len_vs_steps.png", "phases.png", "throughput_vs_steps.png"]
    ax = figs["phases.png"].axes[0]
    assert len(ax.get_xticklabels()) == 4  # one bar per job, not per step count
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["benchmark.prompt_index=0,spec.s~",
                                                               "benchmark.prompt_index=1,spec.s~"]
    line = figs["throughput_vs_steps.png"].axes[0].lines[0]
    assert sorted(line.get_ydata()) == [300, 310, 500, 520]
    plt.close("all")
