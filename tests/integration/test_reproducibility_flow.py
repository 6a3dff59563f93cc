"""Issue 25 end to end: real sweeps of the embedded engine (run.py -m, real MLflow sqlite stores), one arm
slowed at the process boundary (tests/fault_server.py slow:F busy-waits F/(1-F) x each request's own
time, so the slowdown is a fixed share whatever the host's load). The A/A control (nccl=tuned vs
nccl=default on a CPU) agrees on a plain sweep and disagrees, with the recommendation refusing, when
one of the twins is slowed; experiment compare exits 0 on one sweep read through two sources (its
multirun dir and its MLflow parent run) and 1 on a planted slowdown; the host fingerprint reaches
results.json, MLflow and metrics.json."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.record.results import collect
from spec_decode.views.metrics_json import to_metrics

from ..conftest import ROOT, run_py, store_at

pytestmark = pytest.mark.integration
FAULT = "engine.launcher=[python,tests/fault_server.py]"
# 12 pairs x 64 tokens per spec job: a few seconds each; the 95% speedup intervals under this host's
# load (1-min load 4-6 on 2 cores) were +-10..20% with a baseline job per twin, +-6..7% paired (load 2-3).
# The default baseline strategy (paired): each twin's baseline server runs beside its spec server, no
# baseline jobs -- so spec.steps=3 is in every job's name, and compare still names the cells by it.
# No profiled pass: the control, the recommendation and compare read the timed runs' speedup intervals.
SMALL = [
    "spec.steps=3",
    "nccl=tuned,default",
    "benchmark.max_new_tokens=64",
    "benchmark.runs=12",
    "benchmark.warmup=1",
    "benchmark.profile=false",
]


def sweep(tmp_path: Path, store: dict, name: str, *extra: str) -> tuple[Path, str, MlflowClient]:
    d = tmp_path / name
    run_py(["-m", *SMALL, *store["overrides"], f"hydra.sweep.dir={d}", *extra])
    c = MlflowClient(store["uri"])
    exp = c.get_experiment_by_name("spec-decode-bench")
    parents = [
        r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("spec_decode.sweep_dir") == str(d.resolve())
    ]
    assert len(parents) == 1
    return d, parents[0].info.run_id, c


def compare(*args: str, uri: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spec_decode.views.experiment", "compare", *args],
        cwd=ROOT,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        capture_output=True,
        text=True,
        timeout=300,
    )


@dataclass(frozen=True)
class Healthy:
    dir: Path
    run: str
    client: MlflowClient
    store: dict


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Healthy:
    """The plain sweep (its A/A twins healthy), made in the setup of the first test that asks for it: the
    `quiet` test below, so the twins see the same load (conftest's quiet lock covers a test's setup)."""
    root = tmp_path_factory.mktemp("aa")
    store = store_at(root)
    d, run, c = sweep(root, store, "a")
    return Healthy(d, run, c, store)


@pytest.mark.quiet  # the A/A twins must see the same load (the block design test compares no twins)
def test_aa_control_agrees_on_a_plain_sweep(healthy):
    a_dir, a_run, c = healthy.dir, healthy.run, healthy.client
    assert {r.role for r in collect(a_dir)} == {"spec"} and all(r.baseline_runs for r in collect(a_dir))  # paired
    tags = c.get_run(a_run).data.tags
    if not tags["aa_control"].startswith("ok:"):
        # The sweep's intervals are within one launch (cheap mode): they miss launch-to-launch noise, so
        # healthy twins on this shared VM disagree now and then (seen in about 1 run of 4, docs/testing.md).
        # One fresh sweep: a control that always disagrees still fails; one that flakes once does not.
        a_dir, a_run, c = sweep(a_dir.parent, healthy.store, "a-rerun")
        tags = c.get_run(a_run).data.tags
    assert tags["aa_control"].startswith("ok: A/A control agrees: 1 known-identical pair"), tags["aa_control"]
    assert "refused" not in tags["recommendation"]
    summary = (a_dir / "sweep_summary.txt").read_text()
    assert (
        "intervals: runs within one launch (cheap mode" in summary and "load (1 min) during the timed runs" in summary
    )
    assert "host probe (the runner's time for a fixed pure-Python task, larger = slower): median " in summary
    # the host fingerprint: results.json, MLflow (tags + load metrics)
    rec = json.loads(next(a_dir.glob("*/results.json")).read_text())
    assert (
        rec["provenance"]["host"]["logical_cores"] == os.cpu_count() and rec["launches"][0]["host"]["load1_start"] >= 0
    )
    # the host probe at both ends of every launch's timed runs, and the job's mean of them
    assert all(la["host"]["probe_us_start"] > 0 and la["host"]["probe_us_end"] > 0 for la in rec["launches"])
    assert rec["metrics"]["host_probe_us"] > 0
    kid = c.search_runs([c.get_run(a_run).info.experiment_id], f"tags.mlflow.parentRunId = '{a_run}'")[0]
    assert kid.data.tags["host.cpu"] == rec["provenance"]["host"]["cpu_model"] and "host_load1" in kid.data.metrics
    # each server process's CPU over the timed runs: the front (launcher) and the rank that decodes, both servers
    for la in rec["launches"]:
        for key, pid in (("server_procs", la["pid"]), ("baseline_procs", la["baseline_pid"])):
            procs = {p["name"]: p for p in la["host"][key]}
            assert procs["launcher"]["pid"] == pid and procs["rank0"]["cpu_s"] > 0, procs
            assert procs["rank0"]["cpu_s"] > procs["launcher"]["cpu_s"]  # the model decodes on the rank's CPU
    m = rec["metrics"]
    assert m["server_cpu_pct"] >= m["server_cpu_pct.rank0"] > 0 and m["baseline_server_cpu_ms_per_1k_tok.rank0"] > 0
    assert "server_cpu_pct.rank0" in kid.data.metrics
    assert "server processes' CPU over the timed runs" in summary


def test_compare_agrees_with_itself_on_one_sweep_read_through_two_sources(healthy):
    """Not `quiet`: it measures nothing (it reads the healthy sweep, made quiet above), so the other worker
    goes on during its compare process (~4 s of CPU)."""
    # the same sweep through two sources (multirun dir, MLflow parent id via MLFLOW_TRACKING_URI): agree, exit 0
    a_dir, a_run = healthy.dir, healthy.run
    same = compare(str(a_dir), a_run, uri=healthy.store["uri"])
    assert same.returncode == 0, same.stdout + same.stderr
    assert "verdict: agree: all 2 spec cell(s)" in same.stdout and "hosts: same fingerprint" in same.stdout


def test_a_planted_bias_makes_the_aa_control_disagree_and_compare_exit_1(healthy, tmp_path):
    """Not `quiet`: a twin slowed to half speed is told apart whatever runs beside it (the fault server
    scales each request's own time), so the other worker goes on during this sweep."""
    # the nccl=tuned spec server runs at half speed -> the control disagrees, the recommendation refuses,
    # and compare (the healthy sweep vs this one) names that cell and exits 1
    b_dir, b_run, c = sweep(
        tmp_path,
        healthy.store,
        "b",
        FAULT,
        "+engine.env.FAULT=slow:0.5",
        "+engine.env.FAULT_IF_ENV=NCCL_PROTO",
        "+engine.env.FAULT_IF_ARG=--speculative-algorithm:EAGLE3",
    )
    tags = c.get_run(b_run).data.tags
    assert tags["aa_control"].startswith("disagree: A/A control DISAGREES"), tags["aa_control"]
    assert tags["recommendation"].startswith("cannot decide: refused: A/A control DISAGREES")
    assert "noise exceeds the stated intervals" in (b_dir / "sweep_summary.txt").read_text()
    diff = compare(str(healthy.dir), str(b_dir), uri=healthy.store["uri"])
    assert diff.returncode == 1, diff.stdout + diff.stderr
    tuned = next(line for line in diff.stdout.splitlines() if line.startswith("nccl=tuned,spec.steps=3"))
    assert "DIFFERS: speedup intervals disjoint" in tuned
    assert "verdict: DIFFER" in diff.stdout


@pytest.mark.slow
def test_compare_exits_nonzero_on_a_planted_15_percent_slowdown(tmp_path, tmp_store):
    """Both spec servers of sweep B run 15% slower (their tok/s x 0.85): every speedup falls by 15%.
    Slow tier: ~6 min here, and a measurement as much as a test -- with 30 pairs per job the intervals
    were +-9..11% under load 4-5 (2026-12-01 00:15, docs/reproducibility.md), so one cell of two
    resolved the 15% (-22%) and the other did not (-4%): compare said DIFFER, as it must when any does."""
    a_dir, _, _ = sweep(tmp_path, tmp_store, "a", "benchmark.runs=30")
    b_dir, _, _ = sweep(
        tmp_path,
        tmp_store,
        "b",
        "benchmark.runs=30",
        FAULT,
        "+engine.env.FAULT=slow:0.15",
        "+engine.env.FAULT_IF_ARG=--speculative-algorithm:EAGLE3",
    )
    diff = compare(str(a_dir), str(b_dir), uri=tmp_store["uri"])
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "DIFFERS: speedup intervals disjoint" in diff.stdout


BLOCKS_EXPERIMENT = """# @package _global_
name: blocks_smoke
hydra:
  sweeper:
    params:
      benchmark.block: range(0,${benchmark.blocks})
      spec.steps: "3"
"""


CELL = "benchmark.max_new_tokens=48,benchmark.profile=False,benchmark.runs=3,benchmark.warmup=1,spec.steps=3"


def test_block_design_spreads_each_cell_over_the_sweep_and_folds_its_blocks(tmp_path):
    """benchmark.block as the first axis (an experiment from an extra config dir): the whole sweep runs
    once per block, and the summary and metrics.json fold each cell's blocks into one interval."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "blocks_smoke.yaml").write_text(BLOCKS_EXPERIMENT)
    d = tmp_path / "sweep"
    run_py(
        [
            "-m",
            "--config-dir",
            str(tmp_path / "conf"),
            "experiment=blocks_smoke",
            "benchmark.blocks=2",  # the fewest that spread a cell over the sweep and fold into one interval
            "benchmark.max_new_tokens=48",
            "benchmark.runs=3",
            "benchmark.warmup=1",
            "benchmark.profile=false",  # the fold reads the timed runs
            "tracking=off",
            f"hydra.sweep.dir={d}",
        ]
    )
    recs = collect(d)
    spec = sorted((r for r in recs if r.speculative), key=lambda r: r.started_at)
    assert [r.config["benchmark"]["block"] for r in spec] == [0, 1]  # one launch of the cell per block
    # each block's baseline is the paired server beside its spec server (the default): no baseline jobs
    assert [r for r in recs if not r.speculative] == [] and all(r.baseline_runs for r in spec)
    metrics = to_metrics(recs)
    assert metrics["host"] == recs[0].provenance.host and metrics["host"]["cpu_model"]  # metrics.json names the host
    assert all("host_load1" in e for e in metrics["jobs"].values())
    assert metrics["interval"].startswith("2 blocks spread over the sweep") and set(metrics["cells"]) == {CELL}
    cell = metrics["cells"][CELL]
    assert cell["speedup_method"] == "blocks" and cell["throughput_tok_s_n"] == 2
    per_block = [r.metrics["speedup_vs_baseline"] for r in spec]
    assert min(per_block) <= cell["speedup_vs_baseline"] <= max(per_block)
    summary = (d / "sweep_summary.txt").read_text()
    assert "cells over blocks (2 blocks spread over the sweep (launch-level values, t with 1 df))" in summary
