"""What the report and sync commands take and say: an experiment dir renders from its committed
metrics.json (and rewrites none of its plots); a path with neither results.json nor metrics.json, or an
MLflow run id that is no sweep's parent, is an exit-2 error naming what was given and where it looked,
with no download dir left behind; sync's --help says what it does, and sync does that. Real files, a
real sqlite MLflow store per test (tests/conftest.py: tmp_store)."""

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from spec_decode.record import results
from spec_decode.record.results import EngineInfo, JobRecord
from spec_decode.record.sections import Summary
from spec_decode.views import report, tracking
from spec_decode.views.metrics_json import records_from_metrics

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments" / "embedded_steps_nccl"  # a reported experiment: metrics.json, no results.json


def record(name: str = "baseline,nccl=default", tput: float = 300.0) -> JobRecord:
    return JobRecord(
        role="baseline",
        name=name,
        experiment="e",
        config={"nccl": {"name": "default"}, "spec": {"steps": None}, "engine": {"name": "embedded"}},
        config_hash="h",
        engine=EngineInfo("embedded"),
        speculative=False,
        status="FINISHED",
        metrics={"throughput_tok_s": tput},
        throughput_tok_s=Summary(n=2, mean=tput, std=1.0, cv=0.01, ci95_lo=tput - 5, ci95_hi=tput + 5),
    )


