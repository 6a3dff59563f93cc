"""Issue 29 (c): every command that reads MLflow honours MLFLOW_TRACKING_URI (its own flag first), and a
command that only reads never creates a store. Real run.py sweep (the shared headline sweep, whose store
is named by the variable alone), real sqlite store, real report CLI run from another directory."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from spec_decode.core import lineage

pytestmark = pytest.mark.integration


def report(args, cwd, env_uri=None):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    if env_uri:
        env["MLFLOW_TRACKING_URI"] = env_uri
    return subprocess.run(
        [sys.executable, "-m", "spec_decode.views.report", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_variable_is_honoured_and_readers_create_no_store(tmp_path, headline_sweep, headline_report_by_flag):
    # run.py: the shared sweep (tests/integration/conftest.py) had no tracking.uri on its command line;
    # the variable alone named its store
    uri = headline_sweep.uri
    assert "tracking.uri" not in " ".join(headline_sweep.proc.args)
    assert headline_sweep.env["MLFLOW_TRACKING_URI"] == uri
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    parent = [r for r in runs if r.data.tags.get("spec_decode.role") == "sweep"][0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = report(["--mlflow-run", parent.info.run_id], elsewhere, env_uri=uri)
    assert p.returncode == 0, p.stderr
    assert "4 job(s): 4 FINISHED" in p.stdout  # paired baselines: no baseline jobs
    assert not (elsewhere / "mlflow.db").exists()
    # the flag wins over the variable (the shared run of report --mlflow-run ID --uri URI with the variable
    # naming another store, tests/integration/conftest.py: headline_report_by_flag; test_runner reads it too)
    p, other = headline_report_by_flag.proc, headline_report_by_flag.uri
    assert p.args[-4:] == ["--mlflow-run", parent.info.run_id, "--uri", uri] and other != uri
    assert p.returncode == 0, p.stderr
    assert "4 job(s): 4 FINISHED" in p.stdout
    assert not Path(other[len("sqlite:///") :]).exists()
    # no variable, no flag, no store here: a clear error, and still no store created
    p = report(["--mlflow-run", parent.info.run_id], elsewhere)
    assert p.returncode == 2
    assert f"no MLflow store at {elsewhere / 'mlflow.db'}" in p.stderr and "MLFLOW_TRACKING_URI" in p.stderr, p.stderr
    assert not (elsewhere / "mlflow.db").exists()


def test_lineage_lookup_creates_no_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert lineage.training_run_id("0" * 64, None) is None
    assert not (tmp_path / "mlflow.db").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    assert lineage.resolve_uri(None) == f"sqlite:///{tmp_path}/env.db"
    assert lineage.training_run_id("0" * 64, None) is None and not (tmp_path / "env.db").exists()
