"""The job record end to end (real run.py, real engine, real MLflow stores in tmp): a preflight refusal in
a sweep is a FAILED job the summary and parent run count; a sweep over a non-step axis keeps every
job's metrics; tracking=off jobs still carry checks and drift; MLflow logs exactly the record written;
`tracking sync` uploads schema-1 and half-logged records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.record import results
from spec_decode.views import metrics_json
from spec_decode.views.mlflow_run import display_name

from ..conftest import ROOT, run_py, small
from ..unit.test_record import SCHEMA1

pytestmark = pytest.mark.integration


def test_preflight_refusal_in_a_sweep_counts_and_a_prompt_sweep_keeps_every_entry(tmp_path, tmp_store):
    sweep = tmp_path / "sweep"
    p = run_py(
        [
            "-m",
            "benchmark.prompt_index=0,1,99",
            "spec.steps=1",
            *small("benchmark.profile=false"),  # the refusal and the entries are the point, not the profile
            *tmp_store["overrides"],
            "benchmark.paired=false",
            f"hydra.sweep.dir={sweep}",
        ],
        check=False,
    )  # baseline jobs: keyed entries too
    assert p.returncode == 2, p.stderr[-2000:]  # bad input, as for a single job; the other jobs ran
    assert "benchmark.prompt_index=99: prompts.jsonl has 8 prompts (0..7)" in p.stderr
    refused = results.read(next(sweep.glob("2_*")))
    assert refused.status == "FAILED" and "benchmark.prompt_index=99" in refused.error and not refused.runs
    text = (sweep / "sweep_summary.txt").read_text()
    assert "5 job(s): 1 FAILED, 4 FINISHED" in text, text
    assert (f"  FAILED {refused.name}: benchmark.prompt_index=99: prompts.jsonl has 8 prompts (0..7)") in text
    c = MlflowClient(tmp_store["uri"])
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    parent = [r for r in runs if r.data.tags.get("spec_decode.role") == "sweep"]
    assert len(parent) == 1 and parent[0].info.status == "FAILED"
    kids = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert (
        kids[display_name(refused)].info.status == "FAILED"
        and "benchmark.prompt_index=99" in kids[display_name(refused)].data.tags["status_detail"]
    )
    # one metrics entry per job, keyed by its overrides (two prompts -> two spec jobs, two baselines)
    metrics = metrics_json.to_metrics(results.collect(sweep))
    common = "benchmark.max_new_tokens=48,benchmark.paired=False,benchmark.profile=False,"
    tail = ",benchmark.runs=2,benchmark.warmup=1"
    assert set(metrics["jobs"]) == {
        f"baseline,{common}benchmark.prompt_index=0{tail}",
        f"baseline,{common}benchmark.prompt_index=1{tail}",
        f"{common}benchmark.prompt_index=0{tail},spec.steps=1",
        f"{common}benchmark.prompt_index=1{tail},spec.steps=1",
        f"{common}benchmark.prompt_index=99{tail},spec.steps=1",
    }
    tput = {k: v.get("throughput_tok_s") for k, v in metrics["jobs"].items()}
    assert len({v for v in tput.values() if v is not None}) == 4  # four measured jobs, none overwritten


def test_a_config_error_in_a_sweep_is_one_failed_record_and_exit_2(tmp_path, tmp_store):
    """Issue 44: `-m spec.steps=0,2` ended the whole sweep "KILLED ... interrupted" with no record."""
    sweep = tmp_path / "sweep"
    p = run_py(
        [
            "-m",
            "spec.steps=0,2",
            *small("benchmark.profile=false"),
            *tmp_store["overrides"],
            f"hydra.sweep.dir={sweep}",
        ],
        check=False,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    bad, ok = results.read(next(sweep.glob("0_*"))), results.read(next(sweep.glob("1_*")))
    assert bad.status == "FAILED" and bad.refused == "config" and not bad.runs
    assert bad.error == "config error: spec.steps=0: must be >= 1 (use drafter=none for the baseline)"
    assert ok.status == "FINISHED" and ok.steps == 2 and ok.runs
    text = (sweep / "sweep_summary.txt").read_text()
    assert "2 job(s): 1 FAILED, 1 FINISHED" in text and "KILLED" not in text, text
    assert "1 job(s) refused for bad input" in p.stderr
    c = MlflowClient(tmp_store["uri"])
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    kid = [r for r in runs if r.info.run_name == display_name(bad)]
    assert kid and kid[0].info.status == "FAILED" and "spec.steps=0" in kid[0].data.tags["status_detail"]


def test_a_refused_job_in_a_sweep_is_closed_with_every_reason(tmp_path):
    """The sweep's last lines name each reason preflight gave, not its head alone ("preflight failed:")."""
    p = run_py(
        ["-m", "spec.steps=2", "benchmark.prompts=nope.txt", "drafter.layer_ids=[0,1,2]", "tracking=off"]
        + [f"hydra.sweep.dir={tmp_path}"],
        check=False,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = [x for x in p.stderr.splitlines() if x.startswith("  ") and ": preflight failed: " in x]
    assert "benchmark.prompts=nope.txt: file not found" in line and "drafter.layer_ids is ids [0, 1, 2]" in line


def test_tracking_off_jobs_carry_checks_and_drift(tmp_path):
    off = ["tracking=off", f"tracking.results_dirs=[{tmp_path}]", *small()]
    run_py(["drafter=none", *off, f"hydra.run.dir={tmp_path / 'a'}"])
    run_py(["spec.steps=1", "benchmark.paired=false", *off, f"hydra.run.dir={tmp_path / 'b'}"])  # + a baseline job
    first = results.read(tmp_path / "a")
    assert first.drift is None and first.mlflow_run_id is None  # nothing earlier to compare with
    second = results.read(tmp_path / "b" / "baseline")
    assert second.drift is not None and second.drift.earlier_runs == 1
    assert second.drift.earlier_run_ids == [first.record_id] and second.drift.env_differences == []
    spec = results.read(tmp_path / "b")
    names = {c.name for c in spec.checks}
    assert {"client_vs_engine_time", "acceptance_not_collapsed"} <= names
    if "cycle_ms" in spec.metrics:  # the engine wrote its phase profile: the profile checks ran too
        assert {
            "throughput_in_cycles_vs_accept_over_cycle",
            "time_outside_cycles",
            "profile_vs_counters",
            "phases_within_cycle",
        } <= names
        assert "predicted_speedup" in spec.metrics
    assert not list(tmp_path.rglob("mlflow.db"))


def test_mlflow_logs_exactly_the_record_written(tmp_path, headline_sweep):
    # every job of the shared sweep (tests/integration/conftest.py): its MLflow run holds the bytes it wrote
    c = MlflowClient(headline_sweep.uri)
    jobs = sorted(f.parent for f in headline_sweep.dir.glob("*/results.json"))
    assert len(jobs) == 4
    for i, job in enumerate(jobs):
        written = (job / "results.json").read_bytes()
        rec = results.read(job)
        logged = Path(c.download_artifacts(rec.mlflow_run_id, "results.json", str(tmp_path / str(i)))).read_bytes()
        assert logged == written
        run = c.get_run(rec.mlflow_run_id)
        assert run.data.metrics["throughput_tok_s"] == pytest.approx(
            rec.metrics["throughput_tok_s"], abs=0.05
        )  # logged at 0.1 tok/s
        assert run.data.tags["checks.failed"] == (",".join(rec.failed_checks) or "none")


def test_sync_uploads_schema1_and_half_logged_records_once(tmp_path, tmp_store):
    from spec_decode.views.mlflow_run import RECORD_TAG
    from spec_decode.views.tracking import Tracker

    old = tmp_path / "sweep" / "old"
    old.mkdir(parents=True)
    (old / "results.json").write_text(json.dumps(SCHEMA1))
    # a run the job created at its start, whose record never reached the store (it went away mid-job)
    half = tmp_path / "sweep" / "half"
    half.mkdir()
    rec = results.JobRecord.from_dict({**SCHEMA1, "schema_version": 2, "record_id": "half1", "name": "half"})
    results.write(half, rec)
    tracker = Tracker(tmp_store["uri"], "spec-decode-bench", str(tmp_path / "art"), tmp_path)
    started = tracker.client.create_run(tracker.experiment_id(), run_name="half", tags={RECORD_TAG: "half1"})
    sync = [
        sys.executable,
        "-m",
        "spec_decode.views.tracking",
        "sync",
        str(tmp_path / "sweep"),
        "--uri",
        tmp_store["uri"],
        "--artifact-location",
        str(tmp_path / "art"),
    ]
    first = subprocess.run(sync, cwd=ROOT, capture_output=True, text=True, timeout=120)
    second = subprocess.run(sync, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "uploaded 2 run(s); 0 already" in first.stdout, first.stderr[-2000:]
    assert "uploaded 0 run(s); 2 already" in second.stdout, second.stderr[-2000:]
    c = MlflowClient(tmp_store["uri"])
    runs = c.search_runs([tracker.experiment_id()])
    assert len(runs) == 2
    completed = c.get_run(started.info.run_id)
    assert completed.info.status == "FINISHED" and completed.data.metrics["throughput_tok_s"] == 500.0
    legacy = [r for r in runs if r.info.run_id != started.info.run_id][0]
    assert legacy.data.params["nccl"] == "tuned" and legacy.data.tags["checks.failed"] == "phases_within_cycle"
    assert json.loads((old / "results.json").read_text()) == SCHEMA1  # sync reads, never rewrites