def cli(capsys, main, *argv: str) -> tuple[int, str, str]:
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def own_tmp(tmp_path, monkeypatch) -> Path:
    """The dir tempfile makes its dirs in (as TMPDIR would), empty: what a command leaves there shows."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def test_an_experiment_dir_renders_its_committed_metrics_json_and_rewrites_no_plot(tmp_path, capsys):
    exp = tmp_path / "experiments" / EXP.name
    exp.mkdir(parents=True)
    shutil.copy(EXP / "metrics.json", exp)
    metrics = json.loads((exp / "metrics.json").read_text())
    want, _ = report.sweep_summary(records_from_metrics(metrics))  # what the report stage writes to table.txt
    n = len(metrics["jobs"])
    assert n > 1 and f"{n} job(s): {n} FINISHED" in want
    for src in (exp, exp / "metrics.json"):  # the dir, or the file itself
        code, out, err = cli(capsys, report.main, str(src))
        assert code == 0, err
        assert out == want + "\n"
        assert f"plots: none drawn (those beside {src} stay as they are)" in err
    assert sorted(p.name for p in exp.iterdir()) == ["metrics.json"]  # a view: nothing written beside it
    code, _, err = cli(capsys, report.main, str(exp), "--plots", str(tmp_path / "plots"))
    assert code == 0, err
    assert (tmp_path / "plots" / "throughput_vs_steps.png").is_file() and f"plot: {tmp_path / 'plots'}" in err


def test_a_claim_is_refused_and_a_jobs_results_json_is_its_job(tmp_path, capsys):
    kimi = ROOT / "experiments" / "kimi_k25_rtx6000x8_eagle3"
    code, out, err = cli(capsys, report.main, str(kimi))
    assert code == 2 and out == "" and "holds a source's claim, not a measurement" in err
    job = tmp_path / "job"
    results.write(job, record())
    code, out, err = cli(capsys, report.main, str(job / "results.json"))  # the file: read as its job dir
    assert code == 0 and "1 job(s): 1 FINISHED" in out, err


def test_a_dir_with_neither_record_names_itself_and_what_the_report_takes(tmp_path, capsys):
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    code, out, err = cli(capsys, report.main, str(empty))
    assert code == 2 and out == ""
    assert f"error: {empty}: no results.json under it, no metrics.json in it; give a sweep dir" in err
    assert "an experiment dir (experiments/NAME, its metrics.json) or a metrics.json file, or --mlflow-run ID" in err
    (empty / "metrics.json").write_text(json.dumps({"cells": {}}))  # a drafter experiment's: no jobs
    code, _, err = cli(capsys, report.main, str(empty))
    assert code == 2 and f"{empty / 'metrics.json'} is not a metrics.json (no 'jobs'" in err
    assert "python -m spec_decode.views.drafter_experiments report NAME" in err


def test_an_unknown_run_id_is_an_exit_2_naming_the_run_and_store_and_leaves_no_dir(tmp_store, own_tmp, capsys):
    from mlflow.tracking import MlflowClient

    uri = tmp_store["uri"]
    code, out, err = cli(capsys, report.main, "--mlflow-run", "deadbeef", "--uri", uri)
    assert code == 2 and out == "" and "Traceback" not in err
    assert f"error: run 'deadbeef' not read from the MLflow store {uri} (MlflowException: Run with id=deadbeef" in err
    assert list(own_tmp.iterdir()) == []
    # a run that is no sweep's parent (a job's own run): no children to report
    c = MlflowClient(uri)
    job_run = c.create_run(c.create_experiment("e")).info.run_id
    code, _, err = cli(capsys, report.main, "--mlflow-run", job_run, "--uri", uri)
    assert code == 2 and f"run {job_run!r} in the MLflow store {uri} has no child runs" in err
    assert list(own_tmp.iterdir()) == []
    # compare reads run ids through records_of: the same answer, and the same clean-up
    with pytest.raises(SystemExit, match=f"'deadbeef' is neither a directory nor a sweep's parent run: .*{uri}"):
        report.records_of("deadbeef", uri)
    assert list(own_tmp.iterdir()) == []


def test_a_sweeps_parent_run_renders_from_its_download_dir(tmp_store, own_tmp, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = tmp_store["uri"]
    c = MlflowClient(uri)
    exp_id = c.create_experiment("e", artifact_location=str(tmp_path / "art"))
    parent = c.create_run(exp_id).info.run_id
    for i, tput in enumerate((300.0, 310.0)):
        rec = record(f"baseline,nccl=default,rep={i}", tput)
        kid = c.create_run(exp_id, tags={"mlflow.parentRunId": parent}).info.run_id
        c.log_artifact(kid, str(results.write(tmp_path / f"job{i}", rec)))
    code, out, err = cli(capsys, report.main, "--mlflow-run", parent, "--uri", uri)
    assert code == 0, err
    assert "2 job(s): 2 FINISHED" in out
    (down,) = own_tmp.iterdir()  # kept: it holds the records and their plots, as the report says
    assert f"downloaded the sweep's results.json files to {down}" in err
    assert len(list(down.glob("*/results.json"))) == 2
    shutil.rmtree(down)
    assert len(report.records_of(parent, uri)) == 2  # compare's path: read into memory, the download dir gone
    assert list(own_tmp.iterdir()) == []


def test_sync_help_says_what_sync_does_and_sync_does_it(tmp_store, tmp_path, capsys):
    code, out, _ = cli(capsys, tracking.main, "sync", "--help")
    assert code == 0
    help_text = " ".join(out.split())
    assert "Upload the job records (results.json) under DIR that never reached the MLflow store" in help_text
    assert "sync makes no sweep parent run" in help_text and "a second sync uploads nothing" in help_text
    assert "dir where to look for results.json, at any depth: a multirun sweep dir, a job dir" in help_text
    # what the help claims: one top-level run per record, tagged synced; the second sync uploads nothing
    sweep = tmp_path / "multirun" / "sweep"
    results.write(sweep / "0", record())
    argv = ("sync", str(sweep.parent), "--uri", tmp_store["uri"], "--artifact-location", str(tmp_path / "art"))
    assert cli(capsys, tracking.main, *argv)[1] == f"uploaded 1 run(s); 0 already in {tmp_store['uri']}\n"
    assert cli(capsys, tracking.main, *argv)[1] == f"uploaded 0 run(s); 1 already in {tmp_store['uri']}\n"
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tmp_store["uri"])
    (run,) = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    assert run.data.tags["spec_decode.synced"] == "true" and "mlflow.parentRunId" not in run.data.tags
