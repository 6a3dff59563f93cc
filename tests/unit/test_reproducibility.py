"""Issue 25's pure parts on known inputs: the A/A control and the recommendation's refusal, cells folded
over blocks (the interval from block-level values), the compare verdict, the host fingerprint and load
window. Records carry real runs and the aggregates analysis.finish computes from them."""

import dataclasses
import math
import statistics

import matplotlib
import pytest
from scipy import stats as st

from spec_decode.analysis import blocks, compare, control, host, recommend
from spec_decode.analysis import stats as sd_stats
from spec_decode.analysis.costmodel import chain_accept_len
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.runner import machine
from spec_decode.runner.client import RunRecord
from spec_decode.views import metrics_json, plots, report

matplotlib.use("Agg")

pytestmark = pytest.mark.unit


def cell(
    steps: int,
    tput: list[float],
    speedup: tuple,
    nccl: str = "default",
    device: str = "cpu",
    block: int = 0,
    replicate: int = 0,
    accept_len: float = 3.5,
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
    s = sd_stats.summarize([r.throughput_tok_s for r in runs])
    m = {
        "throughput_tok_s": s.mean,
        "accept_len": accept_len,
        **{f"throughput_tok_s_{k}": getattr(s, k) for k in ("cv", "robust_cv", "ci95_lo", "ci95_hi")},
        **dict(zip(("speedup_vs_baseline", "speedup_vs_baseline_ci95_lo", "speedup_vs_baseline_ci95_hi"), speedup)),
    }
    name = f"nccl={nccl},spec.steps={steps}" + (f",benchmark.block={block}" if block else "")
    return JobRecord(
        role="spec",
        name=name,
        experiment="e",
        config={
            "hardware": {"name": device, "device": device},
            "nccl": {"name": nccl},
            "spec": {"steps": steps},
            "benchmark": {"runs": 5, "block": block, "replicate": replicate},
        },
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


# ---- the A/A control ------------------------------------------------------------------------------
def test_control_agrees_when_the_identical_pair_overlaps_and_the_recommendation_stands():
    recs = [
        cell(1, steady(300), (1.20, 1.15, 1.25), "tuned"),
        cell(1, steady(300), (1.22, 1.17, 1.27)),
        cell(3, steady(400), (1.60, 1.55, 1.65), "tuned"),
        cell(3, steady(400), (1.58, 1.53, 1.63)),
    ]
    c = control.check(recs)
    assert c.status == "ok" and len(c.pairs) == 2 and all(p.agree for p in c.pairs)
    rec = recommend.recommend(recs)
    assert (rec.decision, rec.steps, rec.control) == ("recommend", 3, "ok")


def test_planted_bias_in_one_arm_disagrees_and_the_recommendation_refuses():
    # the sweep: on a CPU nccl=tuned and nccl=default are one experiment, yet steps=1 gave
    # 0.891x [0.864, 0.919] and 1.129x [1.060, 1.202]; steps=3 would otherwise win clearly
    recs = [
        cell(1, steady(300), (0.891, 0.864, 0.919), "tuned"),
        cell(1, steady(300), (1.129, 1.060, 1.202)),
        cell(3, steady(400), (1.60, 1.55, 1.65), "tuned"),
        cell(3, steady(400), (1.58, 1.53, 1.63)),
    ]
    c = control.check(recs)
    assert c.status == "disagree" and [p.agree for p in c.pairs] == [False, True]
    assert "noise exceeds the stated intervals" in c.message and control.tag(c).startswith("disagree: ")
    rec = recommend.recommend(recs)
    assert (rec.decision, rec.steps, rec.control) == ("cannot decide", None, "disagree")
    assert rec.reason.startswith("refused: A/A control DISAGREES") and "A/A control: disagree" in recommend.describe(
        rec
    )


def test_two_run_intervals_are_no_aa_control_even_when_disjoint():
    # a fresh-clone CI run (2026-12-05): 2 runs a job gave [1.314, 1.318] vs [1.687, 1.793] for the nccl
    # twins; an interval of 2 runs says nothing about the spread, so it raises no alarm (nor picks a cell)
    recs = [
        cell(3, [400.0, 400.2], (1.316, 1.314, 1.318), "tuned"),
        cell(3, [400.0, 430.0], (1.74, 1.687, 1.793)),
    ]
    c = control.check(recs)
    assert c.status == "none" and "2 run(s) a job" in c.message and not c.pairs
    rec = recommend.recommend(recs)
    assert rec.decision == "cannot decide" and rec.control == "none" and "noisy" in rec.reason


def test_nccl_profiles_are_no_control_on_a_gpu_but_replicates_are():
    gpu = [
        cell(3, steady(400), (1.0, 0.98, 1.02), "tuned", "cuda"),
        cell(3, steady(400), (1.3, 1.28, 1.32), "default", "cuda"),
    ]
    assert control.check(gpu).status == "none"  # NCCL runs there: a real difference, not a disagreement
    reps = [
        cell(3, steady(400), (1.3, 1.28, 1.32), device="cuda"),
        cell(3, steady(400), (1.1, 1.08, 1.12), device="cuda", replicate=1),
    ]
    c = control.check(reps)
    assert c.status == "disagree" and "replicates" in c.pairs[0].why_identical


def test_nccl_profiles_are_the_control_where_the_engine_recorded_that_no_nccl_runs():
    """Issue 41: at tp 1 the embedded engine makes no process group, so the one-GPU block designs' nccl pair
    is their A/A control; a record says so in ``engine.nccl_inert`` (finish asks the engine)."""
    why = "at tp 1 (the embedded engine makes no process group: no NCCL runs)"
    gpu = [
        cell(3, steady(400), (1.0, 0.98, 1.02), "tuned", "cuda"),
        cell(3, steady(400), (1.3, 1.28, 1.32), "default", "cuda"),
    ]
    for r in gpu:
        r.engine = EngineInfo("embedded", nccl_inert=why)
    c = control.check(gpu)
    assert c.status == "disagree" and c.pairs[0].why_identical == f"nccl=tuned vs nccl=default {why}"
    gpu[0].metrics.update(speedup_vs_baseline=1.29, speedup_vs_baseline_ci95_lo=1.27, speedup_vs_baseline_ci95_hi=1.31)
    assert control.check(gpu).status == "ok"
    # the committed form: metrics.json keeps the answer, and the report's control reads it back
    back = metrics_json.records_from_metrics(metrics_json.to_metrics(gpu))
    assert [r.engine.nccl_inert for r in back] == [why, why] and control.check(back).status == "ok"
    gpu[1].engine = EngineInfo("embedded")  # one arm may have run NCCL: no pair
    assert control.check(gpu).status == "none"
    assert control.check(metrics_json.records_from_metrics(metrics_json.to_metrics(gpu))).status == "none"


# ---- cells over blocks ----------------------------------------------------------------------------
def test_blocks_fold_into_one_cell_with_a_t_interval_on_block_level_speedups():
    per_block = [1.50, 1.30, 1.62, 1.41]
    recs = [cell(3, steady(400 + 10 * b), (s, s - 0.02, s + 0.02), block=b) for b, s in enumerate(per_block)]
    recs += [cell(1, steady(300), (1.2, 1.19, 1.21), block=b) for b in range(4)]
    assert blocks.has_blocks(recs)
    cells = {c.name: c for c in blocks.cells(recs)}
    assert set(cells) == {"nccl=default,spec.steps=3", "nccl=default,spec.steps=1"}
    c = cells["nccl=default,spec.steps=3"]
    logs = [math.log(v) for v in per_block]
    half = st.t.ppf(0.975, 3) * statistics.stdev(logs) / 2
    m = c.metrics
    assert m["speedup_vs_baseline"] == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (m["speedup_vs_baseline_ci95_lo"], m["speedup_vs_baseline_ci95_hi"]) == (
        pytest.approx(math.exp(statistics.fmean(logs) - half)),
        pytest.approx(math.exp(statistics.fmean(logs) + half)),
    )
    # the blocks' spread is in the interval: far wider than any one block's own +-0.02
    assert m["speedup_ci95_halfwidth_pct"] > 10
    assert c.throughput_tok_s.n == 4 and c.throughput_tok_s.unit == "block means"
    assert c.speedup_vs_baseline.method == "blocks" and c.speedup_vs_baseline.per_block == pytest.approx(per_block)
    assert "4 blocks" in blocks.interval_label(recs) and "3 df" in blocks.interval_label(recs)


def test_without_blocks_the_records_pass_through_labelled_as_the_cheap_mode():
    recs = [cell(3, steady(400), (1.5, 1.4, 1.6)), cell(1, steady(300), (1.2, 1.1, 1.3))]
    assert blocks.cells(recs) is recs and blocks.interval_label(recs) == blocks.WITHIN_LAUNCH
    assert "cheap mode" in blocks.WITHIN_LAUNCH


# ---- compare --------------------------------------------------------------------------------------
def entry(speedup, accept=3.5, **kw):
    return {
        "role": "spec",
        "status": "FINISHED",
        "accept_len": accept,
        "speedup_vs_baseline": speedup[0],
        "speedup_vs_baseline_ci95_lo": speedup[1],
        "speedup_vs_baseline_ci95_hi": speedup[2],
        **kw,
    }


def test_compare_verdicts_on_known_inputs():
    a = {
        "jobs": {
            "s=1": entry((1.25, 1.20, 1.30)),
            "s=3": entry((1.79, 1.68, 1.90)),
            "s=5": entry((1.5, 1.4, 1.6)),
            "baseline": {"role": "baseline", "status": "FINISHED", "throughput_tok_s": 500.0},
        }
    }
    b = {
        "jobs": {
            "s=1": entry((1.28, 1.22, 1.34)),
            "s=3": entry((1.27, 1.25, 1.29)),
            "s=5": entry((1.5, 1.4, 1.6), 3.7),
            "baseline": {"role": "baseline", "status": "FINISHED", "throughput_tok_s": 330.0},
        }
    }
    rows = {r.cell: r for r in compare.compare(a, b)}
    assert rows["s=1"].verdict == "agree"
    assert rows["s=3"].verdict.startswith("DIFFERS: speedup intervals disjoint (-29.1%)")  # the cell
    assert rows["s=5"].verdict == "DIFFERS: accept length differs"
    assert rows["baseline"].verdict.startswith("info") and not rows["baseline"].differs
    assert compare.verdict(list(rows.values())).startswith("DIFFER: 2 of 4")
    # the rerun criterion: B's point inside A's interval (s=1: 1.28 in [1.20, 1.30]; s=3 and s=5 -- 1.5 in [1.4, 1.6])
    assert [rows[k].inside for k in ("s=1", "s=3", "s=5")] == [True, False, True]
    assert compare.coverage(list(rows.values())) == "coverage: 2 of 3 speedups of B inside A's 95% interval"
    del b["jobs"]["s=3"], b["jobs"]["s=5"]
    a2 = {"jobs": {k: a["jobs"][k] for k in ("s=1", "baseline")}}
    assert compare.verdict(compare.compare(a2, b)).startswith("agree")
    assert compare.compare(a, b)[2].verdict == "DIFFERS: only in A"


def test_compare_lines_up_sweeps_run_with_different_fixed_overrides_and_block_design_cells():
    a = {
        "jobs": {
            "benchmark.runs=30,nccl=tuned,spec.steps=3": entry((1.5, 1.4, 1.6)),
            "benchmark.runs=30,nccl=default,spec.steps=3": entry((1.5, 1.4, 1.6)),
            "baseline,benchmark.runs=30,nccl=tuned": {"role": "baseline", "throughput_tok_s": 500.0},
        }
    }
    b = {
        "jobs": {},
        "cells": {
            "+engine.env.FAULT=slow\\:0.15,benchmark.blocks=4,engine.launcher=[python,tests/fault_server.py],nccl=tuned,spec.steps=3": entry(
                (1.2, 1.1, 1.3)
            ),
            "+engine.env.FAULT=slow\\:0.15,benchmark.blocks=4,engine.launcher=[python,tests/fault_server.py],nccl=default,spec.steps=3": entry(
                (1.45, 1.3, 1.6)
            ),
            "baseline,+engine.env.FAULT=slow\\:0.15,benchmark.blocks=4,engine.launcher=[python,tests/fault_server.py],nccl=tuned": {
                "role": "baseline",
                "throughput_tok_s": 480.0,
            },
        },
    }
    assert (
        set(compare.entries(b))
        == set(compare.entries(a))
        == {"nccl=tuned,spec.steps=3", "nccl=default,spec.steps=3", "baseline,nccl=tuned"}
    )
    rows = {r.cell: r.verdict for r in compare.compare(a, b)}
    assert rows["nccl=tuned,spec.steps=3"].startswith("DIFFERS") and rows["nccl=default,spec.steps=3"] == "agree"


def test_compare_lines_up_a_paired_sweep_with_one_that_measured_baseline_jobs():
    """The default strategy (paired) leaves no baseline jobs, so spec.steps=3 is the same in every job
    of the sweep; a committed metrics.json from the job strategy has baseline jobs. Same cells, same
    names; the baseline jobs on one side are information, not missing cells."""
    base = {"role": "baseline", "status": "FINISHED", "throughput_tok_s": 500.0}
    jobs = {
        "jobs": {
            "nccl=tuned,spec.steps=3": entry((1.5, 1.4, 1.6), speedup_method="welch"),
            "nccl=default,spec.steps=3": entry((1.5, 1.4, 1.6), speedup_method="welch"),
            "baseline,nccl=tuned": base,
            "baseline,nccl=default": base,
        }
    }
    paired = {
        "jobs": {
            "nccl=tuned,spec.steps=3": entry((1.55, 1.5, 1.6), speedup_method="paired"),
            "nccl=default,spec.steps=3": entry((1.2, 1.15, 1.25), speedup_method="paired"),
        }
    }
    rows = {r.cell: r for r in compare.compare(jobs, paired)}
    assert set(rows) == {
        "nccl=tuned,spec.steps=3",
        "nccl=default,spec.steps=3",
        "baseline,nccl=tuned",
        "baseline,nccl=default",
    }
    assert rows["nccl=tuned,spec.steps=3"].verdict == "agree"
    assert rows["nccl=default,spec.steps=3"].verdict.startswith("DIFFERS: speedup intervals disjoint")
    assert rows["baseline,nccl=tuned"].verdict == "info: a baseline job only in A (the other side's ran paired)"
    assert [r.cell for r in rows.values() if r.differs] == ["nccl=default,spec.steps=3"]
    assert (
        "baselines: baseline jobs vs paired beside each spec server (the speedup's method differs too)"
        in compare.host_notes(jobs, paired)
    )
    # one spec cell and fixed overrides: its name is its speculation on both sides
    one_jobs = {
        "jobs": {
            "benchmark.runs=30,spec.steps=3": entry((1.5, 1.4, 1.6), speedup_method="welch"),
            "baseline,benchmark.runs=30": base,
        }
    }
    one_paired = {"jobs": {"benchmark.runs=30,spec.steps=3": entry((1.5, 1.4, 1.6), speedup_method="paired")}}
    assert set(compare.entries(one_paired)) == {"spec.steps=3"} and "spec.steps=3" in compare.entries(one_jobs)
    assert compare.verdict(compare.compare(one_paired, one_jobs)).startswith("agree")
    assert compare.compare(one_jobs, one_jobs)[0].verdict.startswith("info: tok/s")  # both sides: compared


def test_compare_names_host_differences():
    fa = {"cpu_model": "Xeon 8480", "isa": ["avx2", "avx512f"], "logical_cores": 2, "gpus": None}
    fb = {**fa, "cpu_model": "EPYC 9654", "isa": ["avx2"]}
    diffs = compare.host_differences(fa, fb)
    assert diffs == ["cpu_model: Xeon 8480 vs EPYC 9654", "isa: ['avx2', 'avx512f'] vs ['avx2']"]
    assert compare.host_differences(fa, dict(fa)) == []
    g = [{"name": "NVIDIA H200", "driver_version": "570.1", "clocks.max.sm": "1980"}]
    assert compare.host_differences({**fa, "gpus": g}, {**fa, "gpus": [{**g[0], "driver_version": "575.2"}]}) == [
        "gpu0 driver_version: 570.1 vs 575.2"
    ]


def test_compare_notes_loads_half_a_machine_apart_and_not_closer():
    """The committed embedded_steps_nccl (load 1.0) against the 8-block run at load 3.4 on the same 2-core
    VM: 4 of 8 cells outside the rerun intervals. compare says the loads differ; 1.0 vs 1.4 it does not."""
    host = {"cpu_model": "AMD EPYC", "usable_cores": 2}

    def side(*loads):
        return {"host": host, "jobs": {f"j{i}": {"host_load1": x} for i, x in enumerate(loads)}}

    notes = compare.host_notes(side(1.0, 0.9, 1.5), side(3.4, 3.1, 4.9))
    assert "loads differ: median 1.0 vs 3.4 on 2 usable cores; the speedup moves with the host's load" in notes[1]
    assert not any(n.startswith("loads differ") for n in compare.host_notes(side(1.0, 1.1), side(1.4, 1.3)))
    assert compare.load_difference(side(1.0), {"host": host, "jobs": {"j": {}}}) is None  # not recorded


# ---- host -----------------------------------------------------------------------------------------
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t: 0
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile hypervisor

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
physical id\t: 0
core id\t: 0
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile hypervisor
"""


def test_cpu_facts_and_the_load_window():
    f = machine.cpu_facts(CPUINFO)
    assert f == {
        "cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
        "cpu_vendor": "GenuineIntel",
        "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "amx_tile"],
        "hypervisor": True,
        "physical_cores": 1,
    }  # two hyperthreads of one core
    # 1000 ticks: 500 user, 200 idle, 100 iowait, 200 steal -> busy 70%, steal 20%
    a = {"t": 10.0, "cpu": [0] * 8, "loadavg": [4.0, 3.0, 2.0]}
    b = {"t": 12.5, "cpu": [500, 0, 0, 200, 100, 0, 0, 200], "loadavg": [6.0, 3.5, 2.1]}
    w = machine.window(a, b)
    assert w.as_dict() == {
        "s": 2.5,
        "load1_start": 4.0,
        "load1_end": 6.0,
        "busy_pct": 70.0,
        "steal_pct": 20.0,
        "iowait_pct": 10.0,
    }
    m = host.metrics_of([w, dataclasses.replace(w, s=7.5, steal_pct=0.0, load1_start=8.0, load1_end=8.0)])
    assert m == {"host_load1": 6.5, "host_load1_max": 8.0, "host_steal_pct": 5.0, "host_busy_pct": 70.0}
    # the host probe at both ends (a record from before the probe has none: no key)
    w = machine.window({**a, "probe_us": 900.0}, {**b, "probe_us": 1500.0})
    assert (w.probe_us_start, w.probe_us_end) == (900.0, 1500.0) and w.as_dict()["probe_us_end"] == 1500.0
    m = host.metrics_of([w, dataclasses.replace(w, probe_us_start=1000.0, probe_us_end=None)])
    assert m["host_probe_us"] == pytest.approx((900 + 1500 + 1000) / 3) and m["host_probe_us_max"] == 1500.0
    live = machine.fingerprint()
    assert live["logical_cores"] >= 1 and live["cpu_model"] and "host:" in host.describe(live)


# ---- the cost model's extrapolation label reaches the report and the plot legend ----------------------
def test_report_and_plot_legend_label_a_best_beyond_the_measured_steps():
    recs = []
    for k in (1, 2, 3):  # high acceptance, cheap verify: the model's best lies beyond steps 3
        accept = chain_accept_len(0.95, k)
        parts = {"draft_ms": 0.2 * k, "verify_ms": 3.0 + 0.05 * (k + 1), "extend_ms": 0.3, "other_ms": 0.1}
        tput = accept / (sum(parts.values()) / 1e3)
        r = cell(k, steady(tput), (1.5, 1.4, 1.6), accept_len=accept)
        r.metrics.update(parts, cycle_ms=sum(parts.values()))
        recs.append(r)
    text, _ = report.sweep_summary(recs)
    note = next(line for line in text.splitlines() if line.startswith("EXTRAPOLATION: steps="))
    assert "outside the measured steps 1..3; not measured, not a recommendation" in note
    assert "predicted best: steps=3 " in text  # the best named without a label is a measured step count
    _, labels = plots.figures(recs)["throughput_vs_steps.png"].axes[0].get_legend_handles_labels()
    model = next(lb for lb in labels if lb.startswith("cost model"))
    assert "best within measured steps: 3" in model and "by EXTRAPOLATION, not measured" in model
