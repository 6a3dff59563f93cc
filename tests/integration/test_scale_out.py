"""Beyond one process: submitit_local workers, a real MLflow tracking server, the slot allocator."""

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from spec_decode.engines.server_process import free_port, kill_tree
from spec_decode.runner.slots import allocate

from ..conftest import run_py, small
from ..slot_worker import worker

pytestmark = pytest.mark.integration


def structure(uri: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    rs = c.search_runs([exp.experiment_id])
    parents = [r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"]
    kids = [r for r in rs if r.data.tags.get("mlflow.parentRunId") == (parents[0].info.run_id if parents else None)]
    return parents, kids


@dataclass(frozen=True)
class Served:
    root: Path  # slots/, sweep/ (its .submitit/), srv.db, srv-artifacts/, mlflow.log
    uri: str  # the MLflow tracking server, named to run.py only through MLFLOW_TRACKING_URI


@pytest.fixture(scope="module")
def served_sweep(tmp_path_factory) -> Served:
    """One sweep for the two tests below (one run.py, one set of server launches, not two): submitit_local
    workers (two jobs at once, each its own process) logging through the REST API to a real `mlflow
    server` (its own sqlite store and artifact dir). What each test reads is its own: the records and the
    run structure (as the basic launcher logs them), and what the server stored."""
    root = tmp_path_factory.mktemp("served")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    mlflow_bin = str(Path(sys.executable).parent / "mlflow")
    server = subprocess.Popen(
        [
            mlflow_bin,
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'srv.db'}",
            "--artifacts-destination",
            str(root / "srv-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        stdout=open(root / "mlflow.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert server.poll() is None, (root / "mlflow.log").read_text()[-2000:]
            try:
                if requests.get(uri + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        run_py(
            [
                "-m",
                "hydra/launcher=local_parallel",
                "hardware.parallel_jobs=2",
                f"hardware.slots_dir={root / 'slots'}",
                "tracking=server",
                "spec.steps=1,2",
                *small("benchmark.profile=false"),  # read: records, runs, the store; not the profile
                "benchmark.paired=false",  # the baseline job, shared by the two parallel jobs (file lock)
                f"hydra.sweep.dir={root / 'sweep'}",
            ],
            env={"MLFLOW_TRACKING_URI": uri},
            timeout=600,
        )
        yield Served(root, uri)
    finally:
        kill_tree(server.pid)
    assert server.poll() is not None


def test_submitit_local_sweep_logs_like_the_basic_launcher(served_sweep):
    parents, kids = structure(served_sweep.uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(k.data.params["role"] for k in kids) == ["baseline", "spec", "spec"]
    assert all(k.info.status == "FINISHED" for k in kids)
    # every job wrote its own record in its own dir, and its MLflow run is that record's
    out_dirs = {k.data.tags["spec_decode.out_dir"]: k for k in kids}
    assert len(out_dirs) == 3
    for d, k in out_dirs.items():
        rec = json.loads((Path(d) / "results.json").read_text())
        assert rec["record_id"] == k.data.tags["spec_decode.record_id"] and rec["mlflow_run_id"] == k.info.run_id
    assert (served_sweep.root / "sweep" / ".submitit").is_dir()  # really ran through submitit


def test_sweep_against_a_real_mlflow_server(served_sweep):
    uri = served_sweep.uri
    parents, kids = structure(uri)  # through the REST API
    assert len(parents) == 1 and len(kids) == 3  # two spec jobs and the baseline job
    assert all(k.info.status == "FINISHED" and "throughput_tok_s" in k.data.metrics for k in kids)
    c = MlflowClient(uri)
    assert all("results.json" in {a.path for a in c.list_artifacts(k.info.run_id)} for k in kids)
    assert len(list((served_sweep.root / "srv-artifacts").rglob("results.json"))) == 3  # stored by the server


def test_slot_allocator_never_shares_a_gpu_and_frees_slots_of_dead_jobs(tmp_path):
    out = tmp_path / "log.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(tmp_path / "slots", out, 0.3, i == 0)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 5  # the crashed one wrote nothing, and did not block the rest
    for i, a in enumerate(rows):
        assert len(a["slots"]) == 2
        for b in rows[i + 1 :]:
            overlap_in_time = a["t0"] < b["t1"] and b["t0"] < a["t1"]
            if overlap_in_time:
                assert not set(a["slots"]) & set(b["slots"]), (a, b)
    assert max(sum(1 for b in rows if b["t0"] <= a["t0"] < b["t1"]) for a in rows) <= 2
    # All four GPUs can be taken again: released by the live jobs, reclaimed from the dead one.
    with allocate("gpu", ["0", "1", "2", "3"], 4, tmp_path / "slots", timeout_s=5) as mine:
        assert sorted(mine) == ["0", "1", "2", "3"]
    assert json.loads((tmp_path / "slots" / "gpu.json").read_text()) == {}


def test_allocator_refuses_impossible_requests(tmp_path):
    with pytest.raises(ValueError, match="only 2"):
        with allocate("gpu", ["0", "1"], 4, tmp_path):
            pass
