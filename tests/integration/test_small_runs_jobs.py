"""Small runs from run.py and the doctor, as a new user's first commands make them (the unit side, on the
jobs' own functions: tests/unit/test_small_runs.py): a one-run job prints no zero-width interval and logs no
nan, and a request too short for a decode-log line is no failed self-check."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT, run_py, store_at

pytestmark = pytest.mark.integration
SUMMARY = ("std", "cv", "robust_cv", "ci95_lo", "ci95_hi")


def test_a_one_run_job_at_three_steps_from_run_py(tmp_path):
    """The reported command at steps=3: no zero-width CI on the console, no nan in MLflow (it keeps only
    finite metrics), no false self-check warning on the 8-verify warmup."""
    store = store_at(tmp_path)
    out = tmp_path / "job"
    args = ["benchmark.runs=1", "benchmark.max_new_tokens=32", "spec.steps=3", *store["overrides"]]
    proc = run_py([*args, f"hydra.run.dir={out}"])
    console = proc.stdout + proc.stderr
    assert "95% CI [nan, nan]  CV nan%  (1 runs)" in console and "self-check failed" not in console, console
    rec = json.loads((out / "results.json").read_text())
    item = next(it for it in rec["doctor"] if it["name"] == "decode-log lines")
    assert item["ok"] and re.fullmatch(r"none due: \d decode batches < engine.decode_log_interval=10", item["detail"])
    from mlflow.tracking import MlflowClient  # lazy: ~1 s of start-up

    logged = MlflowClient(store["uri"]).get_run(rec["mlflow_run_id"]).data.metrics
    assert logged["throughput_tok_s"] == pytest.approx(rec["metrics"]["throughput_tok_s"], rel=1e-3)
    assert not {f"throughput_tok_s_{k}" for k in SUMMARY} & set(logged), logged


def test_the_doctor_at_sglangs_default_interval_passes_a_short_request():
    """96 tokens at 3 steps are ~24 decode batches: no line is due every 40 (SGLang's default)."""
    p = subprocess.run(
        [sys.executable, "-m", "spec_decode.runner.doctor", "spec.steps=3", "engine.decode_log_interval=40"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"\[OK\] decode-log lines: none due: \d+ decode batches < engine.decode_log_interval=40", p.stdout)
