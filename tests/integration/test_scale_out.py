"""Beyond one process: submitit_local workers, a real MLflow tracking server, the slot allocator."""

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from mlflow.tracking import MlflowClient

from spec_decode.runner.server import free_port, kill_tree
from spec_decode.runner.slots import allocate

from ..conftest import run_py, small

pytestmark = pytest.mark.integration


def structure(uri: str):
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("spec-decode-bench")
    rs = c.search_runs([exp.experiment_id])
    parents = [r for r in rs if r.data.tags.get("spec_decode.role") == "sweep"]
    kids = [r for r in rs if r.data.tags.get("mlflow.parentRunId") == (parents[0].info.run_id if parents else None)]
    return parents, kids


def test_submitit_local_sweep_logs_like_the_basic_launcher(tmp_path, tmp_store):
    run_py(
        [
            "-m",
            "hydra/launcher=local_parallel",
            "hardware.parallel_jobs=2",
            f"hardware.slots_dir={tmp_path / 'slots'}",
            "spec.steps=1,2",
            *small(),
            *tmp_store["overrides"],
            "benchmark.paired=false",  # the baseline job, shared by the two parallel jobs (file lock)
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
        timeout=600,
    )
    parents, kids = structure(tmp_store["uri"])
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(k.data.params["role"] for k in kids) == ["baseline", "spec", "spec"]
    assert all(k.info.status == "FINISHED" for k in kids)
    # every job wrote its own record in its own dir, and its MLflow run is that record's
    out_dirs = {k.data.tags["spec_decode.out_dir"]: k for k in kids}
    assert len(out_dirs) == 3
    for d, k in out_dirs.items():
        rec = json.loads((Path(d) / "results.json").read_text())
        assert rec["record_id"] == k.data.tags["spec_decode.record_id"] and rec["mlflow_run_id"] == k.info.run_id
    assert (tmp_path / "sweep" / ".submitit").is_dir()  # really ran through submitit


def test_sweep_against_a_real_mlflow_server(tmp_path):
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    mlflow_bin = str(Path(sys.executable).parent / "mlflow")
    server = subprocess.Popen(
        [
            mlflow_bin,
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'srv.db'}",
            "--artifacts-destination",
            str(tmp_path / "srv-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        stdout=open(tmp_path / "mlflow.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "mlflow.log").read_text()[-2000:]
            try:
                if requests.get(uri + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        run_py(
            ["-m", "tracking=server", "spec.steps=1,3", *small(), f"hydra.sweep.dir={tmp_path / 'sweep'}"],
            env={"MLFLOW_TRACKING_URI": uri},
        )
        parents, kids = structure(uri)  # through the REST API
        assert len(parents) == 1 and len(kids) == 2  # two spec jobs, each with its paired baseline server
        assert all(k.info.status == "FINISHED" and "throughput_tok_s" in k.data.metrics for k in kids)
        c = MlflowClient(uri)
        assert "results.json" in {a.path for a in c.list_artifacts(kids[0].info.run_id)}
        assert list((tmp_path / "srv-artifacts").rglob("results.json"))  # stored by the server
    finally:
        kill_tree(server.pid)
    assert server.poll() is not None


def _worker(slots_dir, out, hold_s, crash):
    with allocate("gpu", ["0", "1", "2", "3"], 2, Path(slots_dir), timeout_s=60, poll_s=0.02) as mine:
        t0 = time.time()
        if crash:
            os._exit(1)  # dies holding its GPUs
        time.sleep(hold_s)
        with open(out, "a") as f:
            f.write(json.dumps({"slots": mine, "t0": t0, "t1": time.time()}) + "\n")


def test_slot_allocator_never_shares_a_gpu_and_frees_slots_of_dead_jobs(tmp_path):
    out = tmp_path / "log.jsonl"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(tmp_path / "slots", out, 0.3, i == 0)) for i in range(6)]
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
