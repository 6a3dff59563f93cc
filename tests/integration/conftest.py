"""Fixtures the integration tier shares. The costly thing in this tier is a real sweep (a run.py process
plus one embedded server per launch), so one sweep that several tests assert on runs once per test run,
as SGLang's fixtures launch one server per test class. Each test that reads it keeps its own assertions,
so a bug still fails the test named for it (and the sweep's own failure fails every one of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import pytest
from filelock import FileLock

from ..conftest import ROOT, run_py, small, store_at

# Put into the headline sweep's environment; tests/integration/test_reliability.py then proves that none
# of them reaches a file, the MLflow store or an artifact.
SECRETS = {
    "HF_TOKEN": "hf_SeCrEtVaLuE_123456",
    "AWS_SECRET_ACCESS_KEY": "aws/SeCrEt+KeY/987654",
    "MY_PASSWORD": "pw-SeCrEt-42424242",
}
# A stray shell variable: no server of the sweep may see it (the NCCL profile alone decides NCCL_*).
STRAY_NCCL = {"NCCL_PROTO": "Simple"}
T = TypeVar("T")


@dataclass(frozen=True)
class Sweep:
    root: Path  # the sweep's tmp dir: sweep/, mlflow.db, mlartifacts/
    dir: Path  # hydra.sweep.dir
    uri: str  # the sqlite store, named to run.py only through MLFLOW_TRACKING_URI
    proc: subprocess.CompletedProcess  # run.py's exit, stdout and stderr (the sweep's last lines)
    env: dict  # what was added to run.py's environment


@pytest.fixture(scope="session")
def headline_sweep(tmp_path_factory) -> Sweep:
    """`python run.py -m spec.steps=1,3 nccl=tuned,default` (small jobs): 4 spec jobs, each with its paired
    baseline server (the default baseline strategy: no baseline jobs), the parent run, the summary. Read by
    test_runner (the sweep's structure in MLflow, the report), test_reliability (no secret leaves the
    process), test_store_uri (the store comes from MLFLOW_TRACKING_URI alone), test_mlflow_ui (the UI
    opens where the sweep said), test_record_flow (each job's MLflow run holds the record it wrote) and
    test_acceptance_flow (the acceptance histogram and rates, the recommendation). Tests only read it: anything they write goes to their own tmp_path.

    Once per test run, also with pytest-xdist's workers (`_once`)."""
    return _once(tmp_path_factory, "headline", _run_headline)


def _run_headline(root: Path) -> Sweep:
    uri = store_at(root)["uri"]  # a copy of the empty store (its creation is test_interrupt's and the port race's)
    env = {**STRAY_NCCL, **SECRETS, "MLFLOW_TRACKING_URI": uri}
    sweep = root / "sweep"
    proc = run_py(
        [
            "-m",
            "spec.steps=1,3",
            "nccl=tuned,default",
            *small(),
            f"tracking.artifact_location={root / 'mlartifacts'}",
            f"hydra.sweep.dir={sweep}",
        ],
        env=env,
    )
    return Sweep(root=root, dir=sweep, uri=uri, proc=proc, env=env)


@dataclass(frozen=True)
class Job:
    dir: Path  # hydra.run.dir: results.json, run.log
    proc: subprocess.CompletedProcess  # run.py's exit, stdout and stderr (the console a user sees)
    uri: str | None = None  # its MLflow store (None: tracking off)


def _once(tmp_path_factory, name: str, run: Callable[[Path], T]) -> T:
    """``run(root)`` once per test run: in one process (-n 0) into a tmp dir; under pytest-xdist the first
    worker that needs it runs it in the run's shared tmp dir under a file lock, the others wait on the lock
    and read what it left (its fields, run.py's exit and output among them, saved beside it as JSON)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run(tmp_path_factory.mktemp(name))
    parent = tmp_path_factory.getbasetemp().parent  # the workers' common parent dir
    shared, done = parent / name, parent / f"{name}.json"
    with FileLock(str(parent / f"{name}.lock")):
        if not done.exists():
            shared.mkdir(exist_ok=True)
            result = run(shared)
            done.write_text(
                json.dumps({"type": type(result).__name__, **{k: _saved(v) for k, v in vars(result).items()}})
            )
    saved = json.loads(done.read_text())
    cls = {c.__name__: c for c in (Sweep, Job)}[saved.pop("type")]
    return cls(**{k: _loaded(v) for k, v in saved.items()})


def _saved(v):
    if isinstance(v, Path):
        return {"path": str(v)}
    if isinstance(v, subprocess.CompletedProcess):
        return {"proc": [v.args, v.returncode, v.stdout, v.stderr]}
    return v


def _loaded(v):
    if isinstance(v, dict) and v.keys() == {"path"}:
        return Path(v["path"])
    if isinstance(v, dict) and v.keys() == {"proc"}:
        return subprocess.CompletedProcess(*v["proc"])
    return v


@pytest.fixture(scope="session")
def streamed_job(tmp_path_factory) -> Job:
    """`python run.py benchmark.stream=true benchmark.baseline_arm=false` (small, no profiled pass,
    tracking off): one streamed job, its server alone. Read by test_first_hour (the latency percentiles
    it prints, with their counts) and test_streaming_engine (the record's latency section and tok/s
    definition). Once per test run (`_once`); tests only read it."""
    return _once(tmp_path_factory, "streamed", _run_streamed)


def _run_streamed(root: Path) -> Job:
    out = root / "job"
    proc = run_py(
        [
            *small("benchmark.profile=false"),
            "benchmark.stream=true",
            "benchmark.baseline_arm=false",
            "tracking=off",
            f"hydra.run.dir={out}",
        ],
        check=False,  # a FAILED job (a server without SSE) is the readers' to judge
    )
    return Job(dir=out, proc=proc)


@pytest.fixture(scope="session")
def single_job(tmp_path_factory) -> Job:
    """`python run.py` (small): one job as the README's first command runs it -- paired baseline
    server, profiled pass, its own MLflow store (a copy of the empty one) -- not on a terminal. Read by
    test_runner (the standalone MLflow run and its real metrics) and test_progress (no progress output
    when stderr is not a terminal). Once per test run (`_once`); tests only read it."""
    return _once(tmp_path_factory, "single", _run_single)


def _run_single(root: Path) -> Job:
    store = store_at(root)
    out = root / "job"
    proc = run_py([*small(), *store["overrides"], f"hydra.run.dir={out}"])
    return Job(dir=out, proc=proc, uri=store["uri"])


# The request pass's job, as test_request_pass ran it: spec.steps=3 with the request pass (12 prompts of 6
# categories, 24 tokens, no forced EOS), benchmark.paired=false (a baseline job beside it, with its own
# record and request pass), its own MLflow store.
REQUEST_PASS_JOB = [
    *small(),
    "spec.steps=3",
    "benchmark.stream=false",
    "benchmark.request_pass=true",
    "benchmark.request_max_new_tokens=24",
    "benchmark.ignore_eos=false",
]


@pytest.fixture(scope="session")
def request_pass_job(tmp_path_factory) -> Job:
    """`python run.py REQUEST_PASS_JOB benchmark.paired=false` (the job strategy: a spec job and its
    baseline job, two servers): read by test_request_pass (categories, outputs.jsonl, the lossless guard,
    MLflow) and test_baseline_strategy (the job strategy's record beside a paired run of the same config).
    Once per test run (`_once`); tests only read it."""
    return _once(tmp_path_factory, "request_pass", _run_request_pass)


def _run_request_pass(root: Path) -> Job:
    store = store_at(root)
    out = root / "job"
    proc = run_py([*REQUEST_PASS_JOB, *store["overrides"], "benchmark.paired=false", f"hydra.run.dir={out}"])
    return Job(dir=out, proc=proc, uri=store["uri"])


@pytest.fixture(scope="session")
def headline_report_by_flag(tmp_path_factory, headline_sweep) -> Job:
    """`python -m spec_decode.views.report --mlflow-run <the headline sweep's parent run> --uri <its store>`,
    run from an empty dir (``dir``) with MLFLOW_TRACKING_URI naming another store (``uri``: sqlite, no
    file). Read by test_runner (it writes nothing in the cwd; the charts are where it says) and
    test_store_uri (the flag wins over the variable, and the variable's store is not created): one report
    process (~4.7 s of CPU), not two. Once per test run (`_once`); tests only read it."""
    return _once(tmp_path_factory, "report_by_flag", lambda root: _run_report_by_flag(root, headline_sweep))


def _run_report_by_flag(root: Path, sweep: Sweep) -> Job:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(sweep.uri)
    runs = c.search_runs([c.get_experiment_by_name("spec-decode-bench").experiment_id])
    parent = [r for r in runs if r.data.tags.get("spec_decode.role") == "sweep"][0]
    cwd = root / "cwd"
    cwd.mkdir()
    other = f"sqlite:///{root / 'no.db'}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(
        [sys.executable, "-m", "spec_decode.views.report", "--mlflow-run", parent.info.run_id, "--uri", sweep.uri],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": other},
    )
    return Job(dir=cwd, proc=proc, uri=other)
